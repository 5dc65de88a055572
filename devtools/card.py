"""A stand-in SD card: an ext4 file system on a loop device, which can lose power.

ext4 is mounted as Raspberry Pi OS mounts its root (ordered data, noatime), with the
periodic journal commit pushed out to 5 minutes, so that within a test only what a
program synced has reached the "card". ``power_cut()`` then keeps exactly that: it
copies the image as the loop device holds it (the page cache, with every write not
yet synced, is what a power cut takes away), unmounts, and mounts the copy after the
journal replay a boot would do. ``bytes_written()`` is what the card was asked to
write, journal included: the wear figure.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

MOUNT_OPTIONS = "loop,noatime,data=ordered,commit=300"


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


class SdCard:
    def __init__(self, workdir: Path, size_mb: int = 128):
        self.image = workdir / "card.img"
        self.mountpoint = workdir / "card"
        self.size_mb = size_mb

    def __enter__(self) -> "SdCard":
        missing = [t for t in ("mkfs.ext4", "e2fsck", "losetup") if shutil.which(t) is None]
        if os.geteuid() != 0 or missing:
            raise RuntimeError(f"an SD card stand-in needs root and {', '.join(missing) or 'loop devices'}")
        with open(self.image, "wb") as f:
            f.truncate(self.size_mb << 20)
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(self.image))
        self.mountpoint.mkdir(exist_ok=True)
        self._mount()
        return self

    def __exit__(self, *_):
        self._umount()
        self.image.unlink(missing_ok=True)

    def _mount(self) -> None:
        _run("mount", "-o", MOUNT_OPTIONS, str(self.image), str(self.mountpoint))
        self.device = _run("findmnt", "-n", "-o", "SOURCE", str(self.mountpoint)).strip()

    def _umount(self) -> None:
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", str(self.mountpoint)], check=True)

    def power_cut(self) -> None:
        """Whatever was not synced is gone; the card comes back as a reboot finds it."""
        snapshot = self.image.with_suffix(".cut")
        shutil.copyfile(self.image, snapshot)
        self._umount()
        os.replace(snapshot, self.image)
        r = subprocess.run(["e2fsck", "-p", str(self.image)], capture_output=True, text=True)
        if r.returncode >= 4:  # 1 and 2: fixed (the journal replayed); 4+: damage left
            raise RuntimeError(f"e2fsck after the power cut: {r.returncode} {r.stdout} {r.stderr}")
        self._mount()

    def remount(self, mode: str) -> None:
        """``ro`` or ``rw``, as an operator would (ro needs no file open for writing)."""
        _run("mount", "-o", f"remount,{mode}", str(self.mountpoint))

    def fail(self) -> None:
        """The usual death of a card: ext4 meets an error (here through its own debug
        switch) and, as Raspberry Pi OS mounts it (errors=remount-ro), remounts itself
        read-only under whoever has files open; what was not synced is gone."""
        _run("mount", "-o", "remount,errors=remount-ro", str(self.mountpoint))
        Path(f"/sys/fs/ext4/{os.path.basename(self.device)}/trigger_fs_error").write_text(
            "devtools: the card failed\n")
        if not self.read_only():
            raise RuntimeError("ext4 did not remount the card read-only after the error")

    def read_only(self) -> bool:
        """Asked of the file system itself: since Linux 6.x an ext4 that remounted itself
        read-only still says rw in statvfs and /proc/mounts (``emergency_ro``)."""
        probe = self.mountpoint / ".devtools-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as e:
            if e.errno == errno.EROFS:
                return True
            raise
        os.close(fd)
        probe.unlink()
        return False

    def repair(self) -> None:
        """What a technician does after a failure: unmount, fsck, mount read-write. A
        loop device the unmount left attached (busy a moment longer on a loaded
        machine) would be reused by mount with the failed file system's cached
        superblock, read-only again: such devices are detached first."""
        self._umount()
        if not self._detach_loops():
            # the kernel still holds the loop (an errored ext4 let go late: CI's four
            # streams, once): the card's bytes go on in a fresh file, which the next
            # mount attaches anew, as a technician images a card that will not let go
            fresh = self.image.with_suffix(".fresh")
            shutil.copyfile(self.image, fresh)
            os.replace(fresh, self.image)
        r = subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True, text=True)
        if r.returncode >= 4:
            raise RuntimeError(f"e2fsck after the failure: {r.returncode} {r.stdout} {r.stderr}")
        self._mount()
        if self.read_only():
            raise RuntimeError(f"{self.mountpoint}: still read-only after e2fsck and a fresh mount")

    DETACH_WITHIN_S = 10.0

    def _detach_loops(self) -> bool:
        """Whether no loop device is left on the image within DETACH_WITHIN_S."""
        deadline = time.monotonic() + self.DETACH_WITHIN_S
        while True:
            loops = [line.split(":", 1)[0] for line in
                     _run("losetup", "-j", str(self.image)).splitlines() if line.strip()]
            if not loops:
                return True
            for loop in loops:
                subprocess.run(["losetup", "-d", loop], capture_output=True)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def bytes_written(self) -> int:
        """Bytes the file system has sent to the card so far (after syncing it)."""
        os.sync()
        stat = Path(f"/sys/block/{os.path.basename(self.device)}/stat").read_text().split()
        return int(stat[6]) * 512
