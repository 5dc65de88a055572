"""The network healed on the device, never blindly (#53): the healer's core on a fake
clock (a device-side fault healed within 10 minutes, each rung at its time; a 24-hour
upstream outage with no bounce and no reboot; a flapping cause never climbing faster than
the bounds; the day's reboots shared with the screen's ladder), then its shell on real
files (the reboot book) and the status words. The kernel's side is
tests/test_network_heal_netns.py."""
import pytest

from agent.base import reasons as R
from agent.device import network as N
from agent.device import words
from agent.device.heal import NetworkHeal, Off, assemble
from agent.screen.reboots import RebootBook

POLICY = N.Policy(enabled=True, probe_s=10.0, confirm_s=60.0, wait_s=120.0, reboot=True)
GOOD = N.Probe("eth0", carrier=True, address=True, neighbour="REACHABLE",
               rx_packets=100, tx_packets=100, manager="systemd-networkd")
NO_CARRIER = N.Probe("eth0", carrier=False, address=False, neighbour=None,
                     rx_packets=100, tx_packets=100, manager="systemd-networkd")
GW_FAILED = N.Probe("eth0", carrier=True, address=True, neighbour="FAILED",
                    rx_packets=100, tx_packets=120, manager="systemd-networkd")


def down(now, reason=R.CONNECT_TIMEOUT):
    return N.LinkSeen(True, reason, False, now)


def live(now):
    return N.LinkSeen(False, None, True, now)


class World:
    """The healer driven as its shell drives it: a probe whenever one is due, the
    rungs answered at once (done), every effect kept with its time."""

    def __init__(self, policy=POLICY, probe=GOOD):
        self.healer = N.Healer(policy)
        self.probe = probe
        self.now = 0.0
        self.acts, self.reports = [], []
        self.answer = {}

    def feed(self, event):
        self._apply(self.healer.handle(event))

    def _apply(self, effects):
        while effects:
            e, effects = effects[0], effects[1:]
            if isinstance(e, N.Act):
                self.acts.append((self.now, e))
                ok, said = self.answer.get(e.rung, (True, "ok"))
                effects += self.healer.handle(N.RungDone(e.rung, ok, said, self.now))
            else:
                self.reports.append((self.now, e))

    def run_until(self, end, step=1.0):
        while True:
            if self.healer.probe_due(self.now):
                self.feed(N.Probed(self.probe, self.now))
            self.feed(N.Tick(self.now))
            if self.now >= end:
                return
            self.now += step

    def rungs(self):
        return [(t, a.rung) for t, a in self.acts]


def test_a_device_side_fault_is_healed_within_ten_minutes_each_rung_at_its_time():
    w = World(probe=NO_CARRIER)
    w.feed(down(0.0))
    w.run_until(600.0)
    # confirmed after 60 s and two probes; each rung waits 120 s for the one before
    assert w.rungs() == [(60.0, N.BOUNCE), (180.0, N.RESTART_MANAGER), (300.0, N.REBOOT)]
    assert [a.cause for _, a in w.acts] == [N.NO_CARRIER] * 3
    assert w.acts[0][1].interface == "eth0" and w.acts[0][1].manager == "systemd-networkd"
    steps = [(r.fields["rung"], r.fields["outcome"]) for _, r in w.reports]
    # (a reboot ends the process; in this world it did not heal, and nothing is left)
    assert steps == [(N.BOUNCE, "done"), (N.RESTART_MANAGER, "done"), (N.REBOOT, "done"),
                     (None, "exhausted")]
    assert w.reports[-1][0] == 420.0
    assert all(r.event_type == N.EVENT for _, r in w.reports)


def test_the_bounce_that_heals_ends_the_episode_and_the_next_one_starts_afresh():
    w = World(probe=GW_FAILED)
    w.feed(down(0.0))
    w.run_until(61.0)
    assert w.rungs() == [(60.0, N.BOUNCE)]
    w.probe = GOOD
    w.run_until(100.0)
    w.feed(live(100.0))
    assert w.reports[-1][1].fields["outcome"] == "healed"
    assert w.reports[-1][1].fields["cause"] == N.GATEWAY_SILENT
    assert w.healer.state == N.WATCHING and w.healer.tried == []
    w.run_until(2000.0)
    assert len(w.acts) == 1     # the link is up: nothing probed, nothing done


