"""The device inventory: a Raspberry Pi's tree of sysfs, procfs and /etc built in a
temporary directory, netlink dumps built byte by byte, the real rtnetlink of this
process, and one of a network namespace of its own."""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from agent.base import netlink
from agent.inventory import collect as inventory
from devtools.harness import agent_config, wait_for

ROOT = Path(__file__).resolve().parent.parent
BOOTLOADER_BUILT = 1673458852   # 2023-01-11T17:40:52Z, as a Pi 4's boot log prints it
BOOTLOADER_HASH = "8ba17717fbcedd4c3b6d4bce7e50c7af4155cba9"


# -- a Raspberry Pi 4's files ---------------------------------------------------------
def _write(path: Path, content: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def edid(name: bytes = b"DELL U2415", manufacturer: str = "DEL", product: int = 0xA0B1) -> bytes:
    """A 128-byte EDID 1.4 base block as a Dell U2415 sends it: preferred timing first,
    then serial number, range limits and the monitor name descriptors."""
    block = bytearray(128)
    block[0:8] = bytes.fromhex("00ffffffffffff00")
    packed = sum((ord(letter) - 64) << shift for letter, shift in zip(manufacturer, (10, 5, 0)))
    block[8:10] = packed.to_bytes(2, "big")
    block[10:12] = product.to_bytes(2, "little")
    block[12:16] = (0x4C4B3041).to_bytes(4, "little")
    block[16], block[17], block[18], block[19] = 12, 2016 - 1990, 1, 4
    # 1920x1200 at 60 Hz, 154.00 MHz: a detailed timing, which the name parser must skip
    block[54:72] = bytes.fromhex("2a3c80a070b02340302036000f281100001a")
    block[72:90] = b"\0\0\0\xff\0" + b"CFV9N5BN0ABL\n"
    block[90:108] = b"\0\0\0\xfd\0" + bytes.fromhex("384c1e5111000a202020202020")
    block[108:126] = b"\0\0\0\xfc\0" + (name + b"\n").ljust(13, b" ")
    block[127] = -sum(block[:127]) % 256
    return bytes(block)


def _pi_tree(tmp_path: Path) -> tuple[str, str, str]:
    sysfs, proc, etc = tmp_path / "sys", tmp_path / "proc", tmp_path / "etc"
    dt = sysfs / "firmware/devicetree/base"
    _write(dt / "model", b"Raspberry Pi 4 Model B Rev 1.5\0")
    _write(dt / "serial-number", b"10000000abcdef01\0")
    _write(dt / "chosen/bootloader/version", BOOTLOADER_HASH.encode() + b"\0")
    _write(dt / "chosen/bootloader/build-timestamp", struct.pack(">I", BOOTLOADER_BUILT))
    cores = "".join(f"processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 "
                    f"cpuid\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n\n" for n in range(4))
    _write(proc / "cpuinfo", cores + "Revision\t: c03115\nSerial\t\t: 10000000abcdef01\n"
                                     "Model\t\t: Raspberry Pi 4 Model B Rev 1.5\n")
    # Debian's /etc/os-release is a link into /usr/lib
    _write(tmp_path / "usr/lib/os-release",
           'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\nVERSION_ID="13"\n'
           'VERSION="13 (trixie)"\nVERSION_CODENAME=trixie\nDEBIAN_VERSION_FULL=13.1\nID=debian\n'
           'HOME_URL="https://www.debian.org/"\n')
    etc.mkdir()
    (etc / "os-release").symlink_to("../usr/lib/os-release")
    _write(proc / "sys/kernel/osrelease", "6.12.47+rpt-rpi-v8\n")
    _write(proc / "sys/kernel/version", "#1 SMP PREEMPT Debian 1:6.12.47-1+rpt1 (2025-09-16)\n")
    _write(proc / "net/wireless",
           "Inter-| sta-|   Quality        |   Discarded packets               | Missed | WE\n"
           " face | tus | link level noise |  nwid  crypt   frag  retry   misc | beacon | 22\n"
           " wlan0: 0000   58.  -52.  -256        0      0      0      0      0        0\n")
    (sysfs / "class/net/wlan0/wireless").mkdir(parents=True)
    (sysfs / "class/net/eth0").mkdir(parents=True)
    hdmi = sysfs / "class/drm/card1-HDMI-A-1"
    _write(hdmi / "status", "connected\n")
    _write(hdmi / "enabled", "enabled\n")
    _write(hdmi / "modes", "1920x1200\n1920x1080\n1920x1080\n1600x1200\n1680x1050\n1280x1024\n"
                           "1280x1024\n1280x800\n1152x864\n1024x768\n800x600\n720x480\n640x480\n")
    _write(hdmi / "edid", edid() + bytes(128))   # and an extension block, not read
    hdmi2 = sysfs / "class/drm/card1-HDMI-A-2"
    _write(hdmi2 / "status", "disconnected\n")
    _write(hdmi2 / "enabled", "disabled\n")
    _write(hdmi2 / "modes", "")
    _write(hdmi2 / "edid", b"")
    mmc = sysfs / "block/mmcblk0"
    _write(mmc / "size", "62333952\n")
    _write(mmc / "removable", "0\n")
    _write(mmc / "device/type", "MMC\n")
    _write(mmc / "device/life_time", "0x02 0x01\n")
    _write(mmc / "device/pre_eol_info", "0x01\n")
    _write(sysfs / "block/mmcblk0boot0/size", "8192\n")
    for other in ("loop0", "ram0", "zram0"):
        _write(sysfs / "block" / other / "size", "1024\n")
    _write(sysfs / "fs/ext4/mmcblk0p2/errors_count", "3\n")
    _write(sysfs / "fs/ext4/mmcblk0p2/first_error_time", "1767225600\n")
    _write(sysfs / "fs/ext4/mmcblk0p2/last_error_time", "1767312000\n")
    (sysfs / "fs/ext4/features").mkdir(parents=True)
    return str(sysfs), str(proc), str(etc)


# -- rtnetlink dumps, byte by byte ----------------------------------------------------
def _attr(kind: int, value: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(value), kind) + value + bytes(-len(value) % 4)


def _message(kind: int, header: bytes, *attrs: bytes) -> bytes:
    payload = header + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(payload), kind, 0x2, 1, 0) + payload


