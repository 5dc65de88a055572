"""The kernel's routes, addresses and neighbours, read over rtnetlink: the network healer's
reads (netprobe.py), without a program.

Why not iproute2's ``ip -j``: under the unit's sandbox (``SystemCallFilter=~@privileged``)
``ip`` exits 255 before it reads anything (it drops capabilities it does not have, and
capset is refused), and a minimal image has no iproute2 at all. A netlink socket is what
``ip`` would have opened (``RestrictAddressFamilies=`` allows AF_NETLINK): one dump per
read, bounded in time and in bytes by the agent's one reader of rtnetlink
(base/netlink.py); what the healer asks of each table is said here.
"""
from __future__ import annotations

import socket
import struct

from ..base.netlink import TIMEOUT_S, NetlinkError, attributes, dump

__all__ = ["NetlinkError", "default_routes", "global_address", "neighbour"]

RTM_GETADDR, RTM_GETROUTE, RTM_GETNEIGH = 22, 26, 30
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15
NDA_DST = 1
RT_TABLE_MAIN, RTN_UNICAST, RT_SCOPE_UNIVERSE = 254, 1, 0
# the kernel's neighbour states (include/uapi/linux/neighbour.h), as ip-neighbour(8) says them
NUD = {0x01: "INCOMPLETE", 0x02: "REACHABLE", 0x04: "STALE", 0x08: "DELAY", 0x10: "PROBE",
       0x20: "FAILED", 0x40: "NOARP", 0x80: "PERMANENT"}


def default_routes(timeout_s: float = TIMEOUT_S) -> list[tuple[int, str | None, int]]:
    """(interface index, gateway or None, metric) of each IPv4 default route of the main
    table."""
    out = []
    for _, m in dump(RTM_GETROUTE, struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 0, 0,
                                               0, 0, 0), timeout_s):
        if len(m) < 12:
            continue
        family, dst_len, _, _, table, _, _, rtype, _ = struct.unpack_from("=BBBBBBBBI", m)
        attrs = attributes(m, 12)
        table = int.from_bytes(attrs[RTA_TABLE][:4], "little") if \
            len(attrs.get(RTA_TABLE, b"")) >= 4 else table
        oif = attrs.get(RTA_OIF, b"")
        if (family != socket.AF_INET or dst_len != 0 or RTA_DST in attrs
                or table != RT_TABLE_MAIN or rtype != RTN_UNICAST or len(oif) < 4):
            continue
        gateway = attrs.get(RTA_GATEWAY, b"")
        metric = attrs.get(RTA_PRIORITY, b"")
        out.append((int.from_bytes(oif[:4], "little"),
                    socket.inet_ntoa(gateway) if len(gateway) == 4 else None,
                    int.from_bytes(metric[:4], "little") if len(metric) >= 4 else 0))
    return out


def global_address(index: int, timeout_s: float = TIMEOUT_S) -> bool:
    """The interface has an address of global scope (IPv4 or IPv6): a lease, a static."""
    for _, m in dump(RTM_GETADDR, struct.pack("=BBBBI", socket.AF_UNSPEC, 0, 0, 0, 0),
                     timeout_s):
        if len(m) >= 8:
            _, _, _, scope, ifindex = struct.unpack_from("=BBBBI", m)
            if ifindex == index and scope == RT_SCOPE_UNIVERSE:
                return True
    return False


def neighbour(index: int, address: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """The kernel's state of ``address``'s IPv4 neighbour entry on the interface, as
    ip-neighbour(8) names it, or None: no entry."""
    want = socket.inet_aton(address)
    for _, m in dump(RTM_GETNEIGH, struct.pack("=BBHiHBB", socket.AF_INET, 0, 0, 0, 0, 0,
                                               0), timeout_s):
        if len(m) < 12:
            continue
        _, _, _, ifindex, state, _, _ = struct.unpack_from("=BBHiHBB", m)
        if ifindex == index and attributes(m, 12).get(NDA_DST) == want:
            return next((name for bit, name in NUD.items() if state & bit), None)
    return None
