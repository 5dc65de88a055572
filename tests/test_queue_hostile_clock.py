"""A Pi has no RTC: it boots with a stale wall clock that jumps when NTP syncs. A jump
must never empty the upload queue: nothing is old by a clock that is not synchronised,
and an item stamped by one is aged from when the clock was first seen synchronised."""
import json
import os

import pytest

from agent.base.clock import FakeClock
from agent.uploads.schedule import expired
from agent.config.policies import UploadPolicy
from agent.uploads.store import QueueStore

DAY = 86400.0
MAX_AGE = 14 * DAY


def test_the_expiry_rule_with_a_fake_clock():
    clock = FakeClock(start=0.0, wall_offset=1_500_000_000.0)   # boot: 2017, stale
    stale = clock.wall()
    # unsynchronised now: nothing is old, whatever its stamp says
    assert not expired(stale - 100 * DAY, True, clock.wall(), False, None, MAX_AGE)
    clock.advance(3600.0)
    jumped = clock.wall() + 9 * 365 * DAY          # NTP syncs: the clock jumps 9 years
    # a stamp taken unsynchronised is not aged from itself...
    assert not expired(stale, False, jumped, True, jumped, MAX_AGE)
    # ...but from when the clock was first seen synchronised
    assert not expired(stale, False, jumped + 13 * DAY, True, jumped, MAX_AGE)
    assert expired(stale, False, jumped + 15 * DAY, True, jumped, MAX_AGE)
    # never seen synchronised by this process: it cannot age (bounded by count and bytes)
    assert not expired(stale, False, jumped + 100 * DAY, True, None, MAX_AGE)
    # a synchronised stamp ages as it always did
    assert not expired(jumped, True, jumped + 13 * DAY, True, jumped, MAX_AGE)
    assert expired(jumped, True, jumped + 15 * DAY, True, jumped, MAX_AGE)


@pytest.mark.parametrize("process", ["same", "restarted"])
def test_fifty_plays_queued_at_a_stale_boot_time_survive_the_ntp_jump(tmp_path, process):
    path = str(tmp_path / "queue")
    boot = 1_577_836_800.0                         # 2020-01-01: the image's last clock
    synced = [False]
    s = QueueStore(path, UploadPolicy())
    s.synced = lambda: synced[0]
    for i in range(50):
        assert s.enqueue("proof-of-play", b'{"play": %d}' % i, now=boot + i * 60)
    synced[0] = True                               # timesyncd: the real time, years later
    real = 1_796_000_000.0
    if process == "restarted":                     # the agent restarted after the sync
        s.close()
        s = QueueStore(path, UploadPolicy())
        s.synced = lambda: synced[0]
    assert s.enqueue("proof-of-play", b'{"play": "after the jump"}', now=real)
    assert s.stats()["items"] == 51, f"the jump dropped {s.dropped}"
    assert "too-old" not in s.dropped
    # aged from the sync: 15 days on, the stale-stamped ones are as old as they are
    assert s.enqueue("log", b"two weeks later", now=real + 15 * DAY)
    assert s.stats()["items"] == 1 and s.dropped["too-old"] == 51
    s.close()


def _store(path, synced):
    s = QueueStore(path, UploadPolicy())
    s.synced = lambda: synced[0]
    return s


def test_the_first_synchronised_time_outlives_the_process_that_saw_it(tmp_path, monkeypatch):
    """Each `edge-agent enqueue` is a process of its own: the first synchronised time
    is on the card (an outcome record, not synced), so a later process ages stale
    stamps from it, not from its own "now"."""
    path = str(tmp_path / "queue")
    clock = FakeClock(start=0.0, wall_offset=1_577_836_800.0)   # the image's last clock
    synced = [False]
    s = _store(path, synced)
    for i in range(5):
        assert s.enqueue("proof-of-play", b'{"play": %d}' % i, now=clock.wall())
        clock.advance(60.0)
    s.close()
    synced[0] = True
    clock.advance(9 * 365 * DAY)                   # timesyncd: the real time
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd) or real(fd))
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd) or real(fd))
    first = _store(path, synced)                   # one enqueue process
    assert first.enqueue("log", b"after the jump", now=clock.wall())
    first.close()
    assert len(syncs) == 1, "the first synchronised time cost a sync"
    clock.advance(15 * DAY)
    later = _store(path, synced)                   # another, two weeks on
    assert later.enqueue("log", b"two weeks later", now=clock.wall())
    assert later.dropped == {"too-old": 6} and later.stats()["items"] == 1
    later.close()


def test_a_stale_stamp_after_a_reboot_is_aged_from_the_next_sync_not_the_first(tmp_path):
    """A second boot without an RTC stamps stale times again: those items age from the
    sync after them, not from the one of the boot before."""
    path = str(tmp_path / "queue")
    clock = FakeClock(start=0.0, wall_offset=1_577_836_800.0)
    synced = [False]
    s = _store(path, synced)
    assert s.enqueue("proof-of-play", b'{"boot": 1}', now=clock.wall())
    synced[0] = True
    clock.advance(100 * DAY)
    s.due(clock.wall(), 10)                        # the worker sees the clock synchronised
    s.close()
    synced[0] = False                              # reboot: the stale clock again
    s = _store(path, synced)
    assert s.enqueue("proof-of-play", b'{"boot": 2}', now=1_577_836_800.0 + 60)
    s.close()
    synced[0] = True
    clock.advance(20 * DAY)
    s = _store(path, synced)
    assert s.enqueue("log", b"synced again", now=clock.wall())
    assert s.dropped == {"too-old": 1}
    assert [json.loads(i.payload) for i in s.due(clock.wall(), 10)
            if i.kind == "proof-of-play"] == [{"boot": 2}]
    clock.advance(15 * DAY)
    assert s.enqueue("log", b"two weeks on", now=clock.wall())
    assert s.dropped == {"too-old": 3}
    s.close()
