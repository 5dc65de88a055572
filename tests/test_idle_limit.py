"""The adaptive heartbeat (issue #28): a site's idle limit learnt from the connections
it reaps, on a fake clock, against a simulated reaping box."""
import random

from agent.base import reasons as J
from agent.link.core import Abort, Connect, LinkCore, LinkPolicy, SendHeartbeat
from agent.link.idle_limit import IdleLimit
from agent.config.policies import IdlePolicy
from agent.link.idle_memory import IdleMemory, network_key
from agent.config.policies import LivenessPolicy
from agent.base.backoff import BackoffPolicy


class ReapingSite:
    """A box that stops forwarding a flow once it has carried nothing for ``limit_s``
    (None: it does not reap), between the core and a server that ACKs at once."""

    def __init__(self, core: LinkCore, limit_s):
        self.core, self.limit_s = core, limit_s
        self.reaps, self.connects, self.online_s = 0, 0, 0.0
        self.reasons: list[str] = []
        self._last_traffic = 0.0
        self._alive = False
        self._acks: list[tuple[float, int]] = []

    def run(self, start: float, seconds: float, step: float = 0.05) -> float:
        t = start
        while t < start + seconds:
            if self._alive and self.limit_s is not None and t - self._last_traffic >= self.limit_s:
                self._alive = False          # reaped: silently, nobody is told
            for due, seq in [a for a in self._acks if a[0] <= t]:
                self._acks.remove((due, seq))
                if self._alive:
                    self.core.on_ack(seq, t)
                    self._last_traffic = t
            for action in self.core.poll(t):
                if isinstance(action, Connect):
                    self.core.on_connected(t, 1_000_000 + t, 25.0)
                    self._alive, self._last_traffic = True, t
                    self.connects += 1
                elif isinstance(action, SendHeartbeat) and self._alive:
                    self._acks.append((t + 0.05, action.seq))
                    self._last_traffic = t
                elif isinstance(action, Abort):
                    self.reasons.append(action.reason)
                    if action.reason in (J.ACK_TIMEOUT, J.IDLE_REAP):
                        self.reaps += 1
                    self._alive = False
            if self.core.state.value == "online":
                self.online_s += step
            t += step
        return t


def _core(probe_after_s=600.0, enabled=True):
    return LinkCore(LinkPolicy(liveness=LivenessPolicy(heartbeat_interval_s=15.0, ack_timeout_s=5.0),
                               backoff=BackoffPolicy(base_s=1.0, cap_s=30.0),
                               idle=IdlePolicy(enabled=enabled, probe_after_s=probe_after_s)),
                    random.Random(7))


def test_behind_a_10s_reaper_at_most_3_reaps_while_learning_and_none_after():
    core = _core()
    core.start(0.0)
    site = ReapingSite(core, 10.0)
    t = site.run(0.0, 120.0)
    learning_reaps = site.reaps
    assert learning_reaps <= 3, site.reasons
    assert 7.0 <= core.idle.interval_s <= 7.5 and J.IDLE_REAP in site.reasons
    site.run(t, 500.0)                       # before the first probe back up
    assert site.reaps == learning_reaps, site.reasons
    # today's behaviour, for comparison: reaped every cycle, forever
    fixed = _core(enabled=False)
    fixed.start(0.0)
    today = ReapingSite(fixed, 10.0)
    today.run(0.0, 620.0)
    assert today.reaps >= 15 and J.IDLE_REAP not in today.reasons
    assert site.online_s > today.online_s


def test_a_probe_that_finds_the_limit_still_there_costs_one_reap_and_waits_twice_as_long():
    core = _core(probe_after_s=100.0)
    core.start(0.0)
    site = ReapingSite(core, 10.0)
    t = site.run(0.0, 60.0)
    before = site.reaps
    t = site.run(t, 130.0)                   # one probe: 7.5 s -> 11.25 s, reaped, back
    assert site.reaps == before + 1 and 7.0 <= core.idle.interval_s <= 7.5
    t = site.run(t, 150.0)                   # the next probe only after 200 s
    assert site.reaps == before + 1


def test_when_the_site_stops_reaping_the_heartbeat_drifts_back_to_the_configured_interval():
    core = _core(probe_after_s=100.0)
    core.start(0.0)
    site = ReapingSite(core, 10.0)
    t = site.run(0.0, 60.0)
    assert core.idle.learning
    site.limit_s = None                      # the firewall was replaced
    t = site.run(t, 250.0)
    assert core.idle.interval_s == 15.0      # on probation: kept once it held a wait
    site.run(t, 100.0)
    assert core.idle.interval_s == 15.0 and not core.idle.learning