def _link(index: int, name: str, flags: int, mac: str | None = None) -> bytes:
    attrs = [_attr(inventory.IFLA_IFNAME, name.encode() + b"\0")]
    if mac:
        attrs.append(_attr(inventory.IFLA_ADDRESS, bytes.fromhex(mac.replace(":", ""))))
    return _message(inventory.RTM_NEWLINK, struct.pack("=BxHiII", 0, 1, index, flags, 0), *attrs)


def _address(index: int, cidr: str, flags: int = 0) -> bytes:
    address, prefix = cidr.split("/")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    raw = socket.inet_pton(family, address)
    attrs = [_attr(inventory.IFA_ADDRESS, raw)] + ([_attr(inventory.IFA_LOCAL, raw)]
                                                    if family == socket.AF_INET else [])
    header = struct.pack("=BBBBI", family, int(prefix), flags, 0, index)
    return _message(inventory.RTM_NEWADDR, header, *attrs)


def _route(gateway: str | None, index: int, table: int = 254, metric: int | None = None,
           dst_len: int = 0) -> bytes:
    family = socket.AF_INET6 if gateway and ":" in gateway else socket.AF_INET
    attrs = [_attr(inventory.RTA_OIF, struct.pack("=I", index))]
    if table > 255:
        attrs.append(_attr(inventory.RTA_TABLE, struct.pack("=I", table)))
    if gateway:
        attrs.append(_attr(inventory.RTA_GATEWAY, socket.inet_pton(family, gateway)))
    if metric is not None:
        attrs.append(_attr(inventory.RTA_PRIORITY, struct.pack("=I", metric)))
    in_header = table if table <= 255 else 252   # RT_TABLE_COMPAT: look in RTA_TABLE
    header = struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, in_header, 3, 0, 1, 0)
    return _message(inventory.RTM_NEWROUTE, header, *attrs)


