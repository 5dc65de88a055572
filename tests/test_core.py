"""LinkCore timing rules, driven by a fake clock: no sleeping, no sockets."""
import random

import pytest

from agent.base.clock import FakeClock
from agent.base import reasons as J
from agent.base.backoff import BackoffPolicy
from agent.link.core import Abort, Connect, LinkCore, LinkPolicy, LinkState, SendHeartbeat, SendReport
from agent.config.policies import LivenessPolicy

HB, ACK = 2.0, 1.0


def make(jitter="none", base=1.0, cap=60.0, stable=60.0, wake=5.0, seed=0):
    policy = LinkPolicy(liveness=LivenessPolicy(heartbeat_interval_s=HB, ack_timeout_s=ACK),
                        backoff=BackoffPolicy(base_s=base, cap_s=cap, jitter=jitter),
                        stable_after_s=stable, wake_min_interval_s=wake)
    clock = FakeClock()
    core = LinkCore(policy, random.Random(seed))
    core.start(clock.now)
    return core, clock


def connect(core, clock, ping=25.0):
    actions = core.poll(clock.now)
    assert actions == [Connect(attempt=core.backoff.attempts)]
    core.on_connected(clock.now, clock.wall(), ping, "127.0.0.1:5555")
    return core.poll(clock.now)


class Server:
    """ACKs every heartbeat the core asks to send, after ``rtt``."""

    def __init__(self, core, clock, rtt=0.01):
        self.core, self.clock, self.rtt, self.acking = core, clock, rtt, True

    def run(self, seconds, step=0.05):
        actions_seen = []
        end = self.clock.now + seconds
        while self.clock.now < end:
            for a in self.core.poll(self.clock.now):
                actions_seen.append((self.clock.now, a))
                if isinstance(a, SendHeartbeat) and self.acking:
                    self.core.on_ack(a.seq, self.clock.now + self.rtt)
                if isinstance(a, Connect):
                    self.core.on_connected(self.clock.now, self.clock.wall(), 25.0)
            self.clock.advance(step)
        return actions_seen


def test_first_attempt_is_immediate_and_heartbeat_follows_connect():
    core, clock = make()
    actions = connect(core, clock)
    assert actions == [SendHeartbeat(1)]
    assert core.state == LinkState.ONLINE


def test_heartbeats_every_interval_without_bursts_after_a_stall():
    core, clock = make()
    connect(core, clock)
    core.on_ack(1, clock.now)
    clock.advance(HB)
    assert core.poll(clock.now) == [SendHeartbeat(2)]
    core.on_ack(2, clock.now)
    clock.advance(HB * 0.5)
    assert core.poll(clock.now) == []
    clock.advance(HB * 0.5)
    assert core.poll(clock.now) == [SendHeartbeat(3)]


def test_silent_drop_is_detected_within_interval_plus_ack_timeout():
    """Wherever in the heartbeat cycle the drop falls, detection <= HB + ACK."""
    for phase in [i * 0.1 for i in range(int(HB * 10))]:
        core, clock = make()
        srv = Server(core, clock)
        srv.run(10 + phase)
        assert core.state == LinkState.ONLINE
        drop_at = clock.now
        srv.acking = False
        seen = srv.run(HB + ACK + 0.2, step=0.01)
        aborts = [(t, a) for t, a in seen if isinstance(a, Abort)]
        assert aborts, f"not detected at phase {phase}"
        t, a = aborts[0]
        assert a.reason == J.ACK_TIMEOUT
        assert t - drop_at <= HB + ACK + 0.011


def test_backoff_grows_across_failed_attempts_and_never_stops():
    core, clock = make(jitter="none", base=1, cap=8)
    delays = []
    for _ in range(8):
        assert core.poll(clock.now) == [Connect(attempt=core.backoff.attempts)]
        core.on_connect_failed(clock.now, J.CONNECT_FAILED)
        delays.append(core.attempt_at() - clock.now)
        assert core.poll(clock.now) == []  # not before the delay
        clock.advance(delays[-1])
    assert delays == [1, 2, 4, 8, 8, 8, 8, 8]


def test_a_connection_that_dies_at_once_does_not_reset_backoff():
    core, clock = make(jitter="none", base=1, cap=60, stable=60)
    for expected in [1, 2, 4, 8]:
        connect(core, clock)
        core.on_ack(core.seq, clock.now)
        clock.advance(3)
        core.on_closed(clock.now, J.TRANSPORT_ERROR)
        assert core.attempt_at() - clock.now == expected
        clock.advance(expected)


def test_backoff_resets_only_after_a_stable_link():
    core, clock = make(jitter="none", base=1, cap=60, stable=60)
    core.backoff.attempts = 5
    srv = Server(core, clock)
    srv.poll_connect = connect(core, clock)
    srv.run(59.0)
    assert core.backoff.attempts == 5 and not core.stable
    srv.run(1.5)
    assert core.stable and core.backoff.attempts == 0
    core.on_closed(clock.now, J.SERVER_DISCONNECT)
    assert core.attempt_at() - clock.now == 1