def test_a_24_hour_upstream_outage_bounces_nothing_and_reboots_nothing():
    """The gateway answers (REACHABLE): a WAN outage, the server down, a firewall. And
    reasons where something answered are upstream whatever the probe says."""
    w = World(probe=GOOD)
    w.feed(down(0.0))
    w.run_until(86400.0, step=5.0)
    assert w.acts == [] and w.reports == []
    w2 = World(probe=NO_CARRIER)   # a probe that would act, and a TLS failure: upstream
    w2.feed(down(0.0, R.TLS_UNTRUSTED))
    w2.run_until(86400.0, step=5.0)
    assert w2.acts == [] and w2.reports == []
    for reason in (R.CONNECTION_REFUSED, R.PROXY_AUTH, R.HTTP_ERROR, R.CAPTIVE_PORTAL,
                   R.REFUSED, R.TLS_EXPIRED, R.SERVER_DISCONNECT):
        assert reason not in R.SILENT_PATH


def test_the_cause_turning_upstream_after_a_rung_holds_the_ladder():
    w = World(probe=NO_CARRIER)
    w.feed(down(0.0))
    w.run_until(61.0)
    w.probe = GOOD      # the carrier is back, the server is still unreachable: upstream
    w.run_until(86400.0, step=5.0)
    assert w.rungs() == [(60.0, N.BOUNCE)]
    assert w.healer.state == N.HELD


def test_one_probe_is_no_proof_and_a_cause_seen_briefly_is_not_acted_on():
    w = World(probe=NO_CARRIER)
    w.feed(down(0.0))
    w.run_until(30.0)
    w.probe = GOOD
    w.run_until(3600.0)
    assert w.acts == []


def test_a_flapping_cause_never_climbs_faster_than_the_bounds():
    """The carrier drops for 200 s and comes back for a minute, over and over, for a day:
    each episode in the hour of the one before waits twice as long to be confirmed, a
    bounce is done at most 4 times an hour and a manager's restart twice, two rungs are
    never closer than wait_s, and the link proven live between resets the ladder, so it
    never gets to a reboot."""
    w = World(probe=NO_CARRIER)
    t = 0.0
    while t < 86400.0:
        w.probe = NO_CARRIER
        w.feed(down(t))
        w.run_until(t + 200.0)
        w.probe = GOOD
        w.feed(live(w.now))
        t = w.now + 60.0
        w.run_until(t)
    rungs = w.rungs()
    assert rungs and [r for _, r in rungs if r == N.REBOOT] == []
    for rung, limit in ((N.BOUNCE, 4), (N.RESTART_MANAGER, 2)):
        times = [at for at, r in rungs if r == rung]
        for at in times:
            assert len([b for b in times if at <= b < at + 3600.0]) <= limit
    assert all(b - a >= 60.0 for (a, _), (b, _) in zip(rungs, rungs[1:]))
    # the second episode of the hour waited 120 s to be confirmed, not 60
    assert rungs[0] == (60.0, N.BOUNCE) and rungs[2][0] - 260.0 >= 120.0
    assert len(rungs) <= 24 * 6


def test_a_spent_bounce_waits_for_its_hour_and_never_makes_way_for_a_harsher_rung():
    w = World(probe=NO_CARRIER)
    for at in (0.0, 1.0, 2.0, 3.0):
        w.healer.budgets[N.BOUNCE].spend(at)
    w.feed(down(10.0))
    w.now = 10.0
    w.run_until(3603.0)
    assert w.rungs() == [(3600.0, N.BOUNCE)]
    assert "waits for the hour" in w.healer.snapshot()["last"] or w.healer.tried


