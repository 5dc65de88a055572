"""The card's verdict, before a write fails, from what the kernel already counts: sans
I/O. The reader (reader.py) hands a ``Reading`` of the mount that holds the state
directory; ``StorageJudge`` says ok, worn, full, failing or read-only, with its reasons,
and whether that is news.

- **read-only**: the mount holding the state directory is read-only (mountinfo): ext4
  makes itself so after an error under ``errors=remount-ro``, as Raspberry Pi OS mounts
  its root. Nothing the agent writes lands. Since Linux 6.x ext4 no longer flips the
  mount to ``ro`` for it: mountinfo still says ``rw`` and adds ``emergency_ro`` to the
  super options (statvfs and access() say writable too), so both are looked for.
- **failing**: ext4 recorded errors on it (``/sys/fs/ext4/<dev>/errors_count``, kept in the
  superblock until fsck clears them), or the card says its end is near (eMMC PRE_EOL_INFO
  urgent, a life time estimate exceeded).
- **full**: less than FULL_BYTES (or FULL_SHARE of it) left to the agent. Kept apart from
  failing: a full card is healthy, it needs room, not replacing.
- **worn**: the card says most of its life is used (an estimate at 80 % or more, or
  PRE_EOL_INFO warning).

The most severe one is the verdict; every one that holds is a reason. Bytes written a day
come from the block device's sectors written since the agent started, said against the
card's size (a card written over in a few days wears out in months).
"""
from __future__ import annotations

from dataclasses import dataclass, field

OK, WORN, FULL, FAILING, READ_ONLY = "ok", "worn", "full", "failing", "read-only"
VERDICTS = (OK, WORN, FULL, FAILING, READ_ONLY)   # least severe first
EVENT = "device.storage"
FULL_BYTES = 16 << 20        # below this left to the agent: full
FULL_SHARE = 0.02            # or below this share of the file system
WORN_LIFE = 9                # eMMC life time estimate 0x09: 80-90 % used
EXCEEDED_LIFE = 11           # 0x0B: past its life
PRE_EOL_WARNING, PRE_EOL_URGENT = 2, 3
RATE_AFTER_S = 600.0         # bytes a day are said once this much has been counted
DAY = 86400.0
SECTOR = 512                 # /sys/block/*/stat and size count 512-byte sectors


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo."""
    point: str
    device: str                # major:minor
    source: str
    fstype: str
    read_only: bool
    emergency: bool = False    # ext4 made itself read-only after an error (emergency_ro)


def parse_mountinfo(text: str, above: str | None = None) -> list[Mount]:
    """The mounts of /proc/self/mountinfo's text; a line it cannot read is left out.
    ``above``: only the mounts whose point is that path or above it (a minute's read
    builds no record of the other mounts)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        point = _unescape(fields[4])
        if above is not None and not _holds(point, above):
            continue
        try:
            dash = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < dash + 3:
            continue
        options = set(fields[5].split(",")) | set(fields[dash + 3].split(",")
                                                    if len(fields) > dash + 3 else ())
        mounts.append(Mount(point, fields[2], _unescape(fields[dash + 2]), fields[dash + 1],
                            bool(options & {"ro", "emergency_ro"}), "emergency_ro" in options))
    return mounts


def _holds(point: str, path: str) -> bool:
    point = point.rstrip("/") or "/"
    return path == point or path.startswith(point if point == "/" else point + "/")


def _unescape(field: str) -> str:
    """mountinfo writes a space, a tab, a newline and a backslash as \\ooo."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_of(mounts: list[Mount], path: str) -> Mount | None:
    """The mount a (resolved, absolute) path lives on: the last of the longest mount
    points above it (a later mount over the same point hides the earlier)."""
    best = None
    for m in mounts:
        if _holds(m.point, path) and (
                best is None or len(m.point.rstrip("/")) >= len(best.point.rstrip("/"))):
            best = m
    return best


@dataclass(frozen=True)
class Reading:
    """What the kernel says of the state directory's card at one read; None: not there."""
    mount: Mount | None = None
    errors: dict = field(default_factory=dict)   # ext4's errors_count, first/last_error_time
    avail_bytes: int | None = None               # left to the agent (statvfs f_bavail)
    total_bytes: int | None = None
    disk: str = ""                               # the whole disk (mmcblk0, loop1)
    size_bytes: int | None = None                # the disk's size
    sectors_written: int | None = None           # since the kernel saw the device
    card: dict = field(default_factory=dict)     # MMC name, cid, date, type, manfid
    life_time: tuple = ()                        # eMMC estimates A and B, 1..11
    pre_eol: int | None = None                   # eMMC PRE_EOL_INFO, 1..3


