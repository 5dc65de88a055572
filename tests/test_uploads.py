"""The upload queue: rules with a fake clock, the real spool files, a fake sender."""
import json
import os
import random
import time

import pytest

from agent.base.clock import FakeClock
from agent.uploads.schedule import AUTH, OK, PERMANENT, SLOW_DOWN, TRANSIENT, UNAVAILABLE, UNREACHABLE, Outcome, UploadScheduler, classify, parse_retry_after
from agent.config.policies import UploadPolicy
from agent.uploads.store import Duplicate, QueueStore
from agent.uploads.worker import UploadWorker
from devtools.harness import TurnRecorder


def test_per_item_backoff_30s_doubling_to_30min():
    s = UploadScheduler(UploadPolicy(jitter=0.0))
    assert [s.retry_delay(n) for n in range(1, 9)] == [30, 60, 120, 240, 480, 960, 1800, 1800]
    s = UploadScheduler(UploadPolicy(jitter=0.2), random.Random(1))
    for n in range(1, 50):
        base = min(1800, 30 * 2 ** (n - 1))
        assert 0.8 * base <= s.retry_delay(n) <= 1.2 * base


@pytest.mark.parametrize("status, header, kind, retry", [
    (200, None, OK, None), (201, None, OK, None), (None, None, UNREACHABLE, None),
    (500, None, TRANSIENT, None), (502, None, UNREACHABLE, None), (504, None, UNREACHABLE, None),
    (408, None, TRANSIENT, None), (409, None, TRANSIENT, None),
    (429, "120", SLOW_DOWN, 120.0), (503, None, SLOW_DOWN, None), (503, "soon", SLOW_DOWN, None),
    (429, "99999999", SLOW_DOWN, 6 * 3600.0),
    # only an item the server calls malformed is given up on
    (413, None, PERMANENT, None), (400, None, PERMANENT, None), (415, None, PERMANENT, None),
    (422, None, PERMANENT, None),
    # credentials and routes are about the agent and the server, not the item
    (401, None, AUTH, None), (403, None, AUTH, None), (404, None, UNAVAILABLE, None),
    (405, None, UNAVAILABLE, None), (501, None, UNAVAILABLE, None),
])
def test_classify(status, header, kind, retry):
    o = classify(status, header)
    assert o.kind == kind and o.retry_after_s == retry


def test_retry_after_parsing_rejects_nonsense():
    assert parse_retry_after("-5") is None and parse_retry_after("nan") is None
    assert parse_retry_after(" 30 ") == 30.0


@pytest.fixture
def store(tmp_path):
    s = QueueStore(str(tmp_path / "queue"), UploadPolicy())
    yield s
    s.close()


def test_a_duplicate_is_a_key_seen_again_never_equal_content(store):
    # two real plays of the same clip are two records
    play = b'{"event": "play_start", "content_id": "c-1"}'
    assert store.enqueue("proof-of-play", play, now=1000.0)
    assert store.enqueue("proof-of-play", play, now=1001.0)
    assert store.enqueue("screenshot", b"frame-1", now=1000.0)
    assert store.enqueue("screenshot", b"frame-1", now=1001.0)
    # a key, given or carried by the record, is what makes a duplicate
    assert store.add("screenshot", b"frame-2", now=1002.0, key="shot-7") == "shot-7"
    with pytest.raises(Duplicate):
        store.add("screenshot", b"other bytes", now=1003.0, key="shot-7")
    keyed = b'{"play_id": "p-42", "content_id": "c-1"}'
    assert store.add("proof-of-play", keyed, now=1004.0) == "p-42"
    assert store.enqueue("proof-of-play", keyed, now=1005.0) is None
    items = {i.id: i for i in store.due(2000.0, 10)}
    store.confirmed([items["shot-7"]], now=2000.0)
    with pytest.raises(Duplicate):   # sent within the dedupe window: still a duplicate
        store.add("screenshot", b"frame-2", now=2100.0, key="shot-7")
    assert store.add("screenshot", b"frame-2", now=2000.0 + 3601, key="shot-7") == "shot-7"
    assert store.dropped["duplicate"] == 3
    assert store.stats()["items"] == 6
    again = QueueStore(store.path, UploadPolicy())   # a restart: the sent shot-7 and the new
    assert again.stats()["items"] == 6
    assert [i.payload for i in again.due(1e9, 10) if i.id == "shot-7"] == [b"frame-2"]
    again.close()