def test_one_lost_connection_is_not_a_pattern():
    idle = IdleLimit(15.0)
    assert idle.died(15.0, 10.0) is False and not idle.learning
    assert idle.died(4.0, 50.0) is False and not idle.learning    # not about the same gap
    assert idle.died(14.0, 90.0) is True and idle.interval_s == 7.0


def test_a_loss_well_before_the_learnt_gap_is_not_blamed_on_the_reaper():
    idle = IdleLimit(15.0)
    idle.died(15.0, 0.0), idle.died(15.0, 20.0)
    assert idle.interval_s == 7.5
    assert idle.died(1.0, 30.0) is False and idle.interval_s == 7.5


def test_never_below_the_ack_timeout_or_the_floor():
    idle = IdleLimit(15.0, IdlePolicy(min_interval_s=2.0), ack_timeout_s=5.0)
    for t in range(6):
        idle.died(idle.interval_s, t * 20.0)
    assert idle.interval_s == 5.0


def test_what_was_learnt_is_kept_per_network_and_a_damaged_file_is_ignored(tmp_path):
    idle = IdleLimit(15.0)
    idle.died(15.0, 0.0), idle.died(15.0, 20.0)
    memory = IdleMemory(str(tmp_path))
    memory.keep("eth0/10.0.0.1/aa:bb", idle.memory())
    memory.keep("wlan0/192.168.1.1/cc:dd", None)
    again = IdleLimit(15.0)
    again.recall(memory.recall("eth0/10.0.0.1/aa:bb"), 100.0)
    assert again.interval_s == 7.5 and again.learning
    other = IdleLimit(15.0)
    other.recall(memory.recall("wlan0/192.168.1.1/cc:dd"), 100.0)
    assert not other.learning
    for bad in ({"interval_s": 0.001}, {"interval_s": 1e308}, {"interval_s": True}, "x", None):
        hostile = IdleLimit(15.0)
        hostile.recall(bad, 0.0)
        assert hostile.interval_s == 15.0
    (tmp_path / "idle-limits.json").write_bytes(b"\x00not json")
    assert memory.recall("eth0/10.0.0.1/aa:bb") is None


def test_the_network_is_named_by_its_default_route(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net/route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
        "eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
        "eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\n")
    (tmp_path / "net/arp").write_text(
        "IP address       HW type     Flags       HW address            Mask     Device\n"
        "192.168.0.1      0x1         0x2         dc:a6:32:00:11:22     *        eth0\n")
    assert network_key(str(tmp_path)) == "eth0/192.168.0.1/dc:a6:32:00:11:22"
    (tmp_path / "net/route").write_text("Iface\tDestination\n")
    assert network_key(str(tmp_path)) == "no-default-route"


def test_a_planted_memory_cannot_take_the_heartbeat_below_the_floor():
    """Found by review: a safe_s of -100 in idle-limits.json, then one loss, made the
    interval -100 and the link thread spin sending heartbeats."""
    idle = IdleLimit(15.0, ack_timeout_s=5.0)
    idle.recall({"interval_s": 7.5, "safe_s": -100, "probe_wait_s": -1}, 0.0)
    idle.tick(1e9)                             # a probe: 7.5 -> 11.25
    assert idle.died(11.25, 1e9 + 1) is True
    assert idle.interval_s == 7.5 and idle.interval_s >= idle.floor_s


def test_two_losses_with_answered_heartbeats_between_them_are_not_a_pattern():
    """Found by review: any two unrelated ACK timeouts, even a week apart, halved the
    heartbeat of a site that does not reap."""
    idle = IdleLimit(15.0)
    assert idle.died(15.0, 0.0) is False
    idle.connected()
    idle.survived(15.0, 100.0)                 # the same quiet, answered
    assert idle.died(15.0, 7 * 86400.0) is False and not idle.learning
    far_apart = IdleLimit(15.0, IdlePolicy(probe_after_s=1800.0))
    far_apart.died(15.0, 0.0)
    assert far_apart.died(15.0, 3 * 3600.0) is False, "the first loss is too old to count"


def test_a_reaper_just_below_the_configured_interval_is_probed_with_growing_waits():
    """Found by review: 15 -> 7.5 -> 11.25 -> 15 forgot everything and started over every
    hour. The configured interval is probed like any step, and kept only after a wait."""
    core = _core(probe_after_s=100.0)
    core.start(0.0)
    site = ReapingSite(core, 12.0)
    t = site.run(0.0, 60.0)
    assert core.idle.learning
    learning = site.reaps
    site.run(t, 1500.0)
    # probes at ~+100 (11.25 holds), +200 (15: reaped, back, wait 200), +400 (reaped,
    # wait 400), +800 ...: a handful of reaps in 25 minutes, not one per cycle
    assert site.reaps - learning <= 4, site.reasons
    assert core.idle.learning and core.idle.interval_s < 15.0