UP = inventory.IFF_UP | inventory.IFF_LOWER_UP
PI_DUMPS = {
    inventory.RTM_GETLINK: [_link(1, "lo", UP | 0x8, "00:00:00:00:00:00"),
                            _link(2, "eth0", UP, "dc:a6:32:01:02:03"),
                            _link(3, "wlan0", UP, "dc:a6:32:01:02:04")],
    inventory.RTM_GETADDR: [_address(1, "127.0.0.1/8"),
                            _address(2, "192.0.2.5/24"),
                            _address(2, "2001:db8::dea6:32ff:fe01:203/64"),
                            _address(2, "2001:db8::8d1c:4b2a:e3f0:71aa/64", flags=0x01),  # privacy
                            _address(2, "fe80::dea6:32ff:fe01:203/64"),
                            _address(3, "198.51.100.7/24")],
    inventory.RTM_GETROUTE: [_route("192.0.2.1", 2, metric=100),
                             _route("198.51.100.1", 3, metric=600),
                             _route(None, 2, metric=100, dst_len=24),          # on-link
                             _route("203.0.113.1", 2, table=100),             # policy routing
                             _route("203.0.113.9", 2, table=1000),            # RTA_TABLE only
                             _route("fe80::1", 2, metric=1024)],
}


def _fake_netlink(monkeypatch, dumps: dict[int, list[bytes]]) -> None:
    """Replaces the socket only: the datagrams still go through the module's parser."""
    monkeypatch.setattr(inventory.netlink, "dump",
                        lambda request, header: list(netlink.messages(b"".join(dumps[request]))))


class FakeRunner:
    def __init__(self, output: str | None):
        self.output, self.calls = output, []

    def __call__(self, argv):
        self.calls.append(list(argv))
        return self.output


IW_LINK = ("Connected to 3c:37:86:aa:bb:cc (on wlan0)\n"
           "\tSSID: Caf\\xc3\\xa9 Lobby\n"
           "\tfreq: 5180.0\n\tRX: 81234 bytes (712 packets)\n\tTX: 23456 bytes (201 packets)\n"
           "\tsignal: -52 dBm\n\trx bitrate: 433.3 MBit/s VHT-MCS 9 80MHz short GI VHT-NSS 1\n")


