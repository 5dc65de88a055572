"""The device part's eyes: a thin reader of sysfs and procfs under injectable roots (a
test points them at a fixture tree), each read bounded (base/sysfs.py). Reads only,
never a write: nothing here touches the card but statvfs, which asks the kernel's
counters."""
from __future__ import annotations

import glob
import os

from ..base import sysfs
from ..base.hardware import undervoltage_alarm
from . import last_boot, power, storage

MOUNTINFO_LIMIT = 256 << 10      # a container with many mounts: a few tens of kB
CARD_FACTS = ("name", "type", "cid", "date", "manfid", "oemid")   # MMC's, fixed
STATE_ENTRIES = 256              # a state directory holds a few dozen
PSTORE_ARCHIVE = "/var/lib/systemd/pstore"
PSTORE_RECORDS = 16              # the newest this many are looked at
# the firmware node's parent is the board's: soc on most Pis, scb or soc@... on others;
# looked for once
FIRMWARE_GLOBS = ("devices/platform/soc/soc:firmware/get_throttled",
                  "devices/platform/*/*firmware/get_throttled",
                  "devices/platform/*firmware/get_throttled")


class DeviceReader:
    def __init__(self, state_dir: str, sysfs_root: str = "/sys", proc_root: str = "/proc",
                 pstore_archive: str = PSTORE_ARCHIVE):
        self.state_dir = os.path.realpath(state_dir)
        self.sysfs, self.proc, self.archive = sysfs_root, proc_root, pstore_archive
        self._throttled_path: str | None | bool = False   # False: not looked for yet
        self._disk_of: tuple[str, _Disk | None] | None = None

    # -- storage -----------------------------------------------------------------------
    def mount(self) -> storage.Mount | None:
        """The mount the state directory is on: one read of mountinfo."""
        text = sysfs.read(os.path.join(self.proc, "self/mountinfo"), MOUNTINFO_LIMIT)
        text = text.decode("utf-8", "replace")
        return storage.mount_of(storage.parse_mountinfo(text, self.state_dir), self.state_dir)

    def storage(self, mount: storage.Mount | None = None) -> storage.Reading:
        mount = mount if mount is not None else self.mount()
        if mount is None:
            return storage.Reading()
        disk = self._disk(mount.device)
        avail = total = None
        try:
            st = os.statvfs(self.state_dir)
            avail, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        except OSError:
            pass
        if disk is None:   # no block device behind it (an overlay, a tmpfs, a container)
            return storage.Reading(mount=mount, avail_bytes=avail, total_bytes=total)
        errors = sysfs.ext4_errors(disk.ext4_dir)
        fields = sysfs.text(os.path.join(disk.dev_dir, "stat"), 512).split()
        life = sysfs.text(os.path.join(disk.card_dir, "life_time")).split()[:2]
        return storage.Reading(
            mount=mount, errors={k: v for k, v in errors.items() if v is not None},
            avail_bytes=avail, total_bytes=total, disk=disk.name, size_bytes=disk.size_bytes,
            sectors_written=sysfs.as_int(fields[6]) if len(fields) > 6 else None,
            card=disk.card,
            life_time=tuple(x for x in map(sysfs.as_hex_byte, life) if x is not None),
            pre_eol=sysfs.as_hex_byte(sysfs.text(os.path.join(disk.card_dir, "pre_eol_info"))))

    def errors_count(self) -> int | None:
        """ext4's error count of the device last read, one small read (between the full
        reads: ext4 counts the error that makes it read-only); None where there is no
        ext4 behind the state directory."""
        disk = self._disk_of[1] if self._disk_of is not None else None
        if disk is None:
            return None
        return sysfs.as_int(sysfs.text(os.path.join(disk.ext4_dir, "errors_count")))

    def _disk(self, device: str) -> "_Disk | None":
        """Where the kernel keeps the block device ``major:minor`` and its card's fixed
        facts: looked up once per device (the reads a minute are the counters only)."""
        if self._disk_of is None or self._disk_of[0] != device:
            self._disk_of = (device, _Disk.find(self.sysfs, device))
        return self._disk_of[1]

    # -- power -------------------------------------------------------------------------
    def throttled(self) -> int | None:
        """The firmware's throttled word; None where the kernel has no such file."""
        if self._throttled_path is False:
            found = [p for pattern in FIRMWARE_GLOBS
                     for p in sorted(glob.glob(os.path.join(glob.escape(self.sysfs), pattern)))]
            self._throttled_path = found[0] if found else None
        if not self._throttled_path:
            return None
        return power.parse_word(sysfs.text(self._throttled_path, 32))

    def undervoltage(self) -> str | None:
        return undervoltage_alarm(self.sysfs)

    # -- the boot before ---------------------------------------------------------------
    def crashes(self) -> list[last_boot.Crash]:
        """pstore's dmesg records, the newest PSTORE_RECORDS, each by its first line."""
        out = []
        directory = os.path.join(self.sysfs, "fs/pstore")
        try:
            names = sorted(n for n in os.listdir(directory) if n.startswith("dmesg-"))
        except OSError:   # none, or root's (0750): the archive may still have it
            names = []
        for name in names[-PSTORE_RECORDS:]:
            path = os.path.join(directory, name)
            head = sysfs.read(path, 256).decode("utf-8", "replace").split("\n", 1)[0]
            kind = last_boot.crash_kind(name, head)
            try:
                wall = os.stat(path).st_mtime
            except OSError:
                continue
            if kind:
                out.append(last_boot.Crash(sysfs.clean(name, 64), kind, wall))
        return out + self._archived()

    def _archived(self) -> list[last_boot.Crash]:
        """What systemd-pstore (on by default in Debian) moved out of pstore at boot into
        its archive, 0755 and so readable by the agent where pstore itself is root's: a
        record of the kernel's log, which the kernel keeps only at a panic or an oops
        (unless printk.always_kmsg_dump is set), named dmesg* or a directory holding one.
        Names and times only: no file of it is read."""
        out = []
        try:
            with os.scandir(self.archive) as entries:
                found = sorted(((e.stat(follow_symlinks=False).st_mtime, e.name, e.is_dir(
                    follow_symlinks=False)) for e in entries), reverse=True)[:PSTORE_RECORDS]
        except OSError:
            return []
        for wall, name, is_dir in found:
            try:
                held = os.listdir(os.path.join(self.archive, name)) if is_dir else [name]
            except OSError:
                continue
            if any(n.startswith("dmesg") for n in held[:64]):
                out.append(last_boot.Crash(sysfs.clean(name, 64), "crash", wall))
        return out

    def first_run_here(self) -> bool:
        """Whether nothing in the state directory was changed before this boot (each
        entry's mtime against /proc/stat's btime): an agent that ran in an earlier boot
        left something older. False where it cannot be told."""
        booted = None
        for line in sysfs.read(os.path.join(self.proc, "stat"), 64 << 10).splitlines():
            if line.startswith(b"btime "):
                booted = sysfs.as_int(line[6:].decode("ascii", "replace").strip())
        if booted is None:
            return False
        try:
            with os.scandir(self.state_dir) as entries:
                for n, entry in enumerate(entries):
                    if n >= STATE_ENTRIES or entry.stat(follow_symlinks=False).st_mtime < booted:
                        return False
        except OSError:
            return False
        return True

    def system_watchdog(self):
        """/dev/watchdog0 as sysfs says it (base/system_watchdog.Device), or None."""
        return sysfs.watchdog(self.sysfs)

    def watchdog_status(self) -> int | None:
        text = sysfs.text(os.path.join(self.sysfs, "class/watchdog/watchdog0/bootstatus"))
        return sysfs.as_int(text)