@pytest.mark.parametrize("key", ["", "a b", "x" * 65, "ключ", "a+1", "a/b"])
def test_a_bad_key_is_refused_naming_its_field(store, key):
    with pytest.raises(ValueError, match="--key: must be 1 to 64"):
        store.add("log", b"x", key=key)
    with pytest.raises(ValueError, match="play_id: must be 1 to 64"):
        store.add("proof-of-play", json.dumps({"play_id": key}).encode())
    with pytest.raises(ValueError, match="play_id"):
        store.add("proof-of-play", b'{"play_id": 42}')
    assert store.stats()["items"] == 0


def test_bounds_drop_old_screenshots_before_proof_of_play(tmp_path):
    s = QueueStore(str(tmp_path / "q"), UploadPolicy(max_items=5))
    for i in range(3):
        s.enqueue("proof-of-play", b'{"play": %d}' % i, now=100.0 + i)
    for i in range(2):
        s.enqueue("screenshot", b"shot-%d" % i, now=200.0 + i)
    assert s.enqueue("proof-of-play", b'{"play": 9}', now=300.0)
    kinds = sorted(i.kind for i in s.due(1e9, 100))
    assert kinds == ["proof-of-play"] * 4 + ["screenshot"]
    assert s.dropped == {"evicted:screenshot": 1}
    # a screenshot cannot push out proof-of-play: it is the one dropped, and counted
    s.enqueue("screenshot", b"shot-x", now=301.0)  # evicts the other old screenshot
    assert s.enqueue("screenshot", b"shot-y", now=302.0) is not None
    for i in range(5):
        s.enqueue("proof-of-play", b'{"more": %d}' % i, now=400.0 + i)
    assert all(i.kind == "proof-of-play" for i in s.due(1e9, 100))
    assert s.enqueue("screenshot", b"shot-z", now=500.0) is None
    assert s.dropped["full:screenshot"] == 1
    assert s.stats()["items"] == 5


def test_max_bytes_and_age(tmp_path):
    s = QueueStore(str(tmp_path / "q"), UploadPolicy(max_bytes=100, max_age_days=1),
                   synced=lambda: True)
    assert s.enqueue("log", b"x" * 101, now=0.0) is None and s.dropped["too-large"] == 1
    assert s.enqueue("log", b"a" * 60, now=0.0)
    assert s.enqueue("log", b"b" * 60, now=10.0)     # evicts the first (same kind, oldest)
    assert s.stats()["bytes"] == 60
    assert s.enqueue("log", b"c" * 10, now=10.0 + 86400 + 1)
    assert s.dropped["too-old"] == 1 and s.stats()["items"] == 1


def test_10000_items_come_back_oldest_first_and_a_fresh_process_sees_them_all(store, tmp_path):
    for i in range(10_000):
        store.enqueue("proof-of-play", b'{"n": %d}' % i, now=1000.0 + i)
    assert store.stats()["items"] == 10_000
    first = store.due(1000.0 + 10_000, 200)
    assert len(first) == 200 and first[0].created_at == 1000.0
    assert [i.created_at for i in first] == sorted(i.created_at for i in first)
    again = QueueStore(store.path, UploadPolicy())   # what a restart reads from the files
    assert again.stats()["items"] == 10_000
    assert [i.id for i in again.due(1000.0 + 10_000, 200)] == [i.id for i in first]
    again.close()


