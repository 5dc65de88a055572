"""What the device is made of (network, OS, kernel, board, displays, storage) as one
JSON-ready dict, sent to the fleet server at registration and whenever its digest changes.

Facts come from sysfs, procfs, /etc and rtnetlink, plus `iw` for the SSID (the kernel
tells it only over nl80211). Every read is bounded and cleaned, since a failing card or
an odd monitor can put anything there; a fact that is not there is absent or empty,
never an error, so a container or a board without display or Wi-Fi is inventoried too.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import time
from typing import Callable

from ..base import netlink, sysfs

Runner = Callable[[list[str]], str | None]

READ_LIMIT = sysfs.READ_LIMIT
CPUINFO_LIMIT = 16384      # the Revision line comes last, after one block per core
TEXT_LIMIT = sysfs.TEXT_LIMIT
OUTPUT_LIMIT = 16384
EDID_HEADER = bytes.fromhex("00ffffffffffff00")
EDID_DESCRIPTORS = (54, 72, 90, 108)
# stricter than the kernel's rule: a name that could read as an option, or walk a path,
# is never put on a command line or under /sys
IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
# whole disks: not partitions, eMMC boot areas (mmcblk0boot0), loop, ram or zram
DISK = re.compile(r"mmcblk\d+|sd[a-z]{1,3}|nvme\d+n\d+")
PRE_EOL = sysfs.PRE_EOL
# moves on its own every few seconds: left out of the digest, so it never makes a change
VOLATILE = frozenset({"signal_dbm"})

RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = range(16, 28, 2)
IFF_UP, IFF_LOWER_UP, IFLA_ADDRESS, IFLA_IFNAME = 0x1, 0x10000, 1, 3
IFA_ADDRESS, IFA_LOCAL, IFA_F_TEMPORARY = 1, 2, 0x01
RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE, RT_TABLE_MAIN, RTN_UNICAST = 4, 5, 6, 15, 254, 1
IFINFOMSG = struct.Struct("=BxHiII")
IFADDRMSG, RTMSG = struct.Struct("=BBBBI"), struct.Struct("=BBBBBBBBI")
ADDRESS_BYTES = {socket.AF_INET: 4, socket.AF_INET6: 16}


def run_command(argv: list[str]) -> str | None:
    """The default runner: argv as it is (no shell), 3 s at most, stdout or None."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=3, check=False)
    except (OSError, subprocess.SubprocessError):   # not installed, not allowed, timed out
        return None
    return done.stdout[:OUTPUT_LIMIT].decode("utf-8", "replace") if done.returncode == 0 else None


_read, _clean, _text = sysfs.read, sysfs.clean, sysfs.text


def _lines(path: str, limit: int = READ_LIMIT) -> list[str]:
    """The lines within the bound; one the bound cut is not a fact and is left out."""
    data = _read(path, limit + 1)
    lines = data[:limit].decode("utf-8", "replace").splitlines()
    return lines[:-1] if len(data) > limit else lines


_int, _hex, _life_time = sysfs.as_int, sysfs.as_hex_byte, sysfs.life_time


def _present(facts: dict) -> dict:
    """Without the facts that were not there (False and 0 are facts)."""
    return {key: value for key, value in facts.items() if value not in ("", None)}


def _glob(root: str, pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(root), pattern)))


