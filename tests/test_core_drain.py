"""A server's drain in the sans-I/O core (#54, make before break), on a fake clock: the
new connection opens at a jittered moment within the window, takes the link only once
an ACKed heartbeat proved it, and a new connection that fails leaves the live one."""
import pytest

from agent.base import reasons as J
from agent.link.core import LinkState, SendHeartbeat
from agent.link.handover import DropSecond, OpenSecond, ProveSecond, Switch
from tests.test_core import ACK, HB, Server, connect, make

WINDOW = 6.0


def drained(seed=0):
    """An online core told to drain: (core, clock, the moment's delay)."""
    core, clock = make(seed=seed)
    connect(core, clock)
    core.on_ack(1, clock.now + 0.01)
    delay = core.on_drain(WINDOW, clock.now)
    assert delay is not None
    return core, clock, delay


def until_open(core, clock, step=0.01):
    """Polls until the core asks for the second connection, answering heartbeats."""
    heartbeats = []
    for _ in range(int(2 * WINDOW / step)):
        for action in core.poll(clock.now):
            if isinstance(action, OpenSecond):
                return heartbeats
            if isinstance(action, SendHeartbeat):
                heartbeats.append(action.seq)
                core.on_ack(action.seq, clock.now + 0.01)
        clock.advance(step)
    pytest.fail("the core never opened the second connection")


def test_the_new_connection_opens_at_a_jittered_moment_within_the_window_its_proof_included():
    delays = [drained(seed)[2] for seed in range(400)]
    assert min(delays) >= 0 and max(delays) <= WINDOW - ACK
    # spread over the window, not all at once: 400 even draws over 5 s
    per_second = [0] * 5
    for d in delays:
        per_second[min(4, int(d))] += 1
    assert min(per_second) > 400 / 5 / 2, per_second


def test_the_moment_is_kept_and_heartbeats_go_on_the_old_connection_until_it():
    core, clock, delay = drained(seed=3)
    assert core.next_wakeup() <= clock.now + delay
    start = clock.now
    beats = until_open(core, clock)
    assert clock.now - start == pytest.approx(delay, abs=0.02)
    assert len(beats) >= int(delay / HB) - 1   # the old one kept beating
    assert core.state == LinkState.ONLINE


def test_the_switch_comes_only_after_the_new_connections_heartbeat_is_acked():
    core, clock, _ = drained()
    until_open(core, clock)
    before = core.journal.total_connections
    actions = core.on_second_opened(clock.now)
    assert len(actions) == 1 and isinstance(actions[0], ProveSecond)
    seq = actions[0].seq
    assert core.on_second_proven(seq + 1, clock.now) == []   # another ACK proves nothing
    clock.advance(0.02)
    actions = core.on_second_proven(seq, clock.now)
    assert actions == [Switch(seq, clock.now - 0.02)]
    core.on_switched(clock.now, clock.wall(), 25.0, "127.0.0.1:6000", 0.01, None,
                     (actions[0].seq, actions[0].sent_at))
    # the new connection is proven from its first instant: no gap in the proof
    assert core.watchdog.proven_live(clock.now)
    assert core.journal.total_connections == before + 1
    assert core.journal.records[-2].ended_reason == J.DRAINED
    assert core.state == LinkState.ONLINE and core.handover is None
    # heartbeats go on, one interval after the proof, and the link stays up
    seen = Server(core, clock).run(3 * HB)
    assert [a for _, a in seen if isinstance(a, SendHeartbeat)]
    assert core.state == LinkState.ONLINE


def test_a_new_connection_that_fails_keeps_the_old_one_until_the_drain_ends_it():
    core, clock, _ = drained()
    until_open(core, clock)
    assert core.on_second_failed(clock.now, J.CONNECTION_REFUSED) == []
    assert core.state == LinkState.ONLINE and core.handover is None
    Server(core, clock).run(2 * HB)
    assert core.state == LinkState.ONLINE   # the old link carries on
    core.on_closed(clock.now, J.SERVER_DISCONNECT)   # the drain's end: the usual reconnect
    assert core.state == LinkState.WAITING


def test_an_unanswered_proof_drops_the_new_connection_and_keeps_the_old_one():
    core, clock, _ = drained()
    until_open(core, clock)
    core.on_second_opened(clock.now)
    dropped = []
    for _ in range(int(2 * ACK / 0.05)):
        for action in core.poll(clock.now):
            if isinstance(action, DropSecond):
                dropped.append(clock.now)
            if isinstance(action, SendHeartbeat):
                core.on_ack(action.seq, clock.now + 0.01)
        clock.advance(0.05)
    assert len(dropped) == 1
    assert core.state == LinkState.ONLINE and core.handover is None


def test_a_drain_while_offline_or_already_moving_is_ignored_and_the_window_is_clamped():
    core, clock = make()
    assert core.on_drain(5, clock.now) is None   # not online
    connect(core, clock)
    assert core.on_drain(10 ** 9, clock.now) <= 15 * 60
    assert core.on_drain(5, clock.now) is None   # already moving
    core.on_closed(clock.now, J.SERVER_DISCONNECT)
    assert core.handover is None   # a loss ends the move with the link
