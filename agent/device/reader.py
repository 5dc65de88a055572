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
PSTORE_RECORDS = 16              # the newest this many are looked at
FIRMWARE_GLOBS = ("devices/platform/soc/soc:firmware/get_throttled",
                  "devices/platform/soc*/*firmware/get_throttled")


class DeviceReader:
    def __init__(self, state_dir: str, sysfs_root: str = "/sys", proc_root: str = "/proc"):
        self.state_dir = os.path.realpath(state_dir)
        self.sysfs, self.proc = sysfs_root, proc_root
        self._throttled_path: str | None | bool = False   # False: not looked for yet

    # -- storage -----------------------------------------------------------------------
    def mount(self) -> storage.Mount | None:
        """The mount the state directory is on: one read of mountinfo."""
        text = sysfs.read(os.path.join(self.proc, "self/mountinfo"), MOUNTINFO_LIMIT)
        return storage.mount_of(storage.parse_mountinfo(text.decode("utf-8", "replace")),
                                self.state_dir)

    def storage(self, mount: storage.Mount | None = None) -> storage.Reading:
        mount = mount if mount is not None else self.mount()
        if mount is None:
            return storage.Reading()
        device = os.path.join(self.sysfs, "dev/block", mount.device)
        name = os.path.basename(os.path.realpath(device)) if os.path.exists(device) else ""
        disk_dir = os.path.realpath(device)
        if os.path.exists(os.path.join(disk_dir, "partition")):
            disk_dir = os.path.dirname(disk_dir)
        errors = sysfs.ext4_errors(os.path.join(self.sysfs, "fs/ext4", name)) if name else {}
        avail = total = None
        try:
            st = os.statvfs(self.state_dir)
            avail, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        except OSError:
            pass
        written = None
        if name:
            fields = sysfs.text(os.path.join(os.path.realpath(device), "stat"), 512).split()
            written = sysfs.as_int(fields[6]) if len(fields) > 6 else None
        size = sysfs.as_int(sysfs.text(os.path.join(disk_dir, "size"))) if name else None
        card_dir = os.path.join(disk_dir, "device")
        card = {key: sysfs.text(os.path.join(card_dir, key), 64)
                for key in ("name", "type", "cid", "date", "manfid", "oemid")} if name else {}
        life = tuple(sysfs.as_hex_byte(word) for word in
                     sysfs.text(os.path.join(card_dir, "life_time")).split()[:2]) if name else ()
        pre_eol = sysfs.as_hex_byte(sysfs.text(os.path.join(card_dir, "pre_eol_info"))) \
            if name else None
        return storage.Reading(
            mount=mount, errors={k: v for k, v in errors.items() if v is not None},
            avail_bytes=avail, total_bytes=total, disk=os.path.basename(disk_dir) if name else "",
            size_bytes=None if size is None else size * storage.SECTOR,
            sectors_written=written, card={k: v for k, v in card.items() if v},
            life_time=tuple(x for x in life if x is not None), pre_eol=pre_eol)

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
        except OSError:
            return []
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
        return out

    def watchdog_status(self) -> int | None:
        text = sysfs.text(os.path.join(self.sysfs, "class/watchdog/watchdog0/bootstatus"))
        return sysfs.as_int(text)
