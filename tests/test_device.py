"""The device's truth (#53): the card's verdict, the Pi firmware's power flags and why the
last boot ended. The cores in microseconds; the reader on sysfs fixture trees (an eMMC
the test machine does not have) and on the real kernel: a loop-mounted ext4 with ext4's
own error trigger (devtools/card.py), which is how a card dies under Raspberry Pi OS.
"""
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from agent.app.status import render
from agent.base.journal_fields import MessageId
from agent.device import last_boot, power, storage, words
from agent.device.part import DevicePart, Off, assemble
from agent.device.reader import DeviceReader
from agent.metrics.core import gauges_of

GIB = 1 << 30


# -- the card's verdict, sans I/O ----------------------------------------------------------
MOUNTINFO = (
    "22 1 179:2 / / rw,noatime shared:1 - ext4 /dev/root rw\n"
    "25 22 0:22 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=97448k,mode=755\n"
    "31 22 179:1 / /boot/firm\\040ware rw,relatime shared:7 - vfat /dev/mmcblk0p1 rw\n"
    "40 22 179:2 /var/lib /var/lib/edge-agent rw,noatime shared:1 - ext4 /dev/root "
    "rw,errors=remount-ro,emergency_ro\n"
    "a line that is no mount\n")


def test_mountinfo_says_which_mount_holds_a_path_and_ext4s_emergency_read_only():
    mounts = storage.parse_mountinfo(MOUNTINFO)
    assert [m.point for m in mounts] == ["/", "/run", "/boot/firm ware", "/var/lib/edge-agent"]
    assert storage.mount_of(mounts, "/run/edge-agent").point == "/run"
    assert storage.mount_of(mounts, "/runner").point == "/"
    assert storage.mount_of(mounts, "/boot/firm ware/x").source == "/dev/mmcblk0p1"
    state = storage.mount_of(mounts, "/var/lib/edge-agent/state")
    # Linux 6.x: the mount still says rw; the super options say emergency_ro
    assert state.device == "179:2" and state.read_only and state.emergency
    assert not storage.mount_of(mounts, "/home").read_only
    ro = storage.parse_mountinfo("1 0 8:1 / / ro,relatime - ext4 /dev/sda1 rw\n")[0]
    assert ro.read_only and not ro.emergency


def _reading(**kw) -> storage.Reading:
    base = dict(mount=storage.Mount("/", "179:2", "/dev/mmcblk0p2", "ext4", False),
                avail_bytes=10 * GIB, total_bytes=30 * GIB, disk="mmcblk0",
                size_bytes=32 * GIB, sectors_written=0)
    return storage.Reading(**{**base, **kw})


def test_each_verdict_from_what_the_kernel_counts_the_most_severe_first():
    assert storage.judge(_reading()) == ("ok", [])
    assert storage.judge(_reading(life_time=(9, 3)))[0] == "worn"
    assert storage.judge(_reading(pre_eol=2))[0] == "worn"
    assert storage.judge(_reading(avail_bytes=15 << 20))[0] == "full"
    assert storage.judge(_reading(avail_bytes=500 << 20))[0] == "full"   # under 2 % of 30 GiB
    assert storage.judge(_reading(errors={"errors_count": 3}))[0] == "failing"
    assert storage.judge(_reading(pre_eol=3))[0] == "failing"
    assert storage.judge(_reading(life_time=(11, 2)))[0] == "failing"
    ro = storage.Mount("/", "179:2", "/dev/root", "ext4", True, True)
    verdict, reasons = storage.judge(_reading(mount=ro, errors={"errors_count": 1},
                                              avail_bytes=1 << 20, pre_eol=2))
    assert verdict == "read-only"
    assert reasons == ["ext4 made / read-only after an error", "ext4 recorded 1 error",
                       "1 MiB left of 30720 MiB", "the card's pre-EOL says warning"]


def test_full_is_kept_apart_from_failing():
    full = storage.judge(_reading(avail_bytes=1 << 20))
    assert full[0] == "full" and not any("error" in r for r in full[1])
    assert storage.judge(_reading(avail_bytes=1 << 20, errors={"errors_count": 1}))[0] == \
        "failing"