class _Disk:
    """A block device's places in sysfs, and what does not change while it is there."""

    def __init__(self, dev_dir: str, ext4_dir: str, disk_dir: str, size_bytes: int | None,
                 card: dict):
        self.dev_dir, self.ext4_dir, self.disk_dir = dev_dir, ext4_dir, disk_dir
        self.card_dir = os.path.join(disk_dir, "device")
        self.name, self.size_bytes, self.card = os.path.basename(disk_dir), size_bytes, card

    @classmethod
    def find(cls, sysfs_root: str, device: str) -> "_Disk | None":
        link = os.path.join(sysfs_root, "dev/block", device)
        if not os.path.exists(link) or "/" in device:
            return None
        dev_dir = os.path.realpath(link)
        # a partition's disk is the directory above it (mmcblk0p2 in mmcblk0)
        disk_dir = (os.path.dirname(dev_dir) if os.path.exists(os.path.join(dev_dir, "partition"))
                    else dev_dir)
        size = sysfs.as_int(sysfs.text(os.path.join(disk_dir, "size")))
        card = {key: sysfs.text(os.path.join(disk_dir, "device", key), 64)
                for key in CARD_FACTS}
        return cls(dev_dir, os.path.join(sysfs_root, "fs/ext4", os.path.basename(dev_dir)),
                   disk_dir, None if size is None else size * storage.SECTOR,
                   {k: v for k, v in card.items() if v})
