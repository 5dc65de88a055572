"""What the kernel says of the device's own network, and who manages it: the network
healer's reads and acts (its core is network.py).

Reads: the kernel's routes, addresses and neighbours over rtnetlink (netlink.py: what
``ip -j`` would print, without the program, which the unit's sandbox stops), each
bounded in time and bytes, and sysfs (``/sys/class/net/IF/carrier``, ``operstate``,
``statistics``). Where the gateway has no neighbour entry, or only a stale one, one empty
UDP datagram to its discard port makes the kernel ask it again: the next probe reads the
answer (FAILED when it gives none).

The manager: systemd-networkd where its link file (/run/systemd/netif/links/INDEX) says
it manages the interface, NetworkManager where ``nmcli -t`` lists it managed, ifupdown
where /run/network/ifstate names it. Acts go through polkit (systemd/50-edge-agent.rules,
granted only while ``[device] heal_network`` is on: agent/programs/grants.py): networkd's
``networkctl reconfigure``, NetworkManager's ``nmcli device connect``, ifupdown's
``ifup@IF.service`` restarted by systemd; the manager's restart through systemd. Nothing
here runs without the healer's core asking for it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
from typing import Callable

from ..base import children, sysfs
from . import netlink
from .netlink import NetlinkError
from .network import NEIGH_UNKNOWN, Probe

log = logging.getLogger("edge_agent.device")

RUN_TIMEOUT_S = 5.0          # an `nmcli -t` read
ACT_TIMEOUT_S = 60.0         # a bounce or a manager's restart
MAX_OUTPUT = 64 * 1024       # what a read keeps
MAX_DRAIN = 1 << 20
DISCARD_PORT = 9
IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")    # the kernel's IFNAMSIZ, no path, no space
MAX_IFACES = 32              # ifupdown's interfaces that root's grant names, at most
NETWORKD, NETWORKMANAGER, IFUPDOWN = "systemd-networkd", "NetworkManager", "ifupdown"
MANAGER_UNITS = {NETWORKD: "systemd-networkd.service",
                 NETWORKMANAGER: "NetworkManager.service", IFUPDOWN: "networking.service"}

Run = Callable[[list, float], "tuple[int | None, bytes]"]


def run(argv: list, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int | None, bytes]:
    """(exit status or None, the first MAX_OUTPUT bytes of stdout and stderr)."""
    try:
        child = children.spawn([str(a) for a in argv], merge_stderr=True)
    except OSError as e:
        return None, children.failure(argv, error=e).encode()
    got = children.collect(child, timeout_s, MAX_OUTPUT, MAX_DRAIN)
    if got.exit is None:
        return None, children.failure(argv, timeout_s=timeout_s).encode()
    return got.exit, got.output


def _lines(path: str) -> list[str]:
    """The lines of a small state file (at most sysfs.READ_LIMIT bytes), cleaned."""
    return [sysfs.clean(x, 200) for x in
            sysfs.read(path).decode("utf-8", "replace").splitlines()]


class NetProbe:
    def __init__(self, sysfs_root: str = "/sys", *, run_: Run = run,
                 networkd_dir: str = "/run/systemd/netif/links",
                 ifstate: str = "/run/network/ifstate", nudge: bool = True, nl=netlink):
        self.net = os.path.join(sysfs_root, "class", "net")
        self.run, self.networkd_dir, self.ifstate = run_, networkd_dir, ifstate
        self.nudge, self.nl = nudge, nl
        self.last_interface: str | None = None
        self._told_blind = False

    # -- the probe -------------------------------------------------------------------
    def probe(self) -> Probe:
        try:
            routes = self.nl.default_routes()
            route = min(routes, key=lambda r: r[2]) if routes else None
            interface = socket.if_indextoname(route[0]) if route else self.last_interface
        except (NetlinkError, OSError) as e:   # nothing is known, nothing is proven
            if not self._told_blind:
                log.warning("network: the kernel's routes could not be read (%s): the "
                            "network's healer sees nothing and does nothing", e)
            self._told_blind = True
            return Probe(self.last_interface, known=False)
        self._told_blind = False
        if route:
            self.last_interface = interface
        if interface is None:
            return Probe(None, route=False, manager=self.manager(None))
        stats = self._stats(interface)
        neighbour = self.neighbour(interface, route[1]) if route and route[1] else None
        return Probe(interface, route=route is not None, carrier=self.carrier(interface),
                     address=self.address(interface), neighbour=neighbour,
                     rx_packets=stats[0], tx_packets=stats[1],
                     manager=self.manager(interface))

    def carrier(self, interface: str) -> bool | None:
        """True with carrier, False without (or the interface down), None: not told."""
        base = os.path.join(self.net, interface)
        value = sysfs.text(os.path.join(base, "carrier"))
        if value in ("0", "1"):
            return value == "1"
        # an interface that is down has no carrier to read (EINVAL)
        if sysfs.text(os.path.join(base, "operstate")) in ("down", "lowerlayerdown"):
            return False
        return None

    def _stats(self, interface: str) -> tuple[int | None, int | None]:
        return tuple(sysfs.as_int(sysfs.text(os.path.join(
            self.net, interface, "statistics", name))) for name in ("rx_packets", "tx_packets"))

    def address(self, interface: str) -> bool | None:
        try:
            return self.nl.global_address(socket.if_nametoindex(interface))
        except (NetlinkError, OSError):
            return None

    def neighbour(self, interface: str, gateway: str) -> str | None:
        """The gateway's neighbour state, None where the kernel has no entry, NEIGH_UNKNOWN
        where its table could not be read (which proves nothing, not even "no entry")."""
        try:
            state = self.nl.neighbour(socket.if_nametoindex(interface), gateway)
        except (NetlinkError, OSError, ValueError):
            return NEIGH_UNKNOWN
        if self.nudge and state in (None, "STALE"):
            with contextlib.suppress(OSError, ValueError):
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(b"", (gateway, DISCARD_PORT))
        return state

    # -- the manager -----------------------------------------------------------------
    def manager(self, interface: str | None) -> str | None:
        """Which of the three manages ``interface`` (None: the one running at all)."""
        if self._networkd(interface):
            return NETWORKD
        if self._networkmanager(interface):
            return NETWORKMANAGER
        if self._ifupdown(interface):
            return IFUPDOWN
        return None

    def _networkd(self, interface: str | None) -> bool:
        """networkd's own file of the link (of any link, for no interface) says it
        manages it: its directory alone is the package's, networkd may not run."""
        if interface is None:
            try:
                names = sorted(os.listdir(self.networkd_dir))[:64]
            except OSError:
                return False
        else:
            index = sysfs.as_int(sysfs.text(os.path.join(self.net, interface, "ifindex")))
            names = [str(index)] if index is not None else []
        return any(x.startswith("ADMIN_STATE=") and x != "ADMIN_STATE=unmanaged"
                   for name in names if name.isdigit()
                   for x in _lines(os.path.join(self.networkd_dir, name)))

    def _networkmanager(self, interface: str | None) -> bool:
        if shutil.which("nmcli") is None:
            return False
        code, out = self.run(["nmcli", "-t", "-f", "DEVICE,STATE", "device"], RUN_TIMEOUT_S)
        if code != 0:
            return False
        for line in out.decode(errors="replace").splitlines():
            name, _, state = line.partition(":")
            if (interface is None or name == interface) and state not in ("unmanaged", ""):
                return True
        return False

    def _ifupdown(self, interface: str | None) -> bool:
        names = self._ifupdown_names()
        return bool(names) if interface is None else interface in names

    def _ifupdown_names(self) -> list[str]:
        return [line.split("=")[0] for line in _lines(self.ifstate) if "=" in line]

    def managing(self) -> tuple[str, tuple[str, ...]] | None:
        """What manages this device's network, for root's grant of the healer's acts
        (agent/programs/grants.py): the manager of the default route's interface, else
        the one managing any; for ifupdown with the interfaces it has brought up (plain
        names, never lo, at most MAX_IFACES). None: no manager known. Safe for root: it
        reads the kernel's routes, sysfs and the managers' own state in /run (root's,
        networkd's) and asks NetworkManager through nmcli, never a file the agent's
        user can write."""
        try:
            routes = self.nl.default_routes()
            interface = (socket.if_indextoname(min(routes, key=lambda r: r[2])[0])
                         if routes else None)
        except (NetlinkError, OSError):
            interface = None
        manager = (self.manager(interface) if interface else None) or self.manager(None)
        if manager is None:
            return None
        names = () if manager != IFUPDOWN else tuple(dict.fromkeys(
            x for x in self._ifupdown_names() if x != "lo" and IFNAME.fullmatch(x)))
        return manager, names[:MAX_IFACES]

    # -- acts ------------------------------------------------------------------------
    def bounce(self, manager: str, interface: str) -> tuple[bool, str]:
        if not IFNAME.fullmatch(interface or ""):
            return False, "no interface to bounce"
        argv = {NETWORKD: ["networkctl", "reconfigure", interface],
                NETWORKMANAGER: ["nmcli", "-w", "45", "device", "connect", interface],
                IFUPDOWN: ["systemctl", "restart", f"ifup@{interface}.service"]}.get(manager)
        return self._act(argv, f"{interface} bounced through {manager}")

    def restart_manager(self, manager: str) -> tuple[bool, str]:
        unit = MANAGER_UNITS.get(manager)
        return self._act(["systemctl", "restart", unit] if unit else None,
                         f"{unit} restarted")

    def _act(self, argv: list | None, done: str) -> tuple[bool, str]:
        if argv is None:
            return False, "no manager of the interface is known"
        code, out = self.run(argv, ACT_TIMEOUT_S)
        if code == 0:
            return True, done
        said = out.decode(errors="replace").strip().splitlines()
        if code is None:
            return False, said[-1][:200] if said else f"{children.program(argv)} failed"
        return False, children.failure(argv, exited=code) + (
            f": {sysfs.clean(said[-1], 200)}" if said else "")
