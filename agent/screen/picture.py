"""Picture health: is the screen black, frozen or ok (sans I/O).

The shell (watch.py) captures the screen now and then (capture.py), folds it into a
small grey thumbnail plus what only the whole picture says (its brightest pixel, a
checksum of its rows, every row read), and hands this judge what it measured, or why
it could not:

- **black**: the brightest detail is dark: the picture's brightest pixel is below
  ``black_luma`` and stands less than ``black_contrast`` above the ground (the median
  level). A starfield, a small clock or a logo on black, dim text on near-black, a dark
  video frame, a night scene each have a detail that is not; a blank frame has none.
  (The thumbnail's averages cannot tell: a few hundred white dots average to black.)
- **frozen**: only on a screen whose content is declared to move. The same picture,
  pixel for pixel (its rows' checksums), for ``frozen_after_s`` on the monotonic
  clock: a ticker crawling 2 px or a clock's minute is movement. A static menu board
  is never frozen.
- **ok**: anything else.
- **dark**: the display is off by schedule or by command. Nothing is judged (the shell
  captures nothing) and the frozen timer starts again when the display comes back.

Events on change only: a first black or frozen, and a change between them or back to
ok; the first ok after start is no news. A verdict left for dark and found again after
it is not told twice. A capture that fails is counted; it is told (``CheckFailed``) when
its reason is new, and at most once an hour whatever it says, so a capture that flaps
never makes a storm. A screen with no means to capture (no tool, no Pillow) is no
failure: the shell says so in its snapshot and asks again rarely.

Inputs: ``Checked`` (a ``Measure``, the time), ``Dark`` (why, the time), ``Failed`` (why,
the time). Effects: ``Changed`` (a new verdict, whether it is news), ``CheckFailed``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

OK, BLACK, FROZEN, DARK = "ok", "black", "frozen", "dark"
JUDGED = (OK, BLACK, FROZEN)

FAILURE_QUIET_S = 3600.0  # a failing capture is told at most this often
HASH_W, HASH_H = 9, 8    # a difference hash of 8 rows of 8 left-right differences
MAX_WHY = 200


@dataclass(frozen=True)
class Picture:
    """What a capture gives the judge: a small grey thumbnail (one byte of luminance a
    cell, row by row, each the mean of its part of the screen), and of the whole picture
    at full size, every row of it, its brightest pixel and its rows' checksums (none
    given: the thumbnail's own, a picture made small already)."""
    width: int
    height: int
    pixels: bytes
    peak: int = -1           # the brightest pixel at full size (-1: the thumbnail's)
    signature: tuple = ()    # a checksum of each band of rows at full size (empty: of the
                             # thumbnail's rows)


@dataclass(frozen=True)
class Measure:
    mean: float          # luminance, 0-255
    contrast: float      # the standard deviation of the cells' luminance
    dhash: int           # 64 bits: does each cell of an 9x8 grid darken to its right
    bright: int = 0      # the brightest pixel: the detail (a star, a line of text)
    ground: int = 0      # the cells' median level: what the detail stands on
    signature: tuple = ()  # the picture's rows, checksummed: whether any pixel changed