def test_a_raspberry_pi_4_inventory_has_every_fact(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    run = FakeRunner(IW_LINK)
    sysfs, proc, etc = _pi_tree(tmp_path)

    inv = inventory.collect(sysfs, proc, etc, run=run)

    assert inv == {
        "network": {
            "interfaces": [
                {"name": "eth0", "mac": "dc:a6:32:01:02:03", "state": "up", "carrier": True,
                 "addresses": ["192.0.2.5/24", "2001:db8::dea6:32ff:fe01:203/64",
                               "fe80::dea6:32ff:fe01:203/64"]},
                {"name": "wlan0", "mac": "dc:a6:32:01:02:04", "state": "up", "carrier": True,
                 "addresses": ["198.51.100.7/24"],
                 "wifi": {"ssid": "Café Lobby", "signal_dbm": -52}},
            ],
            "gateway": {"ipv4": {"address": "192.0.2.1", "interface": "eth0"},
                        "ipv6": {"address": "fe80::1", "interface": "eth0"}},
        },
        "os": {"pretty_name": "Debian GNU/Linux 13 (trixie)", "version_id": "13",
               "codename": "trixie"},
        "kernel": {"release": "6.12.47+rpt-rpi-v8",
                   "version": "#1 SMP PREEMPT Debian 1:6.12.47-1+rpt1 (2025-09-16)"},
        "board": {"model": "Raspberry Pi 4 Model B Rev 1.5", "revision": "c03115",
                  "firmware": f"{BOOTLOADER_HASH} built 2023-01-11T17:40:52Z"},
        "displays": [
            {"connector": "HDMI-A-1", "status": "connected", "enabled": True,
             "modes": ["1920x1200", "1920x1080", "1600x1200", "1680x1050", "1280x1024",
                       "1280x800", "1152x864", "1024x768", "800x600", "720x480"],
             "name": "DELL U2415", "manufacturer": "DEL", "product_code": 0xA0B1},
            {"connector": "HDMI-A-2", "status": "disconnected", "enabled": False, "modes": []},
        ],
        "storage": [
            {"name": "mmcblk0", "size_bytes": 62333952 * 512, "removable": False, "type": "MMC",
             "life_time": {"a": "10-20%", "b": "0-10%"}, "pre_eol_info": "normal"},
        ],
        "filesystems": [
            {"device": "mmcblk0p2", "errors_count": 3, "first_error_time": 1767225600,
             "last_error_time": 1767312000},
        ],
    }
    assert run.calls == [["iw", "dev", "wlan0", "link"]]
    encoded = json.dumps(inv)
    assert "10000000abcdef01" not in encoded, "the serial number is sent elsewhere"


def test_an_edid_with_a_bad_checksum_or_header_gives_no_name(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    sysfs, proc, etc = _pi_tree(tmp_path)
    block = bytearray(edid())
    block[120] ^= 0x01
    _write(Path(sysfs) / "class/drm/card1-HDMI-A-1/edid", bytes(block))
    _write(Path(sysfs) / "class/drm/card1-HDMI-A-2/edid", b"\x01" + edid()[1:])
    displays = inventory.collect(sysfs, proc, etc, run=FakeRunner(None))["displays"]
    for display in displays:
        assert not {"name", "manufacturer", "product_code"} & display.keys()
    assert inventory._edid(edid(b"LG ULTRAFINE")) == {
        "name": "LG ULTRAFINE", "manufacturer": "DEL", "product_code": 0xA0B1}
    assert inventory._edid(edid()[:100]) == {}


def test_a_missing_tree_gives_an_empty_but_valid_inventory(tmp_path, monkeypatch):
    def no_netlink(request, header):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(inventory.netlink, "dump", no_netlink)
    run = FakeRunner("\tSSID: never asked\n")
    missing = str(tmp_path / "nothing")
    inv = inventory.collect(missing, missing, missing, run=run)
    assert inv == {"network": {"interfaces": [], "gateway": {}}, "os": {}, "kernel": {},
                   "board": {}, "displays": [], "storage": [], "filesystems": []}
    assert run.calls == []
    assert json.loads(json.dumps(inv)) == inv


def test_a_wireless_interface_without_iw_or_signal_has_an_empty_wifi(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    sysfs, proc, etc = _pi_tree(tmp_path)
    os.remove(Path(proc) / "net/wireless")
    (Path(sysfs) / "class/net/wlan0/wireless").rmdir()
    (Path(sysfs) / "class/net/wlan0/phy80211").mkdir()   # the other way a driver shows it
    run = FakeRunner(None)   # iw not installed
    [_, wlan0] = inventory.collect(sysfs, proc, etc, run=run)["network"]["interfaces"]
    assert wlan0["wifi"] == {} and run.calls == [["iw", "dev", "wlan0", "link"]]
    assert inventory._ssid("Not connected.\n") == ""


def test_an_interface_name_outside_the_pattern_is_never_passed_to_the_runner(tmp_path, monkeypatch):
    names = ["wlan0", "wlan0;reboot", "-h", "..", "wlan0 wlan1", "wlan0123456789012", "wlän0"]
    links = [_link(10 + i, name, UP) for i, name in enumerate(names)]
    dumps = {**PI_DUMPS, inventory.RTM_GETLINK: links}
    _fake_netlink(monkeypatch, dumps)
    sysfs, proc, etc = _pi_tree(tmp_path)
    for name in names[1:]:
        if name != "..":
            (Path(sysfs) / "class/net" / name / "wireless").mkdir(parents=True)
    run = FakeRunner(IW_LINK)
    interfaces = inventory.collect(sysfs, proc, etc, run=run)["network"]["interfaces"]
    assert run.calls == [["iw", "dev", "wlan0", "link"]]
    assert [i["name"] for i in interfaces] == names, "listed, as the kernel named them"
    assert [i["name"] for i in interfaces if "wifi" in i] == ["wlan0"]


def test_long_and_garbage_files_are_bounded_and_never_raise(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    sysfs, proc, etc = _pi_tree(tmp_path)
    sys_, proc_ = Path(sysfs), Path(proc)
    _write(sys_ / "firmware/devicetree/base/model", b"Raspberry Pi " + b"\x07A\0" * 1_000_000)
    _write(sys_ / "firmware/devicetree/base/chosen/bootloader/build-timestamp", b"\xff" * 8)
    _write(tmp_path / "usr/lib/os-release",
           b'PRETTY_NAME="unterminated\nVERSION_ID=13\x00\xff\xfe\n'
           b"VERSION_CODENAME=" + b"x" * 100_000)
    _write(proc_ / "cpuinfo", os.urandom(1 << 20))
    os.remove(proc_ / "sys/kernel/osrelease")
    os.mkfifo(proc_ / "sys/kernel/osrelease")   # a FIFO is never waited on
    _write(proc_ / "net/wireless", "h\nh\n wlan0: 0000 1. nan. 0 0\n wlan0: 0000 1. -99999. 0\n")
    _write(sys_ / "class/drm/card1-HDMI-A-1/modes", "\x1b[2J1920x1080\n" * 200_000)
    _write(sys_ / "class/drm/card1-HDMI-A-1/edid", os.urandom(1 << 16))
    _write(sys_ / "block/mmcblk0/size", "9" * 5000)
    _write(sys_ / "block/mmcblk0/device/life_time", "0xZZ 0x0b 0x03\n")
    _write(sys_ / "block/mmcblk0/device/pre_eol_info", "0x09\n")
    _write(sys_ / "fs/ext4/mmcblk0p2/errors_count", "9" * 25)
    run = FakeRunner("\tSSID: " + "\\x41" * 10_000 + "\x00\x1b]0;title\x07\n")

    inv = inventory.collect(sysfs, proc, etc, run=run)

    json.dumps(inv)
    assert inv["board"]["model"].startswith("Raspberry Pi A") and len(inv["board"]["model"]) <= 128
    assert "revision" not in inv["board"]
    assert inv["os"] == {"version_id": "13\ufffd\ufffd"}, "a value the bound cut is left out"
    assert "release" not in inv["kernel"]
    assert inv["network"]["interfaces"][1]["wifi"] == {"ssid": "A" * 32}
    [hdmi1, _] = inv["displays"]
    assert hdmi1["modes"] == ["[2J1920x1080"] and "name" not in hdmi1
    [mmc] = inv["storage"]
    assert mmc == {"name": "mmcblk0", "removable": False, "type": "MMC",
                   "life_time": {"b": "exceeded"}}
    assert inv["filesystems"] == []


def test_the_revision_falls_back_to_the_device_tree(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    sysfs, proc, etc = _pi_tree(tmp_path)
    _write(Path(proc) / "cpuinfo", "processor\t: 0\nBogoMIPS\t: 108.00\n")   # Debian's arm64 kernel
    _write(Path(sysfs) / "firmware/devicetree/base/system/linux,revision",
           struct.pack(">I", 0xD03115))
    board = inventory.collect(sysfs, proc, etc, run=FakeRunner(None))["board"]
    assert board["revision"] == "d03115"


def test_the_digest_is_stable_and_ignores_the_wifi_signal(tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    sysfs, proc, etc = _pi_tree(tmp_path)
    inv = inventory.collect(sysfs, proc, etc, run=FakeRunner(IW_LINK))
    first = inventory.digest(inv)
    assert len(first) == 64 and set(first) <= set("0123456789abcdef")
    assert inventory.digest(json.loads(json.dumps(inv, sort_keys=True))) == first

    inv["network"]["interfaces"][1]["wifi"]["signal_dbm"] = -71
    assert inventory.digest(inv) == first
    inv["network"]["interfaces"][1]["wifi"]["ssid"] = "Back Office"
    assert inventory.digest(inv) != first


def test_the_default_runner_takes_an_argv_and_gives_stdout_or_none():
    assert inventory.run_command([sys.executable, "-c", "print('SSID: a; b')"]) == "SSID: a; b\n"
    assert inventory.run_command([sys.executable, "-c", "raise SystemExit(1)"]) is None
    assert inventory.run_command(["/nonexistent/iw", "dev", "wlan0", "link"]) is None


# -- the real kernel ------------------------------------------------------------------
def test_real_rtnetlink_sees_loopback_and_collect_leaves_it_out():
    links = inventory._netlink_interfaces()
    [lo] = [link for link in links.values() if link["name"] == "lo"]
    assert "127.0.0.1/8" in lo["addresses"] and lo["mac"] == "00:00:00:00:00:00"

    inv = inventory.collect(run=FakeRunner(None))
    names = [link["name"] for link in inv["network"]["interfaces"]]
    assert "lo" not in names and set(names) <= {link["name"] for link in links.values()}
    assert json.loads(json.dumps(inv)) == inv


# a veth pair, not a dummy: kernels built without the dummy driver (this CI's) have veth
NAMESPACE_SETUP = """
ip link add eth0 type veth peer name peer0
ip addr add 192.0.2.5/24 dev eth0
ip -6 addr add 2001:db8::5/64 dev eth0 nodad
ip link set eth0 address 02:00:00:00:00:01 up
ip link set peer0 up
ip route add default via 192.0.2.1 dev eth0
ip route add default via 192.0.2.11 dev eth0 metric 500
ip route add default via 192.0.2.9 dev eth0 table 100
ip route add default via 192.0.2.10 dev eth0 table 1000
ip -6 route add default via 2001:db8::1 dev eth0
exec "$0" -c "$1"
"""
COLLECT = ("import json; from agent.inventory import collect as inventory; "
           "print(json.dumps(inventory.collect(run=lambda argv: None)))")


@pytest.mark.netns
def test_collect_in_a_network_namespace_of_its_own_reads_mac_address_and_gateways():
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        # Not a skip: CI runs as root with iproute2 and util-linux, as the netns fixture says
        pytest.fail(f"this test needs root and {', '.join(missing) or 'nothing more'}")
    done = subprocess.run(["unshare", "-n", "sh", "-ec", NAMESPACE_SETUP, sys.executable, COLLECT],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    network = json.loads(done.stdout)["network"]

    interfaces = {link["name"]: link for link in network["interfaces"]}
    assert interfaces.keys() == {"eth0", "peer0"}, "lo left out"
    eth0 = interfaces["eth0"]
    assert eth0["mac"] == "02:00:00:00:00:01"
    assert eth0["state"] == "up" and eth0["carrier"] is True
    assert {"192.0.2.5/24", "2001:db8::5/64"} <= set(eth0["addresses"])
    assert "wifi" not in eth0
    assert network["gateway"] == {"ipv4": {"address": "192.0.2.1", "interface": "eth0"},
                                  "ipv6": {"address": "2001:db8::1", "interface": "eth0"}}


def test_the_summary_is_the_default_routes_address_and_wifi_and_the_first_display(
        tmp_path, monkeypatch):
    _fake_netlink(monkeypatch, PI_DUMPS)
    inv = inventory.collect(*_pi_tree(tmp_path), run=FakeRunner(IW_LINK))
    assert inventory.summary(inv) == {"ipv4": "192.0.2.5", "ipv6": "2001:db8::dea6:32ff:fe01:203",
                                      "display_name": "DELL U2415", "display_mode": "1920x1200"}
    inv["network"]["gateway"]["ipv4"]["interface"] = "wlan0"   # the cable pulled
    assert inventory.summary(inv) == {"ipv4": "198.51.100.7", "wifi_ssid": "Café Lobby",
                                      "wifi_signal_dbm": -52, "display_name": "DELL U2415",
                                      "display_mode": "1920x1200"}
    assert inventory.summary({}) == {}


@pytest.mark.netns
def test_the_agent_sends_its_inventory_to_the_server(netns, fleet, spawn_agent, agent_python,
                                                      tmp_path):
    sysfs, _, _ = _pi_tree(tmp_path)
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path, debug={"sysfs_root": sysfs}))
    agent.wait_live(15)

    def sent():
        events = server.admin("/admin/devices").get("screen-1", {}).get("events", [])
        return [e for e in events if e.get("type") == "device.inventory"]
    [event] = wait_for(sent, 15, what="device.inventory at the server")
    assert event["inventory"]["displays"][0]["name"] == "DELL U2415"
    assert event["inventory"]["kernel"]["release"] and len(event["digest"]) == 64


def test_every_string_sent_is_cleaned_interface_names_included(tmp_path, monkeypatch):
    """Before: an interface named with control characters (the kernel takes any byte but
    '/', ':' and white space) reached the server as named; every other field was cleaned."""
    hostile = "e\x1b[2Jth\x070\x7f"
    dumps = {**PI_DUMPS, inventory.RTM_GETLINK: [*PI_DUMPS[inventory.RTM_GETLINK],
                                                 _link(9, hostile, UP)]}
    _fake_netlink(monkeypatch, dumps)
    sysfs, proc, etc = _pi_tree(tmp_path)
    inv = inventory.collect(sysfs, proc, etc, run=FakeRunner(IW_LINK))

    def strings(value):
        if isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value
    assert all(s.isprintable() for s in strings(inv)), [s for s in strings(inv)
                                                        if not s.isprintable()]
    assert "e[2Jth0" in [i["name"] for i in inv["network"]["interfaces"]]