def test_a_locked_queue_is_unavailable_and_nothing_is_touched(tmp_path):
    import fcntl
    import agent.uploads.store as store_mod
    path = str(tmp_path / "queue")
    first = QueueStore(path, UploadPolicy())
    assert first.enqueue("proof-of-play", b'{"keep": 1}', now=1.0)
    before = {n: os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)}
    holder = os.open(os.path.join(path, "lock"), os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)   # another process mid-operation, holding the lock
    try:
        with pytest.raises(store_mod.QueueUnavailable, match="locked"):
            QueueStore(path, UploadPolicy(), timeout_s=0.1)
        with pytest.raises(store_mod.QueueUnavailable, match="locked"):
            first.timeout_s = 0.1
            first.enqueue("log", b"while locked", now=2.0)
    finally:
        os.close(holder)
    assert {n: os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)} == before
    again = QueueStore(path, UploadPolicy())
    assert again.stats()["items"] == 1
    first.close()
    again.close()


def _segment(path):
    [seg] = [n for n in os.listdir(path) if n.endswith(".seg")]
    return os.path.join(path, seg)


def test_an_incomplete_item_left_by_a_dead_writer_is_cut_off_and_the_rest_kept(tmp_path, caplog):
    path = str(tmp_path / "queue")
    s = QueueStore(path, UploadPolicy())
    ids = [s.enqueue("log", b"line-%d" % i * 100, now=1.0 + i) for i in range(3)]
    s.close()
    seg = _segment(path)
    whole = os.path.getsize(seg)
    with open(seg, "r+b") as f:   # a fourth enqueue that died half-way through its write
        f.seek(0, 2)
        f.write(open(seg, "rb").read(200)[:150])
    again = QueueStore(path, UploadPolicy())
    assert [i.id for i in again.due(1e9, 10)] == ids
    assert os.path.getsize(seg) == whole and "cut off an incomplete item" in caplog.text
    assert again.enqueue("log", b"after", now=9.0)
    assert len(again.due(1e9, 10)) == 4
    again.close()
    os.truncate(seg, os.path.getsize(seg) - 100)   # died in the padding of a whole item
    third = QueueStore(path, UploadPolicy())
    assert len(third.due(1e9, 10)) == 4 and third.enqueue("log", b"and on", now=10.0)
    assert len(third.due(1e9, 10)) == 5
    third.close()


def test_a_damaged_item_is_skipped_or_dead_lettered_never_silently_lost(tmp_path, caplog):
    path = str(tmp_path / "queue")
    s = QueueStore(path, UploadPolicy())
    ids = [s.enqueue("screenshot", bytes([65 + i]) * 500, now=1.0 + i) for i in range(4)]
    s.close()
    from agent.uploads.segments import HEADER_BYTES2 as HEADER_BYTES, PAGE
    record = PAGE  # each item starts on a page of its own
    with open(_segment(path), "r+b") as f:
        f.seek(record + 2)            # the second item's header: bit rot
        f.write(b"\xff\xff")
        f.seek(2 * record + HEADER_BYTES + 7)   # the third item's payload
        f.write(b"\x00")
    again = QueueStore(path, UploadPolicy())
    assert "skipped" in caplog.text and again.dropped["damaged"] == 1
    sent = [i.id for i in again.due(1e9, 10)]
    assert sent == [ids[0], ids[3]]
    [dead] = again.dead_letters()
    assert dead["id"] == ids[2] and "checksum" in dead["reason"]
    again.close()


def test_an_enqueue_syncs_once_and_settling_an_item_never_waits_for_the_card(store, monkeypatch):
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd) or real(fd))
    monkeypatch.setattr(os, "fsync", lambda fd: syncs.append(fd) or real(fd))
    store.enqueue("log", b"first", now=1.0)   # a new segment: its directory entry too
    syncs.clear()
    for i in range(10):
        store.enqueue("log", b"line %d" % i, now=2.0)
    assert len(syncs) == 10
    syncs.clear()
    items = store.due(10.0, 100)
    store.failed(items[0], 100.0)
    store.confirmed(items[1:], now=10.0)
    assert syncs == [], "a confirm or a failure was synced to the SD card"
    assert store.stats()["items"] == 1