# -- network: rtnetlink, not sysfs, which shows the namespace that mounted it -------------
def _netlink_interfaces() -> dict[int, dict]:
    """Every link by index, ``lo`` included: name, MAC, up/down, carrier, addresses."""
    links = {}
    for kind, payload in netlink.dump(RTM_GETLINK, IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        if kind != RTM_NEWLINK or len(payload) < IFINFOMSG.size:
            continue
        _, _, index, flags, _ = IFINFOMSG.unpack_from(payload)
        attrs = netlink.attributes(payload, IFINFOMSG.size)
        name = attrs.get(IFLA_IFNAME, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
        if not name:
            continue
        links[index] = link = {"name": name, "state": "up" if flags & IFF_UP else "down",
                               "carrier": bool(flags & IFF_LOWER_UP), "addresses": []}
        if attrs.get(IFLA_ADDRESS):
            link["mac"] = attrs[IFLA_ADDRESS].hex(":")
    for kind, payload in netlink.dump(RTM_GETADDR, IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        if kind != RTM_NEWADDR or len(payload) < IFADDRMSG.size:
            continue
        family, prefix, flags, _, index = IFADDRMSG.unpack_from(payload)
        attrs = netlink.attributes(payload, IFADDRMSG.size)
        # IFA_LOCAL is the address itself; IFA_ADDRESS is the peer's on a point-to-point link
        raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS, b"")
        # IPv6 privacy addresses are replaced every day: news to nobody, yet a new digest
        if index in links and len(raw) == ADDRESS_BYTES.get(family) and not flags & IFA_F_TEMPORARY:
            links[index]["addresses"].append(f"{socket.inet_ntop(family, raw)}/{prefix}")
    return links


def _default_gateways(names: dict[int, str]) -> dict:
    """The default route of the main table per family, the lowest metric winning as it
    does in the kernel. Other tables are policy routing, for some traffic only."""
    best: dict[str, tuple[int, dict]] = {}
    header = RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)
    for kind, payload in netlink.dump(RTM_GETROUTE, header):
        if kind != RTM_NEWROUTE or len(payload) < RTMSG.size:
            continue
        family, dst_len, _, _, table, _, _, route_type, _ = RTMSG.unpack_from(payload)
        attrs = netlink.attributes(payload, RTMSG.size)
        gateway = attrs.get(RTA_GATEWAY, b"")
        # a table id past 255 is only in RTA_TABLE
        if (netlink.u32(attrs.get(RTA_TABLE), table) != RT_TABLE_MAIN or dst_len
                or route_type != RTN_UNICAST or len(gateway) != ADDRESS_BYTES.get(family)):
            continue
        metric = netlink.u32(attrs.get(RTA_PRIORITY), 0)
        key = "ipv4" if family == socket.AF_INET else "ipv6"
        if key not in best or metric < best[key][0]:
            best[key] = (metric, {"address": socket.inet_ntop(family, gateway),
                                  "interface": names.get(netlink.u32(attrs.get(RTA_OIF), 0), "")})
    return {key: route for key, (_, route) in best.items()}


def _wireless_levels(proc_root: str) -> dict[str, int]:
    """Signal level by interface from /proc/net/wireless: two header lines, then
    `wlan0: 0000   58.  -52.  -256 ...`. A level that is not negative is not dBm."""
    levels = {}
    for line in _lines(os.path.join(proc_root, "net/wireless"))[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        level = re.fullmatch(r"(-\d{1,3})\.?", fields[2]) if len(fields) > 2 else None
        if level:
            levels[name.strip()] = int(level.group(1))
    return levels


def _ssid(iw_link: str) -> str:
    """The `SSID: ` line of `iw dev IF link`, where iw writes every byte that is not
    printable ASCII (and a leading or trailing space) as \\xNN: undone, then bounded to
    the 32 bytes an SSID has."""
    for line in iw_link.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "SSID":
            raw = re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]),
                         value.encode("utf-8", "replace"))
            return _clean(raw[:32].decode("utf-8", "replace"), 32)
    return ""


def _network(sysfs_root: str, proc_root: str, run: Runner) -> dict:
    try:
        links = _netlink_interfaces()
        gateway = _default_gateways({index: link["name"] for index, link in links.items()})
    except (OSError, struct.error):   # no netlink here (a sandbox), refused, too large
        return {"interfaces": [], "gateway": {}}
    levels = _wireless_levels(proc_root)
    interfaces = []
    for link in links.values():
        if link["name"] == "lo":
            continue
        net = os.path.join(sysfs_root, "class/net", link["name"])
        if IFNAME.fullmatch(link["name"]) and any(
                os.path.exists(os.path.join(net, leaf)) for leaf in ("wireless", "phy80211")):
            output = run(["iw", "dev", link["name"], "link"])
            link["wifi"] = _present({"ssid": _ssid(output) if isinstance(output, str) else "",
                                     "signal_dbm": levels.get(link["name"])})
        interfaces.append(link)
    return {"interfaces": interfaces, "gateway": gateway}