def test_no_manager_known_passes_the_bounce_over_and_a_refused_reboot_exhausts():
    w = World(probe=N.Probe(None, route=False))
    w.answer[N.REBOOT] = (False, "not rebooted: 3 of 3 reboots a day spent")
    w.feed(down(0.0, R.NETWORK_UNREACHABLE))
    w.run_until(600.0)
    assert w.rungs() == [(60.0, N.REBOOT)]
    last = w.reports[-1][1].fields
    assert last["outcome"] == "exhausted" and last["cause"] == N.NO_ROUTE
    assert any("no manager" in p for p in last["passed_over"])
    n = len(w.reports)
    w.run_until(86400.0, step=10.0)
    assert len(w.reports) == n and len(w.acts) == 1   # said once, nothing more


def test_reboot_not_allowed_is_passed_over():
    w = World(N.Policy(enabled=True, probe_s=10, confirm_s=60, wait_s=120, reboot=False),
              probe=NO_CARRIER)
    w.feed(down(0.0))
    w.run_until(900.0)
    assert [r for _, r in w.rungs()] == [N.BOUNCE, N.RESTART_MANAGER]
    assert w.reports[-1][1].fields["outcome"] == "exhausted"


def test_the_probes_tell_each_cause():
    p = N.Probe
    assert N.cause(p(None, route=False), None) == N.NO_ROUTE
    assert N.cause(p("eth0", carrier=False), None) == N.NO_CARRIER
    assert N.cause(p("eth0", carrier=True, address=False), None) == N.NO_ADDRESS
    assert N.cause(p("eth0", route=False, carrier=True, address=True), None) == N.NO_ROUTE
    assert N.cause(p("eth0", carrier=True, address=True, neighbour="INCOMPLETE"),
                   None) == N.GATEWAY_SILENT
    assert N.cause(GOOD, None) == N.UPSTREAM
    stale = p("eth0", carrier=True, address=True, neighbour="STALE",
              rx_packets=5, tx_packets=9)
    sent = p("eth0", carrier=True, address=True, neighbour="STALE",
             rx_packets=5, tx_packets=30)
    assert N.cause(sent, stale) == N.WEDGED
    assert N.cause(stale, stale) == N.UPSTREAM   # nothing sent, nothing told


def test_off_probes_nothing():
    w = World(N.Policy(enabled=False, probe_s=10, confirm_s=60, wait_s=120, reboot=True),
              probe=NO_CARRIER)
    w.feed(down(0.0))
    assert not w.healer.probe_due(0.0) and w.healer.next_wake(0.0) is None
    w.run_until(3600.0)
    assert w.acts == []


# -- the shell -------------------------------------------------------------------------
class FakeNet:
    def __init__(self, probe):
        self.probe_value, self.done = probe, []

    def probe(self):
        return self.probe_value

    def bounce(self, manager, interface):
        self.done.append(("bounce", manager, interface))
        return True, f"{interface} bounced through {manager}"

    def restart_manager(self, manager):
        self.done.append(("restart", manager))
        return True, "restarted"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def shell_down_for(book, state, reason, seconds):
    """The shell on a fake clock, its link down for ``seconds``: its turns when it asks."""
    reboots, events = [], []
    clock = Clock()
    heal = NetworkHeal(N.Healer(POLICY), FakeNet(NO_CARRIER), events.append,
                       book=lambda: book, reboot=lambda: reboots.append(1) or (True, "asked"),
                       clock=clock, wall=lambda: 1.7e9)
    heal.link_changed({"state": state, "reason": reason, "proven_live": False})
    wake = heal.step()
    while clock.t < 1000.0 + seconds:
        clock.t = max(wake, clock.t + 1.0)
        wake = heal.step() or clock.t + 10
    return heal, reboots, events