def test_segments_rotate_and_settled_ones_are_deleted_after_the_dedupe_window(tmp_path, monkeypatch):
    import agent.uploads.spool as spool_mod
    from agent.uploads.segments import PAGE
    monkeypatch.setattr(spool_mod, "SEGMENT_BYTES", 3 * PAGE)
    path = str(tmp_path / "queue")
    s = QueueStore(path, UploadPolicy(dedupe_window_s=100.0))
    reader = QueueStore(path, UploadPolicy(dedupe_window_s=100.0))  # another process
    for i in range(20):   # keyed: a restarted agent must still know which keys it sent
        s.enqueue("log", os.urandom(1000), now=1.0, key=f"log-{i}")
    segs = lambda: sorted(n for n in os.listdir(path) if n.endswith(".seg"))
    assert len(segs()) == 7
    items = reader.due(1.0, 100)
    assert len(items) == 20, "what one process queued, the other sends"
    reader.confirmed(items, now=2.0)
    assert len(segs()) == 7, "deleted inside the dedupe window"
    assert s.stats()["items"] == 0
    reader.confirmed([], now=200.0)
    assert segs() == ["00000007.seg"], "only the newest segment stays"
    assert sorted(os.listdir(path)) == ["00000007.ack", "00000007.seg", "lock"]
    assert s.enqueue("log", b"next", now=201.0) and reader.stats()["items"] == 1
    s.close()
    reader.close()


def test_an_upgrade_moves_the_sqlite_queue_of_earlier_versions_into_the_spool(tmp_path):
    from devtools.bench.sqlite_queue import QueueStore as SqliteQueue
    old = SqliteQueue(str(tmp_path / "queue.db"), UploadPolicy())
    a = old.enqueue("screenshot", b"shot", now=10.0)
    b = old.enqueue("proof-of-play", b'{"play": 1}', now=11.0)
    c = old.enqueue("log", b"refused", now=12.0)
    [item_b] = [i for i in old.due(20.0, 10) if i.id == b]
    old.failed(item_b, 500.0, "HTTP 500")
    [item_c] = [i for i in old.due(20.0, 10) if i.id == c]
    old.dead(item_c, "HTTP 413", now=20.0)
    old.close()
    s = QueueStore(str(tmp_path / "queue"), UploadPolicy())
    assert not [n for n in os.listdir(tmp_path) if n.startswith("queue.db")]
    items = {i.id: i for i in s.due(1e3, 10)}
    assert set(items) == {a, b}, "the same ids: the server's Idempotency-Key still matches"
    assert items[b].attempts == 1 and items[b].next_attempt_at == 500.0
    assert items[a].payload == b"shot" and items[a].created_at == 10.0
    assert [d["reason"] for d in s.dead_letters()] == ["HTTP 413"]
    s.close()


def test_a_store_with_no_earlier_versions_queue_loads_no_sqlite_reader(tmp_path):
    """Every start after the upgrade: the old queue's reader (its records, sqlite) is not
    loaded before the link (#51: the start's imports); with one, test above."""
    import subprocess
    import sys
    script = ("import sys; from agent.uploads.store import QueueStore\n"
              "from agent.config.policies import UploadPolicy\n"
              "QueueStore(sys.argv[1], UploadPolicy()).close()\n"
              "print([m for m in sys.modules if m.endswith('migrate_sqlite') or m == 'sqlite3'])")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "queue")],
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


class FakeSender:
    def __init__(self, answers=None):
        self.calls = []
        self.answers = answers or {}

    def _answer(self, item):
        for marker, outcome in self.answers.items():
            if marker in item.payload:
                return outcome
        return Outcome(OK)

    def send_one(self, item):
        self.calls.append(item.payload)
        return self._answer(item)

    def send_batch(self, items):
        self.calls.append([i.payload for i in items])
        return {i.id: self._answer(i) for i in items}


