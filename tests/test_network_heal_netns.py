"""The network's healer on the real kernel (#53): a device namespace with a veth to a
gateway namespace the test makes (devtools/netns.py), faults that are real (the peer's
link down, nftables DROP), the probe's reads real (sysfs, rtnetlink), the healer's core and
shell driven on a fake clock. What manages the interface is told by a networkd link file
the test writes, and the manager's acts are recorded, not run: the booted tier is where
networkctl goes through polkit (tests/test_booted_systemd.py).

- the peer's carrier drops: told device-side (no carrier) and the bounce is asked;
- the gateway blackholes (an arp DROP on the peer): its neighbour entry goes FAILED, told
  device-side (gateway-silent), the bounce asked;
- a DHCP server that stops answering (busybox's udhcpd and udhcpc, a lease of seconds):
  once the lease runs out and the client takes the address away, told device-side (no
  address), the bounce asked;
- the server beyond a gateway that answers is dropped (a WAN outage): told upstream, and
  nothing is done in ten simulated minutes (the core holds it for a day: test_network_heal.py).
"""
import contextlib
import os
import socket
import subprocess
import time

import pytest

from agent.base import reasons as R
from agent.device import network as N
from agent.device.heal import NetworkHeal
from agent.device.netprobe import NETWORKD, NetProbe
from devtools.netns import NetNS

GW, ME, SERVER = "10.77.0.1", "10.77.0.2", "198.51.100.1"
POLICY = N.Policy(enabled=True, probe_s=10.0, confirm_s=20.0, wait_s=30.0, reboot=False)


def sh(*argv, ns=None):
    argv = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=20)


@contextlib.contextmanager
def gateway(tmp_path):
    """In this thread's namespace: a gateway's namespace, a veth between them, a default
    route through the gateway and a "server" address on the gateway's side."""
    gw = f"edgegw{os.getpid()}"
    subprocess.run(["ip", "netns", "add", gw], check=True, timeout=20)
    try:
        sh("ip", "link", "add", "eh0", "type", "veth", "peer", "name", "gw0", "netns", gw)
        sh("ip", "addr", "add", f"{ME}/24", "dev", "eh0")
        sh("ip", "link", "set", "eh0", "up")
        sh("ip", "link", "set", "lo", "up", ns=gw)
        sh("ip", "addr", "add", f"{GW}/24", "dev", "gw0", ns=gw)
        sh("ip", "addr", "add", f"{SERVER}/32", "dev", "lo", ns=gw)
        sh("ip", "link", "set", "gw0", "up", ns=gw)
        sh("ip", "route", "add", "default", "via", GW, "dev", "eh0")
        # /sys shows the namespace of whoever mounted it: a sysfs mounted from here
        # shows this one's interfaces, as the agent's own /sys shows its
        sysfs = tmp_path / "sys"
        sysfs.mkdir()
        sh("mount", "-t", "sysfs", "sysfs", str(sysfs))
        # what manages eh0: networkd, as its link file says (the test's own)
        links = tmp_path / "netif-links"
        links.mkdir()
        index = (sysfs / "class/net/eh0/ifindex").read_text().strip()
        (links / index).write_text("# networkd\nADMIN_STATE=configured\nOPER_STATE=routable\n")
        yield gw, links, str(sysfs)
    finally:
        subprocess.run(["umount", str(tmp_path / "sys")], timeout=20, capture_output=True)
        subprocess.run(["ip", "netns", "del", gw], timeout=20)