def test_the_verdict_is_news_on_a_change_only_and_a_first_ok_is_none():
    judge = storage.StorageJudge()
    assert judge.feed(_reading(), 0.0) is None and judge.snapshot()["verdict"] == "ok"
    assert judge.feed(_reading(), 60.0) is None
    change = judge.feed(_reading(errors={"errors_count": 1, "last_error_time": 1700000000}),
                        120.0)
    assert change["verdict"] == "failing" and change["was"] == "ok"
    assert change["errors"] == 1 and change["last_error_at"] == 1700000000
    assert judge.feed(_reading(errors={"errors_count": 2}), 180.0) is None   # still failing
    first = storage.StorageJudge().feed(_reading(avail_bytes=0), 0.0)
    assert first["verdict"] == "full" and first["was"] is None


def test_bytes_written_a_day_from_the_block_devices_count_against_the_cards_size():
    judge = storage.StorageJudge()
    judge.feed(_reading(sectors_written=1000), 0.0)
    judge.feed(_reading(sectors_written=1000 + 2048), 300.0)
    assert judge.bytes_per_day is None, "too short a window to say a day's rate"
    # 1 GiB in an hour: 24 GiB a day, three quarters of a 32 GiB card
    judge.feed(_reading(sectors_written=1000 + GIB // 512), 3600.0)
    snap = judge.snapshot()
    assert snap["written_bytes_per_day"] == 24 * GIB and snap["card_writes_per_day"] == 0.75
    judge.feed(_reading(sectors_written=5), 3700.0)   # a count that went back: a new start
    assert judge.bytes_per_day is None


# -- power and heat, sans I/O ----------------------------------------------------------------
def test_the_firmware_word_and_its_since_boot_half():
    assert power.parse_word("50005\n") == 0x50005 and power.parse_word("0x0") == 0
    for bad in ("", "zz", "123456789", "-1", "5 5"):
        assert power.parse_word(bad) is None
    assert power.flags_of(0x50005) == {"under-voltage", "throttled"}
    assert power.flags_of(0x80008, power.SINCE_SHIFT) == {"soft-temperature-limit"}


def test_power_flags_are_news_on_change_and_since_boot_is_latched_here():
    flags = power.PowerFlags()
    assert flags.feed(0, None) is None and flags.snapshot() == {
        "now": [], "since_boot": [], "source": "firmware"}
    change = flags.feed(0x50005, None)
    assert change == {"now": ["under-voltage", "throttled"],
                      "since_boot": ["under-voltage", "throttled"], "was": [],
                      "source": "firmware"}
    assert flags.feed(0x50005, None) is None
    # the hwmon driver cleared the sticky bits: since boot is still said
    change = flags.feed(0x2, None)
    assert change["now"] == ["frequency-capped"]
    assert change["since_boot"] == ["under-voltage", "frequency-capped", "throttled"]
    # no firmware word: the hwmon alarm says under-voltage now
    hw = power.PowerFlags()
    assert hw.feed(None, "0") is None and hw.snapshot()["source"] == "hwmon"
    assert hw.feed(None, "1")["now"] == ["under-voltage"]
    assert power.PowerFlags().feed(None, None) is None
    assert power.PowerFlags().feed(0x10000, None)["since_boot"] == ["under-voltage"], \
        "a flag up since boot is news at the first read"


# -- why the last boot ended, sans I/O ---------------------------------------------------------
def test_the_cause_most_telling_first():
    mark = last_boot.StopMark(1000.0, "boot-a")
    crash = last_boot.Crash("dmesg-ramoops-0", "panic", 2000.0)
    assert last_boot.judge(None, [], None, None).cause == "power-loss"
    assert last_boot.judge(mark, [], None, None) == last_boot.BootEnd("clean", "operator",
                                                                      at=1000.0)
    assert last_boot.judge(last_boot.StopMark(1.0, "b", "fleet"), [], 0, None).by == "fleet"
    laddered = last_boot.judge(mark, [], None, ("boot-a", "the screen was black"))
    assert (laddered.by, laddered.why) == ("ladder", "the screen was black")
    assert last_boot.judge(mark, [], None, ("boot-0", "older")).by == "operator"
    assert last_boot.judge(mark, [], 0x20, None).cause == "watchdog"
    assert last_boot.judge(None, [], 0x20, None).cause == "watchdog"
    panic = last_boot.judge(mark, [crash], 0x20, None)
    assert panic.cause == "panic" and panic.why == "panic dmesg-ramoops-0"
    old = last_boot.Crash("dmesg-ramoops-1", "panic", 500.0)   # before the clean stop
    assert last_boot.judge(mark, [old], None, None).cause == "clean"
    assert last_boot.crash_kind("dmesg-ramoops-0", "Panic#1 Part1") == "panic"
    assert last_boot.crash_kind("dmesg-efi-1", "Oops#1 Part1") == "oops"
    assert last_boot.crash_kind("console-ramoops-0", "Panic#1") is None
    assert last_boot.crash_kind("dmesg-ramoops-2", "Dump#1") is None


def test_the_mark_reads_back_and_anything_else_is_refused():
    mark = last_boot.StopMark(1700000000.5, "b" * 36, "fleet")
    assert last_boot.parse_mark(last_boot.mark_bytes(mark)) == mark
    carried = last_boot.StopMark(1.0, "b", "", last_boot.BootEnd("panic", None, "crash x", 5.0))
    assert last_boot.parse_mark(last_boot.mark_bytes(carried)) == carried
    assert last_boot.parse_mark(b'{"wall": 1, "boot": "b", "ended": {"cause": "?"}}').ended \
        is None
    for bad in (b"[]", b"{}", b'{"wall": "x", "boot": ""}', b'{"wall": 1, "boot": 2}',
                b'{"wall": true, "boot": ""}', b'{"wall": 1e999, "boot": ""}', b"\xff"):
        with pytest.raises(ValueError):
            last_boot.parse_mark(bad)
    end = last_boot.BootEnd("clean", "ladder", "black", 5.0)
    assert last_boot.from_details(end.details()) == end
    assert last_boot.from_details({"cause": "nonsense"}) is None


# -- the reader on fixture trees -----------------------------------------------------------
DISK = "devices/platform/emmc2bus/fe340000.mmc/mmc_host/mmc0/mmc0:0001/block/mmcblk0"


def _tree(tmp_path: Path, mountinfo: str = MOUNTINFO) -> tuple[Path, Path]:
    sys_, proc = tmp_path / "sys", tmp_path / "proc"
    files = {
        f"{DISK}/size": "62333952", f"{DISK}/mmcblk0p2/partition": "2",
        f"{DISK}/mmcblk0p2/stat": "  100 0 800 5 4096 10 65536 90 0 100 95 0 0 0 0 0 0",
        f"{DISK}/device/name": "BJTD4R", f"{DISK}/device/type": "MMC",
        f"{DISK}/device/cid": "150100424a544434520a5e4d5fa2d600",
        f"{DISK}/device/date": "07/2021", f"{DISK}/device/life_time": "0x09 0x02",
        f"{DISK}/device/pre_eol_info": "0x01",
        "fs/ext4/mmcblk0p2/errors_count": "2", "fs/ext4/mmcblk0p2/first_error_time": "1700000000",
        "fs/ext4/mmcblk0p2/last_error_time": "1700000100",
        "devices/platform/soc/soc:firmware/get_throttled": "50005",
        "class/hwmon/hwmon0/name": "rpi_volt", "class/hwmon/hwmon0/in0_lcrit_alarm": "1",
        "class/watchdog/watchdog0/bootstatus": "32",
        "fs/pstore/dmesg-ramoops-0": "Panic#1 Part1\n<0>Kernel panic - not syncing\n",
        "fs/pstore/console-ramoops-0": "boot log\n",
    }
    for rel, text in files.items():
        (sys_ / rel).parent.mkdir(parents=True, exist_ok=True)
        (sys_ / rel).write_text(text + "\n")
    (sys_ / "dev/block").mkdir(parents=True)
    os.symlink(f"../../{DISK}/mmcblk0p2", sys_ / "dev/block/179:2")
    (proc / "self").mkdir(parents=True)
    (proc / "self/mountinfo").write_text(mountinfo)
    return sys_, proc


def test_the_reader_finds_the_cards_identity_wear_errors_and_writes(tmp_path):
    sys_, proc = _tree(tmp_path, "22 1 179:2 / / rw,noatime - ext4 /dev/root rw\n")
    (tmp_path / "state").mkdir()
    reader = DeviceReader(str(tmp_path / "state"), str(sys_), str(proc), str(tmp_path / "none"))
    r = reader.storage()
    assert r.mount.source == "/dev/root" and r.disk == "mmcblk0"
    assert r.errors == {"errors_count": 2, "first_error_time": 1700000000,
                        "last_error_time": 1700000100}
    assert r.size_bytes == 62333952 * 512 and r.sectors_written == 65536
    assert r.card == {"name": "BJTD4R", "type": "MMC", "cid": "150100424a544434520a5e4d5fa2d600",
                      "date": "07/2021"}
    assert r.life_time == (9, 2) and r.pre_eol == 1
    assert r.total_bytes and r.avail_bytes is not None   # statvfs of the real directory
    assert storage.judge(r)[0] == "failing"
    assert reader.throttled() == 0x50005 and reader.undervoltage() == "1"
    assert reader.watchdog_status() == 32
    [crash] = reader.crashes()
    assert (crash.name, crash.kind) == ("dmesg-ramoops-0", "panic")


def test_the_firmware_word_is_found_under_another_parent_too(tmp_path):
    word = tmp_path / "devices/platform/scb/soc:firmware/get_throttled"
    word.parent.mkdir(parents=True)
    word.write_text("80008\n")
    reader = DeviceReader(str(tmp_path), str(tmp_path), str(tmp_path))
    assert reader.throttled() == 0x80008
    word.write_text("0\n")
    assert reader.throttled() == 0, "looked for once, read each time"


def test_a_panic_systemd_pstore_archived_is_seen_where_pstore_is_roots(tmp_path):
    """Debian's systemd-pstore moves the kernel's records out of pstore (0750 root) at
    boot into its archive (0755): the names and times there are what the agent sees."""
    archive = tmp_path / "archive"
    (archive / "1700000500123456").mkdir(parents=True)
    (archive / "1700000500123456" / "dmesg.txt").write_text("<0>Kernel panic\n")
    (archive / "console-ramoops-0").write_text("a boot's console\n")
    (archive / "1600000000000000").mkdir()   # a directory without a kernel's log
    os.utime(archive / "1700000500123456", (1700000500, 1700000500))
    reader = DeviceReader(str(tmp_path), str(tmp_path / "sys"), str(tmp_path), str(archive))
    [crash] = reader.crashes()
    assert (crash.name, crash.kind, crash.wall) == ("1700000500123456", "crash", 1700000500)
    end = last_boot.judge(last_boot.StopMark(1700000000.0, "b"), [crash], None, None)
    assert (end.cause, end.why) == ("panic", "crash 1700000500123456")
    older = last_boot.judge(last_boot.StopMark(1800000000.0, "b"), [crash], None, None)
    assert older.cause == "clean", "archived before the last clean stop: an older boot's"


def test_a_tree_without_any_of_it_is_said_as_nothing_never_an_error(tmp_path):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "sys").mkdir()
    reader = DeviceReader(str(tmp_path / "state"), str(tmp_path / "sys"), str(tmp_path / "proc"),
                          str(tmp_path / "archive"))
    assert reader.storage() == storage.Reading() and storage.judge(reader.storage())[0] == "ok"
    assert reader.throttled() is None and reader.undervoltage() is None
    assert reader.crashes() == [] and reader.watchdog_status() is None
    (tmp_path / "proc/self/mountinfo").write_bytes(b"\xff\x00 garbage\n" * 3)
    assert reader.mount() is None


# -- the part: start, turns, stop --------------------------------------------------------------
class Entry:
    def __init__(self, boot, why):
        self.boot, self.why = boot, why


def _part(tmp_path, sys_, proc, cold_start=True, boot="boot-a", **kw):
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir(exist_ok=True)
    run.mkdir(exist_ok=True)
    published = []
    reader = DeviceReader(str(state), str(sys_), str(proc), str(tmp_path / "archive"))
    part = DevicePart(reader, publish=published.append,
                      every_s=60.0, state_dir=str(state), runtime_dir=str(run),
                      cold_start=cold_start, boot=lambda: boot, wall=lambda: 1000.0, **kw)
    return part, published


def test_each_boot_says_how_the_last_ended_and_the_stop_leaves_the_mark(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edge_agent")
    sys_, proc = _tree(tmp_path)
    for rel in ("fs/pstore/dmesg-ramoops-0", "class/watchdog/watchdog0/bootstatus"):
        (sys_ / rel).unlink()
    part, published = _part(tmp_path, sys_, proc)
    part.start()
    assert [e.type for e in published] == ["device.boot"]
    assert published[0].details["cause"] == "power-loss"
    [record] = [r for r in caplog.records if getattr(r, "journal", None)]
    assert record.journal == {"MESSAGE_ID": MessageId.BOOT_ENDED, "CAUSE": "power-loss"}
    assert record.levelno == logging.WARNING

    part.stop()   # an orderly stop, the fleet's reboot running
    mark = tmp_path / "state" / last_boot.MARK_FILE
    assert json.loads(mark.read_text())["boot"] == "boot-a"
    assert oct(mark.stat().st_mode & 0o777) == "0o600"

    # a restart in the same boot: no event, the boot's cause from tmpfs, the mark gone
    again, published = _part(tmp_path, sys_, proc, cold_start=False)
    again.start()
    assert published == [] and again.last_boot.cause == "power-loss" and not mark.exists()
    # systemctl restart empties the runtime directory: the mark carries the cause
    again.stop()
    (tmp_path / "run" / "boot-cause.json").unlink()
    restarted, published = _part(tmp_path, sys_, proc, cold_start=False)
    restarted.start()
    assert published == [] and restarted.last_boot.cause == "power-loss"

    # the next boot after an orderly stop asked by the fleet
    _part(tmp_path, sys_, proc, asked_by=lambda: "fleet")[0].stop()
    (tmp_path / "run" / "boot-cause.json").unlink(missing_ok=True)   # a boot empties /run
    nxt, published = _part(tmp_path, sys_, proc, boot="boot-b")
    nxt.start()
    assert published[0].details == {"cause": "clean", "by": "fleet", "why": None, "at": 1000.0}
    assert not mark.exists()

    # the ladder's reboot, told by its own book's boot
    _part(tmp_path, sys_, proc, boot="boot-b")[0].stop()
    ladder, published = _part(tmp_path, sys_, proc, boot="boot-c",
                              ladder=lambda: Entry("boot-b", "the screen stayed black"))
    ladder.start()
    assert published[0].details["by"] == "ladder"
    assert "recovery ladder (the screen stayed black)" in ladder.snapshot()["last_boot"]["words"]


def test_a_damaged_mark_is_said_and_counts_as_none(tmp_path, caplog):
    sys_, proc = _tree(tmp_path)
    (sys_ / "fs/pstore/dmesg-ramoops-0").unlink()
    (sys_ / "class/watchdog/watchdog0/bootstatus").unlink()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / last_boot.MARK_FILE).write_text("{not json")
    part, published = _part(tmp_path, sys_, proc)
    part.start()
    assert published[0].details["cause"] == "power-loss"
    assert "makes no sense" in caplog.text and "Traceback" not in caplog.text


def test_turns_read_on_the_slow_timer_and_one_small_file_between(tmp_path):
    sys_, proc = _tree(tmp_path, "22 1 179:2 / / rw,noatime - ext4 /dev/root rw\n")
    changed = []
    part, published = _part(tmp_path, sys_, proc, on_change=lambda: changed.append(1))
    part.turn(0.0)
    assert part.storage.verdict == "failing" and changed
    assert [e.type for e in published] == ["device.storage", "device.power"]
    assert published[1].details["now"] == ["under-voltage", "throttled"]
    mountinfo = "22 1 179:2 / / rw,noatime - ext4 /dev/root rw,errors=remount-ro,emergency_ro\n"
    (proc / "self/mountinfo").write_text(mountinfo)
    part.turn(5.0)    # not yet: between the reads, one look every 10 s at most
    assert part.storage.verdict == "failing"
    part.turn(10.0)   # ext4's count did not move: nothing else is read
    assert part.storage.verdict == "failing"
    (sys_ / "fs/ext4/mmcblk0p2/errors_count").write_text("3\n")   # the error that made it ro
    part.turn(20.0)
    assert part.storage.verdict == "read-only" and part.storage.reading.errors["errors_count"] == 3
    assert published[-1].details["was"] == "failing"

    # no ext4 behind the state directory: mountinfo is the look between the reads
    for name in os.listdir(sys_ / "fs/ext4/mmcblk0p2"):
        (sys_ / "fs/ext4/mmcblk0p2" / name).unlink()
    (proc / "self/mountinfo").write_text("22 1 179:2 / / rw,noatime - f2fs /dev/root rw\n")
    other, published = _part(tmp_path, sys_, proc)
    other.turn(0.0)
    assert other.storage.verdict == "worn", "the eMMC says 80-90 % of its life is used"
    (proc / "self/mountinfo").write_text("22 1 179:2 / / ro,noatime - f2fs /dev/root ro\n")
    other.turn(10.0)
    assert other.storage.verdict == "read-only" and published[-1].details["was"] == "worn"


def test_a_first_start_here_is_told_apart_from_a_power_loss(tmp_path):
    sys_, proc = _tree(tmp_path)
    (sys_ / "fs/pstore/dmesg-ramoops-0").unlink()
    (sys_ / "class/watchdog/watchdog0/bootstatus").unlink()
    (proc / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n")
    (tmp_path / "state").mkdir()
    device_id = tmp_path / "state" / "device_id"
    device_id.write_text("ea-0123456789abcdef\n")   # made now: after that boot
    part, published = _part(tmp_path, sys_, proc)
    part.start()
    assert published[0].details["cause"] == "first-start"
    os.utime(device_id, (1600000000, 1600000000))    # made in a boot before: an agent ran
    (tmp_path / "run" / "boot-cause.json").unlink()
    part, published = _part(tmp_path, sys_, proc)
    part.start()
    assert published[0].details["cause"] == "power-loss"


def test_the_assembled_part_asks_the_ladders_book_and_the_command_core(tmp_path):
    from types import SimpleNamespace as NS
    sys_, proc = _tree(tmp_path)
    (sys_ / "fs/pstore/dmesg-ramoops-0").unlink()
    (sys_ / "class/watchdog/watchdog0/bootstatus").unlink()
    (tmp_path / "state").mkdir()
    (tmp_path / "run").mkdir()
    config = NS(device=NS(enabled=True, every_s=60.0, watchdog_s=None),
                state_dir=str(tmp_path / "state"),
                runtime=NS(dir=str(tmp_path / "run")), debug=NS(sysfs=str(sys_)))
    running = {"reboot": ["c-1"]}
    core = NS(running=lambda name: running.get(name, []))
    part = assemble(config, True, lambda e: None, lambda: None, lambda: None, lambda: core,
                    proc=str(proc))
    part.stop()
    mark = json.loads((tmp_path / "state" / last_boot.MARK_FILE).read_text())
    assert mark["by"] == "fleet"
    book = NS(last_before_this_boot=lambda: Entry(mark["boot"], "the player stayed down"))
    published = []
    nxt = assemble(config, True, published.append, lambda: None, lambda: NS(book=book),
                   lambda: None, proc=str(proc))
    nxt.start()
    assert (published[0].details["by"], published[0].details["why"]) == \
        ("ladder", "the player stayed down")


def test_off_reads_nothing(tmp_path):
    class Config:
        class device:
            enabled = False
    off = assemble(Config, True, lambda e: None, lambda: None, lambda: None, lambda: None)
    assert isinstance(off, Off) and off.snapshot() is None
    off.start(), off.turn(1.0), off.stop()


# -- what the operator and the metrics see -------------------------------------------------
def test_status_lines_and_metric_series():
    device = {"storage": {"verdict": "failing", "reasons": ["ext4 recorded 2 errors"],
                          "disk": "mmcblk0", "card": {"name": "BJTD4R"}, "size_bytes": 32 * GIB,
                          "written_bytes_per_day": 512 << 20, "card_writes_per_day": 0.0156},
              "power": {"now": ["under-voltage"], "since_boot": ["under-voltage", "throttled"],
                        "source": "firmware"},
              "last_boot": {"cause": "power-loss", "at": None,
                            "words": "no clean record: a power loss"}}
    assert words.lines(device) == [
        "card        failing: ext4 recorded 2 errors (mmcblk0, BJTD4R, 32.0 GiB, "
        "512 MiB written a day (0.0156 of the card))",
        "power       under-voltage; since boot: under-voltage, throttled (from the firmware)",
        "last boot   ended with no clean record: a power loss"]
    assert words.lines({"storage": "odd", "power": [], "last_boot": 3}) == []
    text = render({"device": device, "link": {"state": "online"}}, True)
    assert "card        failing" in text and "last boot   ended with" in text
    gauges = {(n, labels): v for n, labels, v in gauges_of({"device": device})}
    assert gauges[("device_storage_verdict", (("verdict", "failing"),))] == 1.0
    assert gauges[("device_storage_verdict", (("verdict", "ok"),))] == 0.0
    assert gauges[("device_power_flag", (("flag", "under-voltage"),))] == 1.0
    assert gauges[("device_power_flag", (("flag", "throttled"),))] == 0.0
    assert gauges[("device_written_bytes_per_day", ())] == 512 << 20


# -- the real kernel: a loop-mounted ext4 that fails as a card does ---------------------------
@pytest.fixture
def card(tmp_path):
    from devtools.card import SdCard
    with SdCard(tmp_path) as card:
        (card.mountpoint / "state").mkdir()
        yield card


def _ext4(card) -> Path:
    return Path("/sys/fs/ext4") / os.path.basename(card.device)


def _wait_verdict(read, want: str, timeout: float = 10.0) -> str:
    deadline, verdict = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        verdict = storage.judge(read())[0]
        if verdict == want:
            return verdict
        time.sleep(0.1)
    return verdict


def test_a_real_ext4_goes_failing_then_read_only_as_the_kernel_counts_it(card):
    reader = DeviceReader(str(card.mountpoint / "state"))
    r = reader.storage()
    assert r.mount.point == str(card.mountpoint) and r.mount.source == card.device
    assert r.disk == os.path.basename(card.device) and r.size_bytes == card.size_mb << 20
    assert storage.judge(r) == ("ok", []) and r.errors.get("errors_count") == 0
    before = r.sectors_written
    (card.mountpoint / "state" / "x").write_bytes(os.urandom(1 << 20))
    os.sync()
    assert reader.storage().sectors_written >= before + 2048, "the block device's count"

    # an error ext4 keeps going after (errors=continue): counted, still writable
    subprocess.run(["mount", "-o", "remount,errors=continue", str(card.mountpoint)], check=True)
    (_ext4(card) / "trigger_fs_error").write_text("test: an error the card survives\n")
    assert _wait_verdict(reader.storage, "failing") == "failing"
    assert not reader.mount().read_only

    # as Raspberry Pi OS mounts its root: ext4 makes itself read-only at the error
    card.fail()
    mount = reader.mount()
    assert mount.read_only and mount.emergency, "Linux 6.x: rw, with emergency_ro"
    verdict, reasons = storage.judge(reader.storage())
    assert verdict == "read-only" and reasons[0].startswith("ext4 made")
    card.repair()


def _device(agent, what: str = "storage"):
    return (agent.status().get("device") or {}).get(what) or {}


def _events(server, device_id: str, kind: str) -> list:
    return [e for e in server.device(device_id).get("events", []) if e.get("type") == kind]


@pytest.mark.netns
def test_a_real_agent_says_its_card_failing_then_read_only_within_a_read(
        netns, fleet, card, spawn_agent, agent_python, tmp_path):
    from devtools.harness import agent_config, wait_for
    server = fleet()
    cfg = agent_config(server, tmp_path, identity={"state_dir": str(card.mountpoint / "state")},
                       device={"every_s": 1.0})
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    first = wait_for(lambda: _device(agent), 10, what="the card's first verdict")
    assert first["verdict"] == "ok" and first["disk"] == os.path.basename(card.device)
    assert _device(agent, "last_boot")["cause"] == "first-start", "its device id is new"

    # reading the card writes nothing to it: six reads of everything, not a sector
    stat = Path("/sys/block") / os.path.basename(card.device) / "stat"
    os.sync()
    before = int(stat.read_text().split()[6])
    time.sleep(6.0)
    os.sync()
    assert int(stat.read_text().split()[6]) == before, "the card was written while idle"

    subprocess.run(["mount", "-o", "remount,errors=continue", str(card.mountpoint)], check=True)
    (_ext4(card) / "trigger_fs_error").write_text("test: an error the card survives\n")
    began = time.monotonic()
    wait_for(lambda: _device(agent).get("verdict") == "failing", 6, what="failing")
    failing_s = time.monotonic() - began
    card.fail()
    began = time.monotonic()
    wait_for(lambda: _device(agent).get("verdict") == "read-only", 6, what="read-only")
    read_only_s = time.monotonic() - began
    print(f"failing seen in {failing_s:.1f}s, read-only in {read_only_s:.1f}s "
          f"(every_s 1, heartbeat 2 s)")
    said = wait_for(lambda: len(_events(server, "screen-1", "device.storage")) >= 2 and
                    _events(server, "screen-1", "device.storage"), 10,
                    what="the server to hear both")
    assert [(e["verdict"], e["was"]) for e in said] == [("failing", "ok"),
                                                        ("read-only", "failing")]
    assert said[1]["errors"] >= 1 and said[1]["mount"] == str(card.mountpoint)
    assert agent.stop() == 0
    log = agent.log_text()
    assert log.count("storage: the card is read-only") == 1 and "Traceback" not in log
    assert "the stop mark" in log, "a read-only card cannot keep the mark: said, not raised"
    card.repair()


@pytest.mark.netns
def test_a_real_agent_tells_a_clean_stop_from_no_record_at_the_next_boot(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    from devtools.harness import agent_config, wait_for
    server = fleet()
    cfg = agent_config(server, tmp_path, device={"every_s": 1.0})

    def boot(n: int) -> list:
        """A boot: the runtime directory (tmpfs) empty again, and another boot id than the
        one the last start kept (base/boot.py keeps it in the runtime directory or, since
        a restart empties that, the state directory); the agent's n-th boot said."""
        nonlocal agent
        for path in (tmp_path / "run").iterdir():
            if path.is_file():
                path.unlink()
        (tmp_path / "state" / "last-start-boot-id").write_text("a-boot-before\n")
        agent = spawn_agent(agent_python, cfg)
        agent.wait_live(15)
        return wait_for(lambda: len(_events(server, "screen-1", "device.boot")) >= n and
                        _events(server, "screen-1", "device.boot"), 10, what=f"device.boot {n}")

    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    said = wait_for(lambda: _events(server, "screen-1", "device.boot"), 10, what="device.boot")
    assert said[0]["cause"] == "first-start", "a new install has no boot before to tell"
    agent.proc.kill()   # what a power cut leaves: no orderly stop, no mark
    agent.proc.wait(10)
    mark = tmp_path / "state" / last_boot.MARK_FILE
    assert not mark.exists()
    # the next boot: what the agent wrote is older than it
    btime = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
    for path in (tmp_path / "state").iterdir():   # what the agent wrote: a boot before
        os.utime(path, (btime - 3600, btime - 3600), follow_symlinks=False)
    said = boot(2)
    assert said[1]["cause"] == "power-loss", "no clean record"
    assert agent.stop() == 0
    assert json.loads(mark.read_text())["by"] == ""

    # a restart of the service: the same boot, nothing said again, the mark taken away
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    wait_for(lambda: not mark.exists(), 5, what="the mark taken away")
    assert _device(agent, "last_boot")["cause"] == "power-loss"
    assert agent.stop() == 0
    assert len(_events(server, "screen-1", "device.boot")) == 2, "said once a boot"

    said = boot(3)   # a reboot after the orderly stop
    assert len(said) == 3 and (said[2]["cause"], said[2]["by"]) == ("clean", "operator")
    text = subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert "last boot   ended with a clean shutdown or reboot, asked by an operator" in \
        text.stdout, text.stdout
    assert "the last boot ended with a clean shutdown" in agent.log_text()


@pytest.mark.parametrize("power", [{"now": 5}, {"since_boot": True}, {"now": 1.5}])
def test_the_status_files_power_of_any_shape_is_said_never_a_crash(power):
    """The status file is the agent user's to write: `edge-agent status` (root's too) says
    what it can of an odd power section."""
    said = words.lines({"power": {"source": "firmware", **power}})
    assert said and said[0].startswith("power       ")


@pytest.mark.parametrize("mark", [
    b'{"wall": 1' + b"0" * 400 + b', "boot": "b"}',
    b'{"wall": 1, "boot": "b", "ended": {"cause": "clean", "at": 1' + b"0" * 400 + b"}}"])
def test_a_stop_mark_the_agent_user_wrote_is_refused_or_read_never_raised(mark):
    """device-stop.json is in the state directory: a 400-digit number overflowed float()
    out of parse_mark, past the start's ValueError (the agent's start failed with it)."""
    try:
        got = last_boot.parse_mark(mark)
    except ValueError:
        return
    assert got.ended.at is None