def test_throttle_holds_off_the_next_connect_and_is_clamped():
    core, clock = make(jitter="none")
    connect(core, clock)
    assert core.on_throttle(120, clock.now) == 120
    core.on_closed(clock.now, J.SERVER_DISCONNECT)
    clock.advance(119.9)
    assert core.poll(clock.now) == []
    clock.advance(0.1)
    assert core.poll(clock.now) == [Connect(attempt=1)]
    assert core.on_throttle(0, clock.now) == 1.0
    assert core.on_throttle(10 ** 9, clock.now) == 900.0


def first_retries(window, reason, n=2000):
    """Where n devices, on one server that set ``window``, put their first retry after
    losing the link for ``reason``."""
    delays = []
    for seed in range(n):
        core, clock = make(jitter="full", base=1.0, cap=60.0, seed=seed)
        connect(core, clock)
        core.on_reconnect_window(window)
        core.on_closed(clock.now, reason)
        delays.append(core.attempt_at() - clock.now)
    return delays


def test_a_server_loss_spreads_first_reconnects_over_the_servers_window():
    without = first_retries(0, J.SERVER_DISCONNECT)
    assert max(without) <= 1.0   # today: the whole node within a second
    spread = first_retries(60, J.SERVER_DISCONNECT)
    assert max(spread) <= 60 and min(spread) >= 0
    per_second = [0] * 60
    for d in spread:
        per_second[int(d)] += 1
    # 2000 devices over 60 s: about 33 a second, never a lock-step second
    assert max(per_second) < 2000 / 60 * 2
    assert sum(1 for d in spread if d < 30) == pytest.approx(1000, rel=0.1)


def test_a_silent_drop_on_the_site_still_heals_at_once_whatever_the_window():
    assert max(first_retries(60, J.ACK_TIMEOUT, n=200)) <= 1.0


def test_the_window_covers_the_retries_until_a_connection_then_the_schedule_is_its_own():
    core, clock = make(jitter="full", base=1.0, cap=60.0)
    connect(core, clock)
    assert core.on_reconnect_window(10 ** 9) == 900.0   # clamped like a throttle
    assert core.on_reconnect_window(-5) == 0.0
    core.on_reconnect_window(100)
    core.on_closed(clock.now, J.TRANSPORT_ERROR)
    delays = []
    for _ in range(3):   # the node is still down: each retry is spread again
        clock.advance(core.attempt_at() - clock.now)
        assert core.poll(clock.now) == [Connect(attempt=core.backoff.attempts)]
        core.on_connect_failed(clock.now, J.CONNECTION_REFUSED)
        delays.append(core.attempt_at() - clock.now)
    assert max(delays) > 8   # ceilings 2, 4, 8 without the window
    clock.advance(core.attempt_at() - clock.now)
    core.poll(clock.now)
    core.on_connected(clock.now, clock.wall(), 25.0)
    core.on_connect_failed(clock.now, J.CONNECT_FAILED)   # ignored: online
    core.poll(clock.now)
    core.on_closed(clock.now, J.SILENCE)
    assert core.attempt_at() - clock.now <= 16   # its own schedule again
    assert core.snapshot(clock.now)["reconnect_window_s"] == 100


def test_network_up_jumps_the_queue_but_is_rate_limited_and_respects_throttle():
    core, clock = make(jitter="none", base=30, cap=60, wake=5)
    core.poll(clock.now)
    core.on_connect_failed(clock.now, J.CONNECT_FAILED)
    assert core.attempt_at() - clock.now == 30
    clock.advance(1)
    assert core.on_network_up(clock.now)
    assert core.poll(clock.now) == [Connect(attempt=1)]
    core.on_connect_failed(clock.now, J.CONNECT_FAILED)
    clock.advance(1)
    assert not core.on_network_up(clock.now)  # a flapping cable is not a connect storm
    clock.advance(5)
    core.on_throttle(300, clock.now)
    assert core.on_network_up(clock.now)
    assert core.poll(clock.now) == []  # the server's hold still stands


def test_only_one_connection_at_a_time():
    core, clock = make()
    connect(core, clock)
    for _ in range(100):
        clock.advance(0.5)
        assert not any(isinstance(a, Connect) for a in core.poll(clock.now) if core.state == LinkState.ONLINE)
    # while connecting, nothing else is asked for
    core2, clock2 = make()
    assert core2.poll(clock2.now) == [Connect(attempt=0)]
    for _ in range(10):
        clock2.advance(100)
        assert core2.poll(clock2.now) == []


def test_stale_events_after_loss_are_ignored():
    core, clock = make(jitter="none")
    connect(core, clock)
    core.on_closed(clock.now, J.TRANSPORT_ERROR)
    next_at = core.attempt_at()
    core.on_closed(clock.now, J.SERVER_DISCONNECT)      # duplicate close
    core.on_connected(clock.now, clock.wall(), 25.0)     # a late connect from nowhere
    assert core.on_ack(1, clock.now) is None
    assert core.state == LinkState.WAITING and core.attempt_at() == next_at
    assert core.journal.losses_since(0) == [J.TRANSPORT_ERROR]