def judge(r: Reading) -> tuple[str, list[str]]:
    """(the verdict, every reason that holds, the most severe first)."""
    found: list[tuple[str, str]] = []
    if r.mount is not None and r.mount.read_only:
        found.append((READ_ONLY, f"ext4 made {r.mount.point} read-only after an error"
                      if r.mount.emergency else f"{r.mount.point} is mounted read-only"))
    errors = r.errors.get("errors_count")
    if errors:
        found.append((FAILING, f"ext4 recorded {errors} error{'s' if errors != 1 else ''}"))
    if r.pre_eol == PRE_EOL_URGENT:
        found.append((FAILING, "the card's pre-EOL says urgent"))
    life = max((x for x in r.life_time if isinstance(x, int)), default=None)
    if life is not None and life >= EXCEEDED_LIFE:
        found.append((FAILING, "the card's life time estimate is exceeded"))
    if r.avail_bytes is not None and r.total_bytes:
        if r.avail_bytes < max(FULL_BYTES, int(r.total_bytes * FULL_SHARE)):
            found.append((FULL, f"{r.avail_bytes >> 20} MiB left of {r.total_bytes >> 20} MiB"))
    if r.pre_eol == PRE_EOL_WARNING:
        found.append((WORN, "the card's pre-EOL says warning"))
    if life is not None and WORN_LIFE <= life < EXCEEDED_LIFE:
        found.append((WORN, f"the card says {(life - 1) * 10}-{life * 10}% of its life is used"))
    found.sort(key=lambda f: -VERDICTS.index(f[0]))
    return (found[0][0] if found else OK), [why for _, why in found]


class StorageJudge:
    """The verdict at each read, news only on a change (the first verdict is news when it
    is not ok), and the write rate since the agent started."""

    def __init__(self):
        self.verdict: str | None = None
        self.reasons: list[str] = []
        self.reading = Reading()
        self._first: tuple[float, int] | None = None   # (monotonic, sectors) at the start
        self.bytes_per_day: int | None = None

    def feed(self, r: Reading, now: float) -> dict | None:
        """The reading at monotonic ``now``; the event's details when the verdict changed."""
        self.reading = r
        self._rate(r, now)
        verdict, reasons = judge(r)
        was, self.verdict, self.reasons = self.verdict, verdict, reasons
        if verdict == was or (was is None and verdict == OK):
            return None
        return {"verdict": verdict, "was": was, "reasons": reasons, **self._facts()}

    def _rate(self, r: Reading, now: float) -> None:
        sectors = r.sectors_written
        if sectors is None:
            return
        if self._first is None or sectors < self._first[1]:   # a new device, a reset count
            self._first, self.bytes_per_day = (now, sectors), None
            return
        elapsed = now - self._first[0]
        if elapsed >= RATE_AFTER_S:
            self.bytes_per_day = int((sectors - self._first[1]) * SECTOR * DAY / elapsed)

    def _facts(self) -> dict:
        r = self.reading
        out: dict = {"mount": r.mount.point if r.mount else None,
                     "source": r.mount.source if r.mount else None, "disk": r.disk or None,
                     "errors": r.errors.get("errors_count"),
                     "first_error_at": r.errors.get("first_error_time") or None,
                     "last_error_at": r.errors.get("last_error_time") or None,
                     "avail_bytes": r.avail_bytes, "size_bytes": r.size_bytes,
                     "written_bytes_per_day": self.bytes_per_day}
        if self.bytes_per_day is not None and r.size_bytes:
            out["card_writes_per_day"] = round(self.bytes_per_day / r.size_bytes, 4)
        if r.card:
            out["card"] = dict(r.card)
        return out

    def snapshot(self) -> dict | None:
        if self.verdict is None:
            return None
        return {"verdict": self.verdict, "reasons": list(self.reasons), **self._facts()}