def test_the_shell_takes_the_reboot_from_the_screens_book_and_respects_its_day(tmp_path):
    """One budget a day for every reboot the agent asks: the screen's ladder took the
    day's one; the network's healer is refused, and says so."""
    book = RebootBook(str(tmp_path), 1, synced=lambda: True)
    assert book.take("screen: picture black")[0]
    heal, reboots, events = shell_down_for(book, "waiting", R.CONNECT_TIMEOUT, 900.0)
    assert reboots == []
    said = [(e.details["rung"], e.details["outcome"]) for e in events]
    assert said == [("bounce", "done"), ("restart-manager", "done"), ("reboot", "failed"),
                    (None, "exhausted")]
    assert "1 of 1 reboots a day spent" in events[2].details["said"]
    assert heal.net.done == [("bounce", "systemd-networkd", "eth0"),
                             ("restart", "systemd-networkd")]


def test_the_shell_reboots_within_the_shared_budget_and_counts_it_on_the_card(tmp_path):
    book = RebootBook(str(tmp_path), 2, synced=lambda: True)
    heal, reboots, events = shell_down_for(book, "connecting", R.DNS_FAILED, 600.0)
    assert reboots == [1]
    assert RebootBook(str(tmp_path), 2, synced=lambda: True).left() == 1   # on the card
    assert book.entries[-1].why == "network: no-carrier"


def test_the_shell_sleeps_while_the_link_is_up():
    heal = NetworkHeal(N.Healer(POLICY), FakeNet(NO_CARRIER), lambda e: None, clock=Clock())
    heal.link_changed({"state": "online", "reason": None, "proven_live": True})
    assert heal.step() is None


def test_the_key_off_is_no_part_and_the_schema_bounds_it(tmp_path):
    from agent.config import load as config_load
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nurl = "https://fleet.example"\n')
    config = config_load.load(str(path), {})
    assert config.device.heal_network is False
    assert isinstance(assemble(config, print, lambda: None, None, lambda: None,
                               lambda: (True, "")), Off)
    path.write_text('[server]\nurl = "https://fleet.example"\n'
                    "[device]\nheal_network = true\nheal_wait_s = 5\n")
    with pytest.raises(config_load.ConfigError, match="heal_wait_s"):
        config_load.load(str(path), {})


def test_the_healer_off_loads_neither_its_core_nor_the_screens_ladder(tmp_path):
    """Off as shipped: `edge-agent run` loads none of the healer's modules before its
    link (#51: the start's imports), and the device part gives the daemon its Off; on,
    the healer itself."""
    import subprocess
    import sys
    from pathlib import Path
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nurl = "https://fleet.example"\n')
    script = ("import sys; import agent.cli, agent.app.daemon, agent.uploads.store\n"
              "from types import SimpleNamespace as NS\n"
              "from agent.config import load; from agent.device import part\n"
              "screen = NS(mender=None, reboot=lambda: (True, ''), reboot_book=lambda c: None)\n"
              "device, network = part.assemble_on(load.load(sys.argv[1], {}), False, print,\n"
              "    lambda: None, None, screen=screen, commands=None)\n"
              "print(type(network).__name__, ' '.join(sorted(m for m in sys.modules if m in (\n"
              "    'agent.device.heal', 'agent.device.network', 'agent.device.netprobe',\n"
              "    'agent.screen.ladder'))))")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split() == ["Off"], out.stdout + out.stderr
    path.write_text('[server]\nurl = "https://fleet.example"\n[device]\nheal_network = true\n')
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.split()[0] == "NetworkHeal", out.stdout + out.stderr


def test_the_status_says_where_the_ladder_is():
    assert words.network_lines(None) == []
    assert words.network_lines({"enabled": False}) == []
    line = words.network_lines({"enabled": True, "state": "waiting", "cause": "no-carrier",
                                "interface": "eth0", "manager": "systemd-networkd",
                                "carrier": False, "gateway": None,
                                "last": "bounce done: eth0 bounced"})
    assert line == ["network     healer waiting: no-carrier (interface eth0, manager "
                    "systemd-networkd, no carrier); last: bounce done: eth0 bounced"]


