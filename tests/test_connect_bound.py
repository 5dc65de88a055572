"""The connect bound learnt from the link's own handshakes (issue #28), on numbers."""
from agent.link import journal as J
from agent.link.connect_bound import FLOOR_S, ConnectBound
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