def make_worker(store, sender, clock):
    return UploadWorker(store, sender, UploadPolicy(jitter=0.0), clock=clock,
                        rng=random.Random(0))


def test_a_failing_item_never_delays_the_others(store):
    clock = FakeClock(wall_offset=0.0)
    for i in range(5):
        store.enqueue("screenshot", b"shot-%d" % i, now=clock.wall())
    store.enqueue("screenshot", b"shot-FAIL", now=clock.wall())
    sender = FakeSender({b"FAIL": Outcome(TRANSIENT, "HTTP 500")})
    worker = make_worker(store, sender, clock)
    worker._work_once()
    assert worker.sent == 5 and store.stats()["items"] == 1
    assert worker._work_once() == pytest.approx(30.0, abs=0.01)  # next: the failed one, in 30 s
    clock.advance(29.9)
    worker._work_once()
    assert len(sender.calls) == 6
    clock.advance(0.2)
    worker._work_once()
    assert len(sender.calls) == 7  # second try after 30 s; the third would wait 60 s


def test_429_retry_after_holds_the_whole_queue(store):
    clock = FakeClock(wall_offset=0.0)
    store.enqueue("log", b"a", now=clock.wall())
    store.enqueue("log", b"b", now=clock.wall())
    sender = FakeSender({b"a": Outcome(SLOW_DOWN, "HTTP 429", 120.0),
                         b"b": Outcome(SLOW_DOWN, "HTTP 429", 120.0)})
    worker = make_worker(store, sender, clock)
    worker._work_once()
    assert len(sender.calls) == 1, "the queue stops at the first 429"
    sender.answers = {}
    while clock.now < 1000.0 + 119.9:
        worker._work_once()
        clock.advance(0.5)
    assert len(sender.calls) == 1, "no request before 120 s"
    clock.advance(0.5)
    worker._work_once()
    assert len(sender.calls) == 3 and store.stats()["items"] == 0


def test_an_outage_holds_the_queue_writes_nothing_and_ends_when_the_link_is_back(store, tmp_path):
    clock = FakeClock(wall_offset=0.0)
    for i in range(50):
        store.enqueue("screenshot", b"shot-%d" % i, now=clock.wall())
    sender = FakeSender({b"shot": Outcome(UNREACHABLE, "ConnectionError")})
    worker = make_worker(store, sender, clock)
    on_disk = lambda: {n: os.stat(os.path.join(store.path, n)).st_size for n in os.listdir(store.path)}
    written = on_disk()
    for _ in range(200):  # an hour of the network being gone
        worker._work_once()
        clock.advance(18.0)
    assert len(sender.calls) <= 10, f"{len(sender.calls)} attempts: the queue did not hold"
    assert on_disk() == written, "an outage wrote to the SD card"
    assert {i.attempts for i in store.due(clock.wall(), 100)} == {0}
    sender.answers = {}
    worker.link_up()
    worker._work_once()
    assert store.stats()["items"] == 0, "the link came back and the queue did not go"


def test_refused_credentials_hold_the_queue_and_lose_nothing(store):
    clock = FakeClock(wall_offset=0.0)
    queued_at = clock.wall()
    for kind in ("screenshot", "log", "proof-of-play"):
        store.enqueue(kind, b'{"%s": 1}' % kind.encode(), now=clock.wall())
        clock.advance(1.0)
    sender = FakeSender({b"": Outcome(AUTH, "HTTP 401")})
    worker = make_worker(store, sender, clock)
    for _ in range(20):
        worker._work_once()
        clock.advance(60.0)
    assert store.stats() == {"items": 3, "bytes": store.stats()["bytes"], "dead_letter": 0,
                             "dropped": {}, "oldest_at": queued_at}
    sender.answers = {}
    worker.link_up()  # what pairing anew does
    worker._work_once()
    worker._work_once()
    assert store.stats()["items"] == 0 and store.stats()["dead_letter"] == 0