def measure(picture: Picture) -> Measure:
    """A picture's statistics; a few thousand cells, well under a millisecond."""
    w, h, px = picture.width, picture.height, picture.pixels
    if w <= 0 or h <= 0 or len(px) != w * h:
        raise ValueError(f"a picture of {w}x{h} has {len(px)} pixels")
    n = w * h
    mean = sum(px) / n
    variance = max(0.0, sum(v * v for v in px) / n - mean * mean)
    signature = picture.signature or tuple(zlib.adler32(px[y * w:(y + 1) * w])
                                           for y in range(h))
    bright = picture.peak if picture.peak >= 0 else max(px)
    return Measure(mean, variance ** 0.5, dhash(picture), bright, sorted(px)[n // 2],
                   signature)


def dhash(picture: Picture) -> int:
    """The picture averaged into a 9x8 grid of cells; a bit per left-right pair, set where
    the left cell is brighter. The same scene gives the same bits whatever its size."""
    w, h, px = picture.width, picture.height, picture.pixels
    xs = [(i * w // HASH_W, max(i * w // HASH_W + 1, (i + 1) * w // HASH_W))
          for i in range(HASH_W)]
    ys = [(j * h // HASH_H, max(j * h // HASH_H + 1, (j + 1) * h // HASH_H))
          for j in range(HASH_H)]
    bits = 0
    for y0, y1 in ys:
        y0, y1 = min(y0, h - 1), min(y1, h)
        row = []
        for x0, x1 in xs:
            x0, x1 = min(x0, w - 1), min(x1, w)
            cell = sum(sum(px[y * w + x0:y * w + x1]) for y in range(y0, y1))
            row.append(cell / ((x1 - x0) * (y1 - y0)))
        for left, right in zip(row, row[1:]):
            bits = (bits << 1) | (left > right + 1.0)   # a level of noise is no edge
    return bits


def same(a: Measure, b: Measure) -> bool:
    """The same picture, pixel for pixel: every band of its rows checksums the same. A
    clock's minute, a ticker's crawl of 2 px, a fade, a blinking cursor are each
    movement; a screen's pixels are read from its frame buffer, never noisy."""
    return a.signature == b.signature and a.mean == b.mean


def is_black(m: Measure, black_luma: float, black_contrast: float) -> bool:
    """Black: the brightest pixel is dark (below ``black_luma``) and stands less than
    ``black_contrast`` above the ground. A starfield, a small clock, dim text on
    near-black, a night scene each have a detail that is not. A screen's pixels are read
    from its frame buffer: a blank frame has no stray bright one."""
    return m.bright < black_luma and m.bright - m.ground < black_contrast


@dataclass(frozen=True)
class Checked:
    measure: Measure
    now: float


@dataclass(frozen=True)
class Dark:
    why: str             # "off by working hours", "turned off by a display command"
    now: float


@dataclass(frozen=True)
class Failed:
    why: str
    now: float


@dataclass(frozen=True)
class Changed:
    verdict: str
    news: bool           # an event: a first black or frozen, or a change of them
    was: str | None      # the verdict told before (None: none yet)
    details: dict


@dataclass(frozen=True)
class CheckFailed:
    why: str
    failures: int


class Judge:
    def __init__(self, black_luma: float, black_contrast: float, content_moves: bool,
                 frozen_after_s: float):
        self.black_luma, self.black_contrast = black_luma, black_contrast
        self.content_moves, self.frozen_after_s = content_moves, frozen_after_s
        self.verdict: str | None = None     # None until the first check
        self.since: float | None = None     # when the verdict became what it is
        self.told: str | None = None        # the last judged verdict (events compare to it)
        self.last: Measure | None = None
        self.checked_at: float | None = None
        self.dark_why: str | None = None
        self._still: Measure | None = None  # the picture the screen has kept since...
        self._still_since = 0.0             # ...this time
        self.failures = 0
        self.failure: str | None = None     # the last capture's failure, until one works
        self._failure_told: str | None = None
        self._failure_told_at: float | None = None

    def handle(self, event) -> list:
        if isinstance(event, Checked):
            return self._checked(event.measure, event.now)
        if isinstance(event, Dark):
            self._still, self.dark_why = None, event.why[:MAX_WHY]
            return self._become(DARK, event.now, {"why": self.dark_why})
        if isinstance(event, Failed):
            return self._failed(event.why[:MAX_WHY], event.now)
        raise TypeError(f"not an input of the picture's judge: {event!r}")

    def still_for(self, now: float) -> float:
        """How long the screen has shown the same picture (0: it moved at the last look)."""
        return 0.0 if self._still is None else now - self._still_since

    def _checked(self, m: Measure, now: float) -> list:
        self.last, self.checked_at, self.dark_why = m, now, None
        self.failure = self._failure_told = None
        if self._still is None or not same(m, self._still):
            self._still, self._still_since = m, now
        details = {"mean": round(m.mean, 1), "contrast": round(m.contrast, 1),
                   "bright": m.bright}
        if is_black(m, self.black_luma, self.black_contrast):
            verdict = BLACK
        elif self.content_moves and now - self._still_since >= self.frozen_after_s:
            verdict = FROZEN
            details["same_for_s"] = round(now - self._still_since)
        else:
            verdict = OK
        return self._become(verdict, now, details)

    def _become(self, verdict: str, now: float, details: dict) -> list:
        if verdict == self.verdict:
            return []
        self.verdict, self.since = verdict, now
        was, news = self.told, False
        if verdict in JUDGED:
            news = verdict != self.told and not (verdict == OK and self.told is None)
            self.told = verdict
        return [Changed(verdict, news, was, details)]

    def _failed(self, why: str, now: float) -> list:
        self.failures += 1
        self.failure = why
        quiet = self._failure_told_at is not None \
            and now - self._failure_told_at < FAILURE_QUIET_S
        if why == self._failure_told or quiet:
            return []
        self._failure_told, self._failure_told_at = why, now
        return [CheckFailed(why, self.failures)]