@pytest.fixture
def site(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("network namespaces need root")
    with NetNS() as ns, gateway(tmp_path) as (gw, links, sysfs):
        yield ns, gw, links, sysfs


def blackhole_arp(gw):
    """The gateway answers nothing at the neighbour level: ARP dropped on its side."""
    subprocess.run(["ip", "netns", "exec", gw, "nft", "-f", "-"], check=True, text=True,
                   input="add table arp edgetest\n"
                         "add chain arp edgetest in { type filter hook input priority 0; "
                         "policy drop; }\n", timeout=20)


class Recorder:
    """The probe's programs (the manager's acts): recorded and answered done."""

    def __init__(self):
        self.acts = []

    def __call__(self, argv, timeout_s):
        self.acts.append(list(argv))
        return 0, b""


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def drive(probe: NetProbe, reason: str, seconds: float, fault_settles=None):
    """The shell's turns on a fake clock, the probes real: every event it publishes."""
    clock, events = Clock(), []
    heal = NetworkHeal(N.Healer(POLICY), probe, events.append, clock=clock, wall=time.time)
    heal.link_changed({"state": "waiting", "reason": reason, "proven_live": False})
    end = clock.t + seconds
    while clock.t < end:
        wake = heal.step()
        if fault_settles is not None:
            fault_settles()
        clock.t = max(clock.t + 1.0, wake if wake is not None else end)
    return heal, events


def connect_fails(host, port=443, timeout=1.0):
    with socket.socket() as s:
        s.settimeout(timeout)
        try:
            s.connect((host, port))
        except OSError as e:
            return e
    return None


def test_a_veth_whose_peer_drops_its_carrier_is_told_device_side_and_bounced(site):
    _, gw, links, sysfs = site
    rec = Recorder()
    probe = NetProbe(sysfs, run_=rec, networkd_dir=str(links))
    assert probe.probe().carrier is True
    sh("ip", "link", "set", "gw0", "down", ns=gw)
    seen = probe.probe()
    assert (seen.interface, seen.carrier, seen.manager) == ("eh0", False, NETWORKD)
    assert N.cause(seen, None) == N.NO_CARRIER
    heal, events = drive(probe, R.CONNECT_TIMEOUT, 40.0)
    assert rec.acts == [["networkctl", "reconfigure", "eh0"]]
    assert events[0].type == N.EVENT and events[0].details["cause"] == N.NO_CARRIER
    assert events[0].details["rung"] == N.BOUNCE


def test_a_gateway_that_blackholes_is_told_device_side_by_its_failed_neighbour(site):
    _, gw, links, sysfs = site
    blackhole_arp(gw)
    sh("ip", "neigh", "flush", "dev", "eh0")
    rec = Recorder()
    probe = NetProbe(sysfs, run_=rec, networkd_dir=str(links))
    assert isinstance(connect_fails(SERVER), OSError)   # the link's own attempt
    deadline = time.monotonic() + 15
    while probe.probe().neighbour != "FAILED":   # the kernel gives up on it in ~3 s
        assert time.monotonic() < deadline, "the gateway's entry never went FAILED"
        time.sleep(0.5)
    seen = probe.probe()
    assert (seen.carrier, seen.address, seen.neighbour) == (True, True, "FAILED")
    # the probes' own nudges keep the entry FAILED while the fault lasts
    heal, events = drive(probe, R.CONNECT_TIMEOUT, 40.0,
                         fault_settles=lambda: time.sleep(0.3))
    assert [e.details["cause"] for e in events] == [N.GATEWAY_SILENT]
    assert rec.acts == [["networkctl", "reconfigure", "eh0"]]


def test_an_upstream_drop_beyond_a_gateway_that_answers_is_told_upstream_and_left(site):
    ns, gw, links, sysfs = site
    subprocess.run(["ip", "netns", "exec", gw, "nft", "-f", "-"], check=True, text=True,
                   input="add table inet edgetest\n"
                         "add chain inet edgetest in { type filter hook input priority 0; }\n"
                         f"add rule inet edgetest in ip daddr {SERVER} tcp dport 443 drop\n",
                   timeout=20)
    rec = Recorder()
    probe = NetProbe(sysfs, run_=rec, networkd_dir=str(links))

    def attempt():   # the link's attempts go on meanwhile, each a connect-timeout
        assert isinstance(connect_fails(SERVER, timeout=0.1), socket.timeout)
    attempt()
    seen = probe.probe()
    assert seen.neighbour in ("REACHABLE", "STALE", "DELAY", "PROBE") and seen.carrier
    heal, events = drive(probe, R.CONNECT_TIMEOUT, 600.0, fault_settles=attempt)
    assert events == [] and rec.acts == []
    assert heal.healer.cause == N.UPSTREAM and heal.healer.tried == []


@pytest.mark.netns
def test_a_real_agent_heals_only_with_its_key_on_and_tells_the_fleet(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """The agent itself, wired: [device] heal_network on, its server on loopback, its
    default route through a gateway that stops answering ARP, then the server's port
    dropped (the link down: ack-timeout, connect-timeout). It probes, finds the gateway
    silent, and with no manager of the interface known on this machine and no reboot
    allowed, passes every rung over and says it is exhausted: the fleet hears
    network.healing once the link is back, the status says it meanwhile."""
    from devtools.harness import agent_config, wait_for
    with gateway(tmp_path) as (gw, links, sysfs):
        server = fleet()
        cfg = agent_config(server, tmp_path, debug={"sysfs_root": sysfs},
                           device={"heal_network": True, "heal_probe_s": 2.0,
                                   "heal_confirm_s": 10.0, "heal_wait_s": 30.0})
        agent = spawn_agent(agent_python, cfg)
        agent.wait_live(15)
        assert agent.status()["network"]["state"] == "watching"
        blackhole_arp(gw)
        sh("ip", "neigh", "flush", "dev", "eh0")
        netns.drop_port(server.port)
        began = time.monotonic()
        network = wait_for(lambda: (agent.status().get("network") or {}).get("state")
                           == "exhausted" and agent.status()["network"], 40,
                           what="the healer to climb and be exhausted")
        took = time.monotonic() - began
        assert network["cause"] == N.GATEWAY_SILENT and network["interface"] == "eh0"
        assert network["gateway"] in ("FAILED", "INCOMPLETE")
        netns.restore()
        agent.wait_live(20)
        said = wait_for(lambda: [e for e in server.device().get("events", [])
                                 if e.get("type") == N.EVENT], 20, what="network.healing")
        assert said[0]["outcome"] == "exhausted" and said[0]["cause"] == N.GATEWAY_SILENT
        assert any("no manager" in p for p in said[0]["passed_over"]), said
        assert any(p.startswith("reboot: not allowed") for p in said[0]["passed_over"])
        print(f"gateway-silent told and the ladder exhausted {took:.1f}s after the drop")
        assert agent.stop() == 0
        log = agent.log_text()
        assert "Traceback" not in log and "network: " in log


def test_the_netlink_reads_say_what_ip_says(site):
    """The healer reads rtnetlink itself (`ip` is stopped by the unit's sandbox):
    iproute2's JSON is the reference it is held to, on the same kernel tables."""
    import json
    from agent.device import netlink
    _, gw, _, _ = site
    sh("ip", "route", "add", "203.0.113.0/24", "via", GW, "dev", "eh0")   # not a default
    connect_fails(SERVER, timeout=0.3)   # the gateway resolved: an entry to compare
    ip = lambda *a: json.loads(subprocess.run(["ip", "-j", *a], capture_output=True,  # noqa
                                              check=True, timeout=20).stdout)
    index = socket.if_nametoindex("eh0")
    assert netlink.default_routes() == [(index, r["gateway"], r.get("metric", 0))
                                        for r in ip("-4", "route", "show", "default")]
    assert netlink.global_address(index) is True
    assert netlink.global_address(socket.if_nametoindex("lo")) is False
    want = ip("neigh", "show", "dev", "eh0", "to", GW)
    assert netlink.neighbour(index, GW) == (want[0]["state"][0] if want else None)
    assert netlink.neighbour(index, "10.77.0.99") is None
    sh("ip", "route", "del", "default")
    assert netlink.default_routes() == []


DHCP_SCRIPT = """#!/bin/sh
# udhcpc's script (busybox's udhcpc(8) contract): the lease applied, and removed once lost
case "$1" in
  deconfig) ip -4 addr flush dev "$interface" ;;
  bound|renew) ip addr replace "$ip/$mask" dev "$interface"
               ip route replace default via "$router" dev "$interface" ;;
esac
echo "$1 ${ip:-} ${lease:-}" >> "$0.said"
"""


def said(script):
    with contextlib.suppress(FileNotFoundError):
        return script.with_name(script.name + ".said").read_text().split("\n")[:-1]
    return []


def test_a_dhcp_server_that_stops_answering_is_told_device_side_once_the_lease_expires(
        site, tmp_path):
    """Real DHCP on both sides (busybox's udhcpd in the gateway's namespace with a lease of
    seconds, udhcpc on the device with a script that applies the lease and removes it once
    lost): while the server answers, the probe sees nothing device-side; once it is
    killed, renewals go unanswered, the lease runs out, the client takes the address (and
    the default route with it) away: told no-address, and the bounce (a renew) asked."""
    _, gw, links, sysfs = site
    # the device's IPv4 address is the lease's now (its IPv6 link-local stays, as on a
    # real device: not a lease, not a global address)
    sh("ip", "-4", "addr", "flush", "dev", "eh0")
    conf = tmp_path / "udhcpd.conf"
    conf.write_text(f"start 10.77.0.10\nend 10.77.0.20\ninterface gw0\nmax_leases 10\n"
                    f"lease_file {tmp_path}/udhcpd.leases\npidfile {tmp_path}/udhcpd.pid\n"
                    f"min_lease 1\noption subnet 255.255.255.0\noption router {GW}\n"
                    f"option lease 4\n")
    script = tmp_path / "udhcpc.sh"
    script.write_text(DHCP_SCRIPT)
    script.chmod(0o755)
    server = subprocess.Popen(["ip", "netns", "exec", gw, "busybox", "udhcpd", "-f",
                               str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = subprocess.Popen(["busybox", "udhcpc", "-f", "-i", "eh0", "-s", str(script),
                               "-t", "100", "-T", "1", "-A", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        rec = Recorder()
        probe = NetProbe(sysfs, run_=rec, networkd_dir=str(links))
        deadline = time.monotonic() + 15
        while not any(x.startswith("bound ") for x in said(script)):
            assert time.monotonic() < deadline, f"no lease: {said(script)}"
            time.sleep(0.2)
        lease = int(next(x for x in said(script) if x.startswith("bound ")).split()[2])
        seen = probe.probe()
        assert (seen.interface, seen.route, seen.carrier, seen.address) == (
            "eh0", True, True, True), seen
        assert N.cause(seen, None, R.CONNECT_TIMEOUT) == N.UPSTREAM
        server.kill()
        server.wait(10)
        killed = time.monotonic()
        # udhcpc floors a short lease (a 4 s grant is lost ~19 s after the kill, measured)
        deadline = killed + 2 * max(lease, 16) + 5
        while said(script)[-1].split()[0] != "deconfig":
            assert time.monotonic() < deadline, f"the lease never ran out: {said(script)}"
            time.sleep(0.2)
        lost = time.monotonic() - killed
        seen = probe.probe()
        assert (seen.interface, seen.route, seen.carrier, seen.address) == (
            "eh0", False, True, False), seen
        assert N.cause(seen, None, R.NETWORK_UNREACHABLE) == N.NO_ADDRESS
        # what the probe passed over: the link-local address the interface still has
        assert subprocess.run(["ip", "-6", "addr", "show", "dev", "eh0", "scope", "link"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        assert R.NETWORK_UNREACHABLE in R.SILENT_PATH
        heal, events = drive(probe, R.NETWORK_UNREACHABLE, 40.0)
        assert [e.details["cause"] for e in events] == [N.NO_ADDRESS]
        assert events[0].details["rung"] == N.BOUNCE
        assert rec.acts == [["networkctl", "reconfigure", "eh0"]]
        print(f"a {lease} s lease granted: the address gone {lost:.1f}s after the server "
              "was killed")
    finally:
        for child in (server, client):
            if child.poll() is None:
                child.kill()
            child.wait(10)