def test_a_probe_that_cannot_read_the_routes_tells_nothing_and_nothing_is_done(tmp_path):
    """Netlink refused (a sandbox without it) or too slow: the routes are not known,
    which is no proof that there are none. Acting on it would be blind."""
    from agent.device.netlink import NetlinkError
    from agent.device.netprobe import NetProbe

    class Refused:
        def default_routes(self):
            raise NetlinkError("Address family not supported by protocol")
    probe = NetProbe(str(tmp_path), networkd_dir=str(tmp_path / "none"),
                     ifstate=str(tmp_path / "none"), nudge=False, nl=Refused())
    seen = probe.probe()
    assert N.cause(seen, None) == N.UPSTREAM and seen.known is False
    w = World(probe=seen)
    w.feed(down(0.0, R.NETWORK_UNREACHABLE))
    w.run_until(86400.0, step=10.0)
    assert w.acts == [] and w.reports == []


def test_a_neighbour_table_that_cannot_be_read_is_unknown_and_climbs_no_rung(tmp_path):
    """A failed neighbour dump (netlink refused, too slow, too large) says nothing of the
    gateway: not "no entry", which with packets sent and none received would read as a
    wedged interface and bounce it."""
    from agent.device.netlink import NetlinkError
    from agent.device.netprobe import NetProbe

    class NoNeighbours:
        def __init__(self):
            self.tx = 9

        def default_routes(self):
            return [(1, "10.0.0.1", 0)]

        def global_address(self, index):
            return True

        def neighbour(self, index, address):
            raise NetlinkError("the dump timed out")
    net = tmp_path / "class" / "net" / "lo"
    (net / "statistics").mkdir(parents=True)
    (net / "carrier").write_text("1\n")
    probe = NetProbe(str(tmp_path), networkd_dir=str(tmp_path / "none"),
                     ifstate=str(tmp_path / "none"), nudge=False, nl=NoNeighbours())
    seen = []
    for tx in (9, 30):
        (net / "statistics" / "rx_packets").write_text("5\n")
        (net / "statistics" / "tx_packets").write_text(f"{tx}\n")
        seen.append(probe.probe())
    assert seen[1].neighbour == "unknown"
    assert N.cause(seen[1], seen[0]) == N.UPSTREAM
    # the same probes with no entry told are a wedged interface
    told = [N.Probe(**{**vars(x), "neighbour": None}) for x in seen]
    assert N.cause(told[1], told[0]) == N.WEDGED


def test_no_default_route_is_device_side_only_where_the_kernel_found_no_route():
    """A server on the screen's own subnet needs no default route: a connect that timed
    out had a route, so a missing default route is no cause; the kernel's own
    network-unreachable (or a name that did not resolve) is."""
    routeless = N.Probe("eth0", route=False, carrier=True, address=True)
    assert N.cause(routeless, None, R.CONNECT_TIMEOUT) == N.UPSTREAM
    assert N.cause(routeless, None, R.NETWORK_UNREACHABLE) == N.NO_ROUTE
    assert N.cause(routeless, None, R.DNS_FAILED) == N.NO_ROUTE
    w = World(probe=routeless)
    w.feed(down(0.0, R.CONNECT_TIMEOUT))
    w.run_until(3600.0, step=10.0)
    assert w.acts == []


def test_the_manager_is_told_by_its_own_files_never_by_a_directory_alone(tmp_path):
    from agent.device.netprobe import IFUPDOWN, NETWORKD, NetProbe
    links, net = tmp_path / "links", tmp_path / "sys" / "class" / "net" / "eth0"
    links.mkdir()
    net.mkdir(parents=True)
    (net / "ifindex").write_text("2\n")
    probe = NetProbe(str(tmp_path / "sys"), networkd_dir=str(links),
                     ifstate=str(tmp_path / "ifstate"), nudge=False)
    assert probe.manager("eth0") is None and probe.manager(None) is None   # installed, idle
    (links / "2").write_text("# This is private data. Do not parse.\nADMIN_STATE=unmanaged\n")
    assert probe.manager("eth0") is None
    (links / "2").write_text("ADMIN_STATE=configured\nOPER_STATE=routable\n")
    assert probe.manager("eth0") == NETWORKD and probe.manager(None) == NETWORKD
    (links / "2").unlink()
    (tmp_path / "ifstate").write_text("lo=lo\neth0=eth0\n")
    assert probe.manager("eth0") == IFUPDOWN and probe.manager("wlan0") is None


