"""The one rtnetlink reader (agent/base/netlink.py) on the real kernel, in a private network
namespace (the `netns` fixture): a dump is bounded in bytes (4 MiB), a table past it is
refused with a clean stop (the socket closed, a NetlinkError, an OSError), and every reader
of the kernel's tables (the healer's, the inventory's, the events') goes through it."""
import json
import os
import socket
import struct
import subprocess

import pytest

from agent.base import netlink

RTM_GETROUTE = 26
ROUTES = 90_000      # about 52 bytes each on the wire: 4.7 MB, past the 4 MiB bound


def _routes(n: int, start: int = 0) -> None:
    script = "".join(f"route add 10.{i >> 16}.{i >> 8 & 255}.{i & 255}/32 dev lo\n"
                     for i in range(start, start + n))
    subprocess.run(["ip", "-batch", "-"], input=script, text=True, check=True, timeout=60)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Counted:
    """socket.socket's recv, counted: what a reader took from the kernel."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        real = socket.socket.recv

        def recv(sock, *a, **kw):
            data = real(sock, *a, **kw)
            if sock.family == socket.AF_NETLINK:
                self.bytes += len(data)
            return data
        monkeypatch.setattr(socket.socket, "recv", recv)


def test_a_dump_says_what_ip_says_and_a_table_past_4_mib_stops_cleanly(netns):
    _routes(1000)
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)
    found = netlink.dump(RTM_GETROUTE, body)
    ip = json.loads(subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"],
                                   capture_output=True, check=True, timeout=20).stdout)
    assert len(found) == len(ip) >= 1000
    assert {kind for kind, _ in found} == {24}    # RTM_NEWROUTE
    assert netlink.MAX_BYTES == 4 << 20
    _routes(ROUTES, start=1000)
    before = _open_fds()
    with pytest.raises(netlink.NetlinkError, match=f"past {4 << 20} bytes") as refused:
        netlink.dump(RTM_GETROUTE, body)
    assert isinstance(refused.value, OSError), "a caller's `no netlink here` covers it"
    assert _open_fds() == before, "the socket is closed"


def test_the_inventory_reads_through_the_bound_and_says_no_network(netns, monkeypatch):
    """The inventory read its dumps without a bound: a huge route table was read whole."""
    from agent.inventory import collect
    _routes(ROUTES)
    counted = Counted(monkeypatch)
    assert collect._network("/sys", "/proc", lambda argv: None) == {
        "interfaces": [], "gateway": {}}
    assert 0 < counted.bytes <= netlink.MAX_BYTES + (1 << 16)


def test_the_events_links_are_what_ip_says(netns):
    from agent.events.watcher import rtnetlink_links
    subprocess.run(["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                   check=True, timeout=20)
    subprocess.run(["ip", "link", "set", "v0", "up"], check=True, timeout=20)
    ip = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                   check=True, timeout=20).stdout)
    assert set(rtnetlink_links()) == {link["ifname"] for link in ip} == {"lo", "v0", "v1"}
    assert rtnetlink_links()["v1"] == ("down", "0")
    assert rtnetlink_links()["lo"][0] == "up"
