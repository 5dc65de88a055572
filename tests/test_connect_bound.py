"""The connect bound learnt from the link's own handshakes (issue #28), on numbers."""
from agent.base import reasons as J
from agent.link.connect_bound import FLOOR_S, RACE_FLOOR_S, ConnectBound
from agent.link.core import LinkCore, LinkPolicy


def test_the_configured_timeout_until_a_connect_has_been_seen():
    assert ConnectBound(10.0).current() == 10.0


def test_a_fast_link_waits_the_floor_a_slow_one_a_multiple_of_its_slowest_connect():
    fast = ConnectBound(10.0)
    fast.succeeded(0.04)
    assert fast.current() == FLOOR_S
    slow = ConnectBound(30.0)
    for seconds in (1.0, 2.5, 1.2):
        slow.succeeded(seconds)
    assert slow.current() == 10.0          # 4 x 2.5 s
    capped = ConnectBound(10.0)
    capped.succeeded(5.0)
    assert capped.current() == 10.0


def test_a_timeout_at_the_learnt_bound_doubles_it_until_a_connect_succeeds():
    b = ConnectBound(20.0)
    b.succeeded(0.1)
    seen = []
    for _ in range(4):
        seen.append(b.current())
        b.timed_out()
    assert seen == [4.0, 8.0, 16.0, 20.0]
    b.succeeded(0.1)
    assert b.current() == 4.0


def test_a_ceiling_below_the_floor_is_the_bound():
    b = ConnectBound(2.0)
    b.succeeded(0.01)
    assert b.current() == 2.0


def test_the_report_says_why_each_attempt_failed_while_the_device_was_away():
    core = LinkCore(LinkPolicy())
    core.start(0.0)
    core.poll(0.0)
    core.on_connected(0.1, 1000.0, None, "10.0.0.7:5000", connect_s=0.05, clock_skew_s=-3600.0)
    core.on_closed(10.0, J.ACK_TIMEOUT, "no ACK")
    for t, reason in ((11.0, J.DNS_FAILED), (13.0, J.CAPTIVE_PORTAL), (17.0, J.CAPTIVE_PORTAL)):
        core.poll(t + 5)
        core.on_connect_failed(t + 5, reason, f"{reason} detail")
    snap = core.snapshot(30.0)
    assert (snap["reason"], snap["detail"]) == (J.CAPTIVE_PORTAL, "captive-portal detail")
    record = core.journal.unreported()[0].to_dict()
    assert record["failed_after"] == {J.DNS_FAILED: 1, J.CAPTIVE_PORTAL: 2}
    assert record["connect_ms"] == 50.0 and record["clock_skew_s"] == -3600.0


# -- the race: more dials for a connect with no answer yet (issues #36, #54) ----------

def _learnt(*seconds: float) -> ConnectBound:
    b = ConnectBound(10.0)
    for s in seconds:
        b.succeeded(s)
    return b


def test_nothing_learnt_no_race_a_fast_link_races_after_half_a_second_a_slow_one_after_3x():
    assert ConnectBound(10.0).race_after() is None
    assert _learnt(0.02, 0.04).race_after() == RACE_FLOOR_S
    assert _learnt(0.5, 0.9).race_after() == 2.7
    # 3 x 2 s is past the bound (4 x 2 s capped at 3 s): the bound ends it first
    capped = ConnectBound(3.0)
    capped.succeeded(2.0)
    assert capped.race_after() is None


def test_no_race_while_the_server_struggles_for_everyone():
    b = _learnt(0.02)
    assert b.race_after(held=True) is None           # a throttle in force
    assert b.race_after(shared_loss=True) is None    # the server went away for everyone
    b.busy()                                         # a 429/503 answer
    assert b.race_after() is None
    b.succeeded(0.03)                                # quick again
    assert b.race_after() == RACE_FLOOR_S


def test_a_slow_handshake_or_a_race_unanswered_on_every_dial_stops_racing_until_one_is_quick():
    b = _learnt(0.02, 0.03)
    b.succeeded(1.5)              # slower than the race threshold (0.5 s): slow for everyone
    assert b.race_after() is None
    b.succeeded(0.02)             # learnt 1.5 s is among the samples: the threshold is 4.5 s
    assert b.race_after() == 4.5
    fast = _learnt(0.02)
    fast.timed_out(raced=False)   # one dial that landed on a hung node: no evidence of more
    assert fast.race_after() == RACE_FLOOR_S
    fast.timed_out(raced=True)    # no dial of the race answered: not one node
    assert fast.race_after() is None
    fast.succeeded(0.02)
    assert fast.race_after() == RACE_FLOOR_S


def test_the_core_tells_a_throttle_and_a_loss_everyone_saw_from_a_silent_one():
    core = LinkCore(LinkPolicy())
    core.start(0.0)
    core.poll(0.0)
    core.on_connected(0.1, 1000.0)
    core.on_closed(5.0, J.ACK_TIMEOUT)
    assert not core.after_shared_loss and not core.held(5.0)
    core.poll(core.attempt_at())
    core.on_connected(core.attempt_at() + 0.1, 1010.0)
    core.on_closed(20.0, J.TRANSPORT_ERROR)
    assert core.after_shared_loss
    core.on_throttle(30.0, 20.0)
    assert core.held(49.0) and not core.held(50.0)


def test_a_429_or_503_answer_to_the_upgrade_tells_the_bound_the_server_is_busy():
    from agent.link.upgrade import _not_an_upgrade
    assert _not_an_upgrade(None, 503).busy and _not_an_upgrade(None, 429).busy
    assert not _not_an_upgrade(None, 404).busy and not _not_an_upgrade(None, 302).busy