def test_report_of_previous_connections_is_sent_after_first_ack_until_acked():
    core, clock = make(jitter="none")
    connect(core, clock)
    core.on_ack(1, clock.now)
    clock.advance(10)
    core.on_closed(clock.now, J.TRANSPORT_ERROR)
    clock.advance(5)
    actions = connect(core, clock)
    assert not any(isinstance(a, SendReport) for a in actions)  # not before proof of life
    core.on_ack(core.seq, clock.now)
    actions = core.poll(clock.now)
    reports = [a for a in actions if isinstance(a, SendReport)]
    assert len(reports) == 1
    rec = reports[0].connections[0]
    assert rec["ended_reason"] == J.TRANSPORT_ERROR and rec["lived_s"] == 10.0
    assert rec["heartbeats_acked"] == 1
    # not ACKed: goes again on the next connection, not on every poll
    assert not any(isinstance(a, SendReport) for a in core.poll(clock.now))
    core.on_closed(clock.now, J.ACK_TIMEOUT)
    clock.advance(5)
    connect(core, clock)
    core.on_ack(core.seq, clock.now)
    reports = [a for a in core.poll(clock.now) if isinstance(a, SendReport)]
    assert [c["ended_reason"] for c in reports[0].connections] == [J.TRANSPORT_ERROR, J.ACK_TIMEOUT]
    core.on_report_acked(reports[0].upto_n)
    assert core.journal.unreported() == []


def test_start_resumes_a_schedule():
    core, clock = make()
    core.start(clock.now, resume_at=clock.now + 7, attempts=4)
    assert core.poll(clock.now) == []
    clock.advance(7)
    assert core.poll(clock.now) == [Connect(attempt=4)]


def test_stop_aborts_only_when_connected():
    core, clock = make()
    assert core.stop(clock.now) == []
    core, clock = make()
    connect(core, clock)
    assert core.stop(clock.now) == [Abort(J.SHUTDOWN)]
    assert core.state == LinkState.STOPPED and core.next_wakeup() == float("inf")


@pytest.mark.parametrize("seed", range(5))
def test_fleet_of_cores_spreads_reconnects_after_a_shared_loss(seed):
    """500 devices lose the server at the same instant; jitter spreads their retries."""
    times = []
    for i in range(500):
        core, clock = make(jitter="full", base=1, cap=60, seed=seed * 1000 + i)
        for _ in range(3):  # the server stays down for three attempts
            core.poll(clock.now)
            core.on_connect_failed(clock.now, J.CONNECT_FAILED)
            clock.advance(core.attempt_at() - clock.now)
        times.append(clock.now)
    times.sort()
    per_100ms = {}
    for t in times:
        per_100ms[int(t * 10)] = per_100ms.get(int(t * 10), 0) + 1
    assert max(per_100ms.values()) < 50  # no lock-step: < 10% in any 100 ms


def test_old_server_without_acks_no_watchdog_reconnects_over_five_minutes():
    """A server that never ACKs (older ScreenTinker) only pings: the ACK watchdog stays
    disarmed and inbound silence never fires while pings arrive."""
    policy = LinkPolicy(liveness=LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5))
    clock = FakeClock()
    core = LinkCore(policy, random.Random(0))
    core.start(clock.now)
    core.poll(clock.now)
    core.on_connected(clock.now, clock.wall(), 25.0)
    aborts = []
    while clock.now < 1000 + 300:
        clock.advance(0.5)
        if int(clock.now * 2) % 50 == 0:  # an Engine.IO ping every 25 s
            core.on_inbound(clock.now)
        aborts += [a for a in core.poll(clock.now) if isinstance(a, Abort)]
    assert aborts == [] and not core.watchdog.armed
    # ...and a silent drop is still caught, by silence
    t_drop = clock.now
    while not aborts:
        clock.advance(0.5)
        aborts += [a for a in core.poll(clock.now) if isinstance(a, Abort)]
    assert aborts[0].reason == J.SILENCE and clock.now - t_drop <= 25 + 5


def test_core_asks_the_kernel_at_the_ack_deadline_and_an_undelivered_heartbeat_aborts():
    from agent.link.core import VerifyDelivery
    core = LinkCore(LinkPolicy(liveness=LivenessPolicy(heartbeat_interval_s=15, ack_timeout_s=5)))
    core.start(0.0)
    assert isinstance(core.poll(0.0)[0], Connect)
    core.on_connected(1.0, 1000.0, 25.0)
    assert [type(a) for a in core.poll(1.0)] == [SendHeartbeat]
    assert core.next_wakeup() == 6.0
    assert core.poll(6.0) == [VerifyDelivery(1)]
    assert core.on_delivery(1, True, 6.0, 0.01) == []
    assert core.snapshot(6.0)["proof"] == "tcp-ack+ping" and core.snapshot(6.0)["proven_live"]
    core.poll(16.0)
    assert core.poll(21.0) == [VerifyDelivery(2)]
    assert core.on_delivery(2, False, 21.0) == [Abort("ack-timeout")]
    assert core.state == LinkState.WAITING and core.last_reason == "ack-timeout"