# -- OS and board -----------------------------------------------------------------------
def _os_release(etc_root: str) -> dict:
    """os-release(5): shell-quoted assignments, one a line."""
    wanted = {"PRETTY_NAME": "pretty_name", "VERSION_ID": "version_id",
              "VERSION_CODENAME": "codename"}
    found = {}
    for line in _lines(os.path.join(etc_root, "os-release")):
        key, _, value = line.partition("=")
        if key in wanted:
            try:
                found[wanted[key]] = _clean(" ".join(shlex.split(value)))
            except ValueError:   # an unterminated quote
                continue
    return _present(found)


def _revision(proc_root: str, devicetree: str) -> str:
    for line in _lines(os.path.join(proc_root, "cpuinfo"), CPUINFO_LIMIT):
        key, _, value = line.partition(":")
        if key.strip() == "Revision" and re.fullmatch(r"[0-9a-fA-F]{4,8}", value.strip()):
            return value.strip().lower()
    # arm64 kernels other than Raspberry Pi's own have no Revision line; the firmware
    # puts the same code in the device tree
    raw = _read(os.path.join(devicetree, "system/linux,revision"), 8)
    return f"{int.from_bytes(raw, 'big'):04x}" if len(raw) == 4 else ""


def _firmware(devicetree: str) -> str:
    """The EEPROM bootloader of a Pi 4, 400, 5 or CM4/CM5, as the firmware leaves it in
    /chosen/bootloader: `version` (its git hash) and `build-timestamp` (a big-endian u32
    of UTC seconds, what rpi-eeprom-update compares). Older Pis boot from the card and
    have neither."""
    node = os.path.join(devicetree, "chosen/bootloader")
    version = _text(os.path.join(node, "version"), 64)
    raw = _read(os.path.join(node, "build-timestamp"), 8)
    built = ""
    if len(raw) == 4:
        built = time.strftime("built %Y-%m-%dT%H:%M:%SZ", time.gmtime(int.from_bytes(raw, "big")))
    return " ".join(part for part in (version, built) if part)


def _board(sysfs_root: str, proc_root: str) -> dict:
    # the serial number is sent with the device id already: not repeated here
    devicetree = os.path.join(sysfs_root, "firmware/devicetree/base")
    return _present({"model": _text(os.path.join(devicetree, "model")),
                     "revision": _revision(proc_root, devicetree),
                     "firmware": _firmware(devicetree)})


# -- displays and storage ---------------------------------------------------------------
def _edid(block: bytes) -> dict:
    """Manufacturer, product code and monitor name from an EDID 1.3/1.4 base block; {} for
    a block with a bad header or checksum, which is noise from a flaky cable or switch."""
    if len(block) < 128 or block[:8] != EDID_HEADER or sum(block[:128]) % 256:
        return {}
    packed = int.from_bytes(block[8:10], "big")   # three 5-bit letters, 1 = A
    letters = [(packed >> shift) & 0x1F for shift in (10, 5, 0)]
    facts = {"product_code": int.from_bytes(block[10:12], "little")}
    if all(1 <= n <= 26 for n in letters):
        facts["manufacturer"] = "".join(chr(64 + n) for n in letters)
    for offset in EDID_DESCRIPTORS:
        descriptor = block[offset:offset + 18]
        if descriptor[:3] == b"\0\0\0" and descriptor[3] == 0xFC:
            facts["name"] = _clean(descriptor[5:18].split(b"\n", 1)[0].decode("ascii", "replace"))
    return _present(facts)


def _displays(sysfs_root: str) -> list[dict]:
    displays = []
    for path in _glob(sysfs_root, "class/drm/card*-*"):
        modes = [mode for mode in dict.fromkeys(_clean(line, 32) for line in
                                                _lines(os.path.join(path, "modes"))) if mode]
        enabled = _text(os.path.join(path, "enabled"))
        display = {"connector": _clean(os.path.basename(path).split("-", 1)[1]),
                   "status": _text(os.path.join(path, "status")),
                   "enabled": {"enabled": True, "disabled": False}.get(enabled),
                   "modes": modes[:10]}
        display.update(_edid(_read(os.path.join(path, "edid"), 128)))
        displays.append(_present(display))
    return displays