def test_a_round_holds_a_byte_budget_of_payloads_whatever_the_backlog(tmp_path):
    s = QueueStore(str(tmp_path / "q"), UploadPolicy(max_bytes=1 << 30))
    for i in range(40):
        s.enqueue("screenshot", os.urandom(1 << 20), now=1.0 + i)  # 40 MiB queued
    items = s.due(100.0, 200, 8 << 20)
    assert len(items) == 8 and sum(len(i.payload) for i in items) <= 8 << 20
    assert len(s.due(100.0, 200, 100)) == 1, "one item always goes, even over the budget"
    assert s.enqueue("screenshot", b"x" * ((16 << 20) + 1), now=200.0) is None
    assert s.dropped["too-large"] == 1
    s.close()


def test_an_unexpected_exception_restarts_the_loop_and_one_that_keeps_dying_stops(caplog):
    from agent.runtime import supervise as sv
    calls, pauses = [], []

    def loop():
        calls.append(1)
        if len(calls) < 3:
            raise KeyError("surprise")  # what a library may raise that nobody documented

    sv.supervise("test", loop, lambda: False, lambda s: pauses.append(s) and False)
    assert len(calls) == 3 and pauses == [1.0, 2.0]
    assert caplog.text.count("Traceback") == 1, "the traceback once per kind, not per death"
    calls.clear()
    sv.supervise("doomed", lambda: calls.append(1) or 1 / 0, lambda: False, lambda s: False)
    assert len(calls) == sv.MAX_DEATHS and "leaving it stopped" in caplog.text


def test_permanent_refusal_goes_to_dead_letter_not_retried(store):
    clock = FakeClock(wall_offset=0.0)
    store.enqueue("screenshot", b"too-big", now=clock.wall())
    worker = make_worker(store, FakeSender({b"too-big": Outcome(PERMANENT, "HTTP 413")}), clock)
    worker._work_once()
    assert store.stats()["dead_letter"] == 1 and store.stats()["items"] == 0
    [record] = store.dead_letters()
    assert record["reason"] == "HTTP 413" and record["kind"] == "screenshot"


def test_proof_of_play_goes_in_batches_of_200(store):
    clock = FakeClock(wall_offset=0.0)
    for i in range(450):
        store.enqueue("proof-of-play", b'{"n": %d}' % i, now=clock.wall())
    sender = FakeSender()
    worker = make_worker(store, sender, clock)
    for _ in range(3):
        worker._work_once()
    assert [len(c) for c in sender.calls] == [200, 200, 50]
    assert store.stats()["items"] == 0


def test_a_clock_jump_cannot_strand_an_item(store):
    store.enqueue("log", b"x", now=1e9)   # queued when the clock said 2001...
    [item] = store.due(1e9, 1)
    store.failed(item, 1e9 + 60)
    # ...and now it says 1970: due time is beyond the cap, so it is due now
    assert [i.id for i in store.due(100.0, 10)] == [item.id]


def test_a_filling_disk_stops_screenshots_first_and_recovers(store, caplog):
    caplog.set_level("INFO", logger="edge_agent")
    free = {"bytes": 1 << 30}
    store.free_bytes = lambda: free["bytes"]
    assert store.enqueue("screenshot", b"s1", now=1.0)
    free["bytes"] = 32 << 20          # 32 MiB: below the screenshot floor
    assert store.enqueue("screenshot", b"s2", now=2.0) is None
    assert store.enqueue("screenshot", b"s3", now=3.0) is None
    assert store.enqueue("log", b"l1", now=3.0)
    free["bytes"] = 8 << 20           # 8 MiB: logs stop too, proof-of-play goes on
    assert store.enqueue("log", b"l2", now=4.0) is None
    assert store.enqueue("proof-of-play", b"{}", now=4.0)
    assert caplog.text.count("not queueing screenshots") == 1   # logged once
    free["bytes"] = 1 << 30
    assert store.enqueue("screenshot", b"s4", now=5.0)
    assert "queueing screenshots again" in caplog.text
    assert store.dropped["disk-low:screenshot"] == 2 and store.dropped["disk-low:log"] == 1