def test_two_parts_asking_the_days_last_reboot_at_once_get_one(tmp_path, monkeypatch):
    """The screen's ladder and the network's healer share the book, each on its own
    thread: the day's last reboot goes to one of them, however their asks interleave."""
    import threading
    import time as _time
    from agent.screen import reboots
    real = reboots.atomic_write

    def slow_write(*args, **kw):   # the card's write: where the two would pass each other
        _time.sleep(0.2)
        return real(*args, **kw)
    monkeypatch.setattr(reboots, "atomic_write", slow_write)
    book = RebootBook(str(tmp_path), 1, synced=lambda: True)
    answers = []
    threads = [threading.Thread(target=lambda w=why: answers.append(book.take(w)[0]))
               for why in ("screen: picture black", "network: no-carrier")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(answers) == [False, True]
    assert RebootBook(str(tmp_path), 1, synced=lambda: True).left() == 0


def test_a_restart_of_the_agent_climbs_on_from_the_next_rung_never_from_the_first(tmp_path):
    """A watchdog's restart in the middle of an outage: the new process reads the episode
    from the runtime directory (tmpfs) and, the cause still there, restarts the manager;
    it does not bounce again. A damaged file is said once and the healer starts afresh."""
    clock = Clock()
    net = FakeNet(NO_CARRIER)
    first = NetworkHeal(N.Healer(POLICY), net, lambda e: None, clock=clock,
                        runtime_dir=str(tmp_path))
    first.restore_kept()
    first.link_changed({"state": "waiting", "reason": R.CONNECT_TIMEOUT, "proven_live": False})
    while not net.done:
        clock.t = max(first.step() or 0, clock.t + 1.0)
    assert net.done == [("bounce", "systemd-networkd", "eth0")]
    assert (tmp_path / "network-heal.json").stat().st_mode & 0o777 == 0o600
    second = NetworkHeal(N.Healer(POLICY), net, lambda e: None, clock=clock,
                         runtime_dir=str(tmp_path))
    second.restore_kept()
    assert second.snapshot()["tried"] == ["bounce"] and second.snapshot()["state"] == N.HELD
    second.link_changed({"state": "waiting", "reason": R.CONNECT_TIMEOUT, "proven_live": False})
    began = clock.t
    while len(net.done) < 2:
        clock.t = max(second.step() or 0, clock.t + 1.0)
    assert net.done[1] == ("restart", "systemd-networkd") and clock.t - began <= 70.0
    second.link_changed({"state": "online", "reason": None, "proven_live": True})
    second.step()
    third = NetworkHeal(N.Healer(POLICY), net, lambda e: None, clock=clock,
                        runtime_dir=str(tmp_path))
    third.restore_kept()
    assert third.snapshot()["tried"] == [] and third.healer.budgets[N.BOUNCE].times
    for damaged in (b"[1, 2", b'{"tried": ["rm -rf"]}', b'{"tried": "bounce"}', b"7"):
        (tmp_path / "network-heal.json").write_bytes(damaged)
        fresh = NetworkHeal(N.Healer(POLICY), net, lambda e: None, clock=clock,
                            runtime_dir=str(tmp_path))
        fresh.restore_kept()
        assert fresh.snapshot()["tried"] == [] and fresh.healer.state == N.WATCHING


def test_the_healers_thread_is_allowed_its_longest_wait_between_two_turns():
    """heal_probe_s may be 300 s: the watchdog gate must not take that wait for a stall."""
    slow = N.Policy(enabled=True, probe_s=300.0, confirm_s=60, wait_s=120, reboot=False)
    heal = NetworkHeal(N.Healer(slow), FakeNet(NO_CARRIER), lambda e: None, clock=Clock())
    assert heal.loop.max_silence_s > 300.0 + 60.0