def _storage(sysfs_root: str) -> list[dict]:
    disks = []
    for path in _glob(sysfs_root, "block/*"):
        name = os.path.basename(path)
        if not DISK.fullmatch(name):
            continue
        device = os.path.join(path, "device")
        sectors = _int(_text(os.path.join(path, "size")))
        disks.append(_present({
            "name": name,
            "size_bytes": None if sectors is None else sectors * 512,   # always 512-byte units
            "removable": {"1": True, "0": False}.get(_text(os.path.join(path, "removable"))),
            "type": _text(os.path.join(device, "type")),   # MMC or SD on a card
            "life_time": _life_time(_text(os.path.join(device, "life_time"))),
            "pre_eol_info": PRE_EOL.get(_hex(_text(os.path.join(device, "pre_eol_info")))),
        }))
    return disks


def _filesystems(sysfs_root: str) -> list[dict]:
    """ext4's error record per mounted device: a card that is failing says so here first."""
    found = []
    for path in _glob(sysfs_root, "fs/ext4/*"):
        counts = sysfs.ext4_errors(path)
        if counts["errors_count"] is not None:
            found.append(_present({"device": os.path.basename(path), **counts}))
    return found


def collect(sysfs_root: str = "/sys", proc_root: str = "/proc", etc_root: str = "/etc",
            run: Runner = run_command) -> dict:
    """The inventory; the roots and the runner are there for tests. Never raises."""
    return _cleaned({
        "network": _network(sysfs_root, proc_root, run),
        "os": _os_release(etc_root),
        "kernel": _present({"release": _text(os.path.join(proc_root, "sys/kernel/osrelease")),
                            "version": _text(os.path.join(proc_root, "sys/kernel/version"), 256)}),
        "board": _board(sysfs_root, proc_root),
        "displays": _displays(sysfs_root),
        "storage": _storage(sysfs_root),
        "filesystems": _filesystems(sysfs_root),
    })


def _cleaned(value):
    """Every string in it printable, whatever read it: the one pass over what is sent, so
    a field added later (or a name the kernel took with control characters in it, as an
    interface's) cannot reach the server uncleaned."""
    if isinstance(value, dict):
        return {_clean(k, 256): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    return _clean(value, 256) if isinstance(value, str) else value


def digest(inv: dict) -> str:
    """sha256 of the inventory as sorted-key JSON, VOLATILE keys left out: the Wi-Fi
    signal moves every few seconds. Left out rather than rounded to 10 dB steps, since a
    level near a step would flap between two buckets and still send a new inventory.
    What else changes is news: a cable pulled (carrier), a new DHCP lease (addresses,
    gateway), a monitor swapped or switched off (displays), a card wearing out."""
    def steady(value):
        if isinstance(value, dict):
            return {key: steady(v) for key, v in value.items() if key not in VOLATILE}
        if isinstance(value, list):
            return [steady(v) for v in value]
        return value
    encoded = json.dumps(steady(inv), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def summary(inv: dict) -> dict:
    """The few facts a dashboard shows on its device list: the address and Wi-Fi on the
    default route's interface, the first connected display and its preferred mode."""
    out: dict = {}
    network = inv.get("network") or {}
    via = (network.get("gateway") or {}).get("ipv4", {}).get("interface")
    for iface in network.get("interfaces") or []:
        if via and iface.get("name") != via:
            continue
        for address in iface.get("addresses") or []:
            key = "ipv6" if ":" in address else "ipv4"
            if key not in out and not address.startswith("fe80:"):
                out[key] = address.split("/")[0]
        wifi = iface.get("wifi") or {}
        if wifi.get("ssid") and "wifi_ssid" not in out:
            out["wifi_ssid"] = wifi["ssid"]
            if wifi.get("signal_dbm") is not None:
                out["wifi_signal_dbm"] = wifi["signal_dbm"]
    for display in inv.get("displays") or []:
        if display.get("status") == "connected":
            if display.get("name"):
                out["display_name"] = display["name"]
            if display.get("modes"):
                out["display_mode"] = display["modes"][0]
            break
    return out