def test_worker_survives_a_failing_card(store, monkeypatch):
    clock = FakeClock(wall_offset=0.0)
    worker = make_worker(store, FakeSender(), clock)
    import errno

    def failing(*_a, **_k):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(store, "due", failing)
    monkeypatch.setattr(store, "earliest_due", failing)
    worker._stopping = False
    import threading
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    worker.stop()
    t.join(2)
    assert not t.is_alive()


def test_an_empty_queue_sleeps_until_woken_and_leaves_the_watchdog_gate(store):
    import threading
    idle, rounds = threading.Event(), []
    sender = FakeSender()
    worker = UploadWorker(store, sender, UploadPolicy(),
                          gate=TurnRecorder(on_turn=lambda: rounds.append(1), on_idle=idle.set))
    worker.start()
    try:
        assert idle.wait(2), "an empty queue did not go idle"
        time.sleep(0.5)
        assert len(rounds) == 1, "an idle worker woke up on its own"
        idle.clear()
        store.enqueue("log", b"wake up", now=time.time())
        worker.wake()
        assert idle.wait(2) and sender.calls == [b"wake up"]
        assert len(rounds) == 3   # the round that sent it, and the one that found nothing
    finally:
        worker.stop()
        worker.join(2)


def test_the_dead_letter_count_follows_the_file_whoever_wrote_it(tmp_path):
    path = str(tmp_path / "queue")
    writer, reader = QueueStore(path, UploadPolicy()), QueueStore(path, UploadPolicy())
    for n in range(3):
        writer.enqueue("log", b"refused %d" % n, now=1.0)
    assert reader.stats()["dead_letter"] == 0
    items = writer.due(2.0, 10)
    writer.dead(items[0], "HTTP 413", now=2.0)
    assert reader.stats()["dead_letter"] == 1
    writer.dead(items[1], "HTTP 422", now=3.0)
    assert reader.stats()["dead_letter"] == 2 == len(reader.dead_letters())
    writer.close()
    reader.close()


def test_status_counts_what_another_process_queued_during_a_503_hold(store):
    """The worker's status refresh must tell what is on disk, whoever appended it: an
    `edge-agent enqueue` (another process) during a hold wakes the worker, which sends
    nothing, but the count it publishes must include the new items."""
    import subprocess
    import sys
    clock = FakeClock(wall_offset=0.0)
    store.enqueue("log", b"first", now=clock.wall())
    published = []
    worker = UploadWorker(store, FakeSender({b"": Outcome(SLOW_DOWN, "HTTP 503", 300.0)}),
                          UploadPolicy(jitter=0.0), clock=clock, rng=random.Random(0),
                          on_change=lambda: published.append(store.stats()["items"]))
    worker._work_once()
    assert worker.scheduler.hold_reason == SLOW_DOWN and published[-1] == 1
    code = ("import sys; from agent.uploads.store import QueueStore; "
            "from agent.config.policies import UploadPolicy; "
            "s = QueueStore(sys.argv[1], UploadPolicy()); "
            "[s.add('log', b'from another process %d' % i) for i in range(2)]")
    subprocess.run([sys.executable, "-c", code, store.path], check=True, timeout=30,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    clock.advance(1.0)
    worker.wake()                 # what SIGUSR1 from `edge-agent enqueue` does
    worker._work_once()           # still held: nothing is sent...
    assert worker.scheduler.hold_reason == SLOW_DOWN
    assert published[-1] == 3, f"status says {published[-1]} queued while 3 are on disk"


def test_a_damaged_length_is_seen_and_the_items_after_it_are_kept_and_counted(tmp_path, caplog):
    """The header checksum covers the length: a corrupted one no longer sends the reader
    past the items that follow it, and what is skipped is counted and logged."""
    import struct
    path = str(tmp_path / "queue")
    s = QueueStore(path, UploadPolicy())
    ids = [s.enqueue("log", b"line %d " % i * 50, now=1.0 + i) for i in range(4)]
    s.close()
    with open(_segment(path), "r+b") as f:   # the first record's length: bit rot
        f.seek(4)
        [length] = struct.unpack("<I", f.read(4))
        f.seek(4)
        f.write(struct.pack("<I", length + 2 * 4096))
    again = QueueStore(path, UploadPolicy())
    assert [i.id for i in again.due(1e9, 10)] == ids[1:]
    assert again.dropped == {"damaged": 1} and "skipped 4096 damaged bytes" in caplog.text
    again.close()


def test_an_eaq1_length_that_points_nowhere_is_skipped_and_counted(tmp_path, caplog):
    """EAQ1 (released) checksums cover the metadata only: a record must end where the
    next one starts, or it is damaged."""
    import hashlib
    import struct
    import uuid
    import zlib
    path = tmp_path / "queue"
    path.mkdir()
    head, meta_s = struct.Struct("<4sIII"), struct.Struct("<Bd16s32s")
    ids, blob = [], b""
    for n in range(4):
        payload, raw_id = b"old log %d" % n, uuid.uuid4().bytes
        meta = meta_s.pack(2, 1000.0 + n, raw_id, hashlib.sha256(b"log\0" + payload).digest())
        length = len(payload) + (6000 if n == 0 else 0)   # the first length: bit rot
        record = head.pack(b"EAQ1", length, zlib.crc32(payload), zlib.crc32(meta)) + meta + payload
        blob += record + bytes(-len(record) % 4096)
        ids.append(raw_id.hex())
    (path / "00000001.seg").write_bytes(blob)
    s = QueueStore(str(path), UploadPolicy())
    assert [i.id for i in s.due(2000.0, 10)] == ids[1:]
    assert s.dropped == {"damaged": 1} and "skipped 4096 damaged bytes" in caplog.text
    s.close()


def test_a_whole_last_item_that_went_bad_is_dead_lettered_not_cut_off(tmp_path, caplog):
    """Only an append that never returned is cut off; a last item that was written
    whole (and synced) and rotted since goes to the dead-letter file with the reason."""
    from agent.uploads.segments import HEADER_BYTES2, PAGE
    path = str(tmp_path / "queue")
    s = QueueStore(path, UploadPolicy())
    ids = [s.enqueue("log", b"line %d " % i * 50, now=1.0 + i) for i in range(2)]
    s.close()
    seg = _segment(path)
    whole = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        f.seek(PAGE + HEADER_BYTES2 + 3)
        f.write(b"\x00")
    again = QueueStore(path, UploadPolicy())
    assert os.path.getsize(seg) == whole and "cut off" not in caplog.text
    assert [i.id for i in again.due(1e9, 10)] == ids[:1]
    [dead] = again.dead_letters()
    assert dead["id"] == ids[1] and "checksum" in dead["reason"]
    again.close()


def test_names_in_the_spool_that_are_not_the_queues_are_ignored_and_logged_once(tmp_path, caplog):
    """int() reads "²³", " 7" and "٣": such a name must not stop the agent's start."""
    path = tmp_path / "queue"
    s = QueueStore(str(path), UploadPolicy())
    [item_id] = [s.enqueue("log", b"kept", now=1.0)]
    s.close()
    odd = ["²³.seg", " 7.seg", "٣.ack", "12.seg", "00000001.seg~"]
    for name in odd:
        (path / name).write_bytes(b"not a segment")
    again = QueueStore(str(path), UploadPolicy())
    assert [i.id for i in again.due(1e9, 10)] == [item_id]
    assert again.enqueue("log", b"and on", now=2.0) and again.stats()["items"] == 2
    again.close()
    for name in odd[:4]:
        assert caplog.text.count(repr(name)) == 1, (name, caplog.text)
    assert all((path / name).read_bytes() == b"not a segment" for name in odd)
