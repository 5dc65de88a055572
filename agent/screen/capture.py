"""The screen's picture, captured with the platform's tool and folded in memory.

Which tool: ``[screen] capture_command`` when set (it prints a PPM, PNG or JPEG on
stdout); else on Wayland (``WAYLAND_DISPLAY``) ``grim -t ppm -``; else on X11 (the X
display the read-back asks, service.x_display_of) ``xwd -root`` (x11-apps), its dump's
pixels taken by Pillow as they are (a third of the CPU of ImageMagick's ``import``,
measured: most of import's is its own start), else ImageMagick's ``import``, asked for
an 8-bit grey PGM. None of these: no capture on this screen (said, not a failure): a
player drawing straight to KMS (Raspberry Pi OS Lite) has no compositor to ask, and a
KMS capture needs rights the unit does not give (CAP_SYS_ADMIN for a DRM framebuffer's
handle), so its picture is unavailable unless a capture command works under the unit.

ImageMagick's import writes its picture to a temporary file before it prints it (2 MB a
1080p check, on the card where /tmp is on it): every tool runs with its temporary files
(MAGICK_TEMPORARY_PATH, TMPDIR) in ``temp_dir``, a tmpfs (the agent's runtime directory,
else /dev/shm).

A capture runs through base/children.py (its own session, killed at its bound or when
the agent stops), its stderr's tail kept for the failure's words. Its memory is bounded
whatever it prints (the unit has MemoryMax=128M): a raw picture (xwd's dump, a PPM or
PGM: what the agent's own tools print) is folded band by band as it streams by (Fold),
every row of it, a quarter-MiB of rows held at a time (+0.5 MB at 7680x2160); another (a PNG, a
JPEG from a capture command) is held whole, at most MAX_BYTES, and decoded by Pillow
only where its header says the decoded picture fits MAX_DECODED (a JPEG is decoded
smaller instead; a PNG larger is refused, saying so). Pillow (Debian's python3-pil) is
imported at the first capture only, so an agent without it runs and says so. Nothing is
written anywhere.

"""
from __future__ import annotations

import fcntl
import io
import os
import re
import selectors
import shlex
import shutil
import struct
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass

from ..base import children
from .picture import Picture

TIMEOUT_S = 5.0
MAX_BYTES = 32 * 1024 * 1024     # a compressed picture (PNG, JPEG) held whole at most
MAX_PIXELS = 40_000_000          # 8K is 33 M: more is no screen but a decompression bomb
# what a picture Pillow decodes whole may hold, from its header, before it is decoded:
# a 2560x1440 PNG and its grey copy (a raw one streams, a band at a time, whatever its size)
MAX_DECODED = 20 * 1024 * 1024
READ_BYTES = 1 << 20             # the capture's pipe: a frame in a few wake-ups
CHUNK_BYTES = 1 << 18            # a raw picture's rows folded at once, at most (and a read)
MAX_SHOT_BYTES = 1536 * 1024     # a screenshot's JPEG: 2 MiB in base64, what ScreenTinker takes
TRAILER_BYTES = 1 << 16          # a raw picture's stream may run on this far past it
THUMB_SIZE = (64, 64)            # the longer side 64: 64x36 for 16:9
MAX_STDERR = 4096
NO_PILLOW = "picture check needs Pillow (python3-pil)"
TEMP_DIR = "/dev/shm"            # a tmpfs on every Debian: never the card


class NotAPicture(ValueError):
    """What a capture printed is no picture Pillow reads, or too large for a screen."""


@dataclass(frozen=True)
class Shot:
    """What a capture gave: a thumbnail, or why not; ``absent``: this screen has no way
    to capture (no tool, no Pillow), not a failure."""
    picture: Picture | None = None
    why: str = ""
    absent: bool = False


class Capture:
    """One way to capture: ``argv`` run in ``env``; ``how`` says which ("import on :0").
    ``argv`` None: none; ``why`` says why."""

    def __init__(self, argv: list[str] | None, how: str, env: dict | None = None,
                 timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BYTES):
        self.argv, self.how, self.env = argv, how, env
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self._lock = threading.Lock()
        self._running: subprocess.Popen | None = None
        self._stopping = False

    def take(self) -> Shot:
        """A capture, bounded; nothing of it is kept but the thumbnail."""
        fold, shot = self.grab()
        return shot if fold is None else Shot(picture=fold.picture())

    def grab(self, keep: bool = False) -> tuple["Fold | None", Shot]:
        """A capture folded (``keep``: the picture kept too, within MAX_DECODED), or the
        Shot that says why not."""
        if self.argv is None:
            return None, Shot(why=self.how, absent=True)
        Image = pillow()
        if Image is None:
            return None, Shot(why=NO_PILLOW, absent=True)
        try:
            got, why = self._run(Image, keep)
            if why:
                return None, Shot(why=why)
            fold = got if isinstance(got, Fold) else decode(Image, got, keep)
            fold.picture()      # cut short: said here
            return fold, Shot()
        except NotAPicture as e:
            return None, Shot(why=str(e))
        except MemoryError:
            return None, Shot(why="no memory left to decode the capture")

    def stop(self) -> None:
        """From any thread: the capture running is killed, none runs again."""
        with self._lock:
            self._stopping = True
            child = self._running
        if child is not None:
            children.kill_group(child)

    def _run(self, Image, keep: bool) -> tuple["Fold | bytearray", str]:
        argv = self.argv
        try:
            with self._lock:
                if self._stopping:
                    return b"", "not captured: the agent is stopping"
                child = self._running = children.spawn(argv, env=self.env)
        except OSError as e:
            return b"", children.failure(argv, error=e)
        try:
            out, err, why = self._read(child, Image, keep)
        finally:
            with self._lock:
                self._running = None
        if why:
            return b"", why
        if child.returncode != 0:
            return b"", children.failure(argv, exited=child.returncode, stderr=err)
        if not out:
            return b"", f"{children.program(argv)} printed no picture"
        return out, ""

    def _read(self, child: subprocess.Popen, Image, keep: bool
              ) -> tuple["Fold | bytearray", bytes, str]:
        """stdout, stderr's tail, or why not; the child reaped. A raw picture (xwd's dump,
        a PPM) is folded band by band as it streams by (Fold), never held: its header
        bounds what is read; another is held whole, at most max_bytes, one buffer."""
        deadline = time.monotonic() + self.timeout_s
        try:     # a frame in a few reads, not a hundred wake-ups of 64 KiB
            fcntl.fcntl(child.stdout.fileno(), fcntl.F_SETPIPE_SZ, READ_BYTES)
        except OSError:
            pass     # the system's pipe-max-size is smaller: the default pipe, slower
        out, size, err = bytearray(), 0, b""
        fold: Fold | None = None
        limit, decided = self.max_bytes, False
        why = ""
        with selectors.DefaultSelector() as sel:
            sel.register(child.stdout, selectors.EVENT_READ)
            sel.register(child.stderr, selectors.EVENT_READ)
            while sel.get_map() and not why:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = children.failure(self.argv, timeout_s=self.timeout_s)
                    break
                for key, _ in sel.select(left):
                    want = CHUNK_BYTES
                    if fold is not None and key.fileobj is child.stdout:
                        want = max(1, min(fold.wants(), CHUNK_BYTES))
                    block = os.read(key.fileobj.fileno(), want)
                    if not block:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is child.stdout:
                        size += len(block)
                        if size > limit:
                            why = (f"{children.program(self.argv)} printed more than "
                                   f"{_size(limit)}")
                            break
                        if fold is not None:
                            try:
                                fold.take(block)
                            except (ValueError, OSError) as e:   # Pillow's, in one line
                                why = f"the capture is not a picture: {e}"[:200]
                                break
                            continue
                        out += block
                        if not decided and len(out) >= HEAD_BYTES:
                            decided = True
                            try:
                                fold = Fold.of(Image, bytes(out[:HEAD_BYTES]), keep)
                            except NotAPicture as e:
                                why = str(e)
                                break
                            if fold is not None:
                                limit = fold.end + TRAILER_BYTES
                                fold.take(out)
                                out = bytearray()
                    else:
                        err = (err + block)[-MAX_STDERR:]
        if why or self._stopping:
            children.kill_group(child)
        for pipe in (child.stdout, child.stderr):
            pipe.close()
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            children.kill_group(child)
            why = why or children.failure(self.argv, timeout_s=self.timeout_s)
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass    # SIGKILLed; only an uninterruptible sleep keeps it
        if self._stopping and not why:
            why = "not captured: the agent is stopping"
        return (fold if fold is not None else out), err, why


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} bytes"


def pillow():
    """PIL.Image, imported at the first capture; None where it is not installed."""
    try:
        from PIL import Image
    except ImportError:
        return None
    # Pillow refuses a picture of more than twice this (DecompressionBombError, from its
    # header, before decoding); it only warns above it, and no screen comes near
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    return Image


# xwd's dump (X11/XWDFile.h): a header of 25 big-endian 32-bit words, then the window's
# name, the colour map (12 bytes an entry), then the pixels, a row each bytes_per_line
_XWD_WORDS = struct.Struct(">25I")
_XWD_VERSION, _ZPIXMAP, _TRUE_COLOR = 7, 2, 4
# (bits per pixel, red, green, blue masks, byte order) -> Pillow's raw mode
_XWD_RAW = {(32, 0xFF0000, 0xFF00, 0xFF, 0): "BGRX", (32, 0xFF0000, 0xFF00, 0xFF, 1): "XRGB",
            (16, 0xF800, 0x7E0, 0x1F, 0): "BGR;16"}
HEAD_BYTES = 4096     # read before a stream's kind is decided: a header and its colour map
_PNM = re.compile(rb"\AP([56])(?:\s+|#[^\n]*\n)+(\d+)(?:\s+|#[^\n]*\n)+(\d+)"
                  rb"(?:\s+|#[^\n]*\n)+(\d+)\s")


def is_xwd(data: bytes) -> bool:
    return len(data) >= _XWD_WORDS.size and \
        struct.unpack_from(">I", data, 4)[0] == _XWD_VERSION


class Fold:
    """A raw picture (xwd's dump, a PPM or PGM) folded band by band as it streams by:
    every row of it, none held longer than its part of a band (CHUNK_BYTES). Each part
    is made grey, its brightest pixel kept (the detail the judge looks for: a star,
    a line of dim text), its rows checksummed (what moved) and averaged into its row of
    cells.
    ``keep``: the picture itself is also kept, full size where it fits MAX_DECODED, else
    shrunk to fit (a screenshot)."""

    def __init__(self, Image, width: int, height: int, mode: str, raw: str, stride: int,
                 start: int, keep: bool = False):
        self.Image, self.width, self.height = Image, width, height
        self.mode, self.raw, self.stride, self.start = mode, raw, stride, start
        self.end = start + stride * height       # the stream's bytes: the rest is ignored
        self.size = _fit(width, height)
        self.at, self.band, self.row, self.j = 0, bytearray(), 0, 0
        self.chunk_rows = max(1, CHUNK_BYTES // max(1, stride))
        self.cells, self.sum = bytearray(), [0] * self.size[0]
        self.peak, self.sums = 0, []
        self.kept = None
        if keep:
            k = 1
            while (width // k) * (height // k) * 4 > MAX_DECODED:
                k += 1
            self.kept = Image.new("RGB", (max(1, width // k), max(1, height // k)))

    @classmethod
    def of(cls, Image, head: bytes, keep: bool = False) -> "Fold | None":
        """The fold of a stream that begins with ``head``; None: not a raw picture (it is
        held whole and decoded by Pillow); NotAPicture: a raw one not read here."""
        if is_xwd(head):
            return cls._xwd(Image, head, keep)
        m = _PNM.match(head)
        if m is None or int(m.group(4)) != 255:
            return None       # a 16-bit PPM, a PNG, a JPEG: Pillow's, within MAX_DECODED
        width, height = int(m.group(2)), int(m.group(3))
        _refuse_size(width, height)
        mode = "L" if m.group(1) == b"5" else "RGB"
        return cls(Image, width, height, mode, mode, width * len(mode), m.end(), keep)

    @classmethod
    def _xwd(cls, Image, head: bytes, keep: bool) -> "Fold":
        (header_size, _version, pixmap_format, _depth, width, height, _xoffset, byte_order,
         _unit, _bit_order, _pad, bits_per_pixel, bytes_per_line, visual_class, red, green,
         blue, _bits_per_rgb, _entries, ncolors, *_window) = _XWD_WORDS.unpack_from(head)
        raw = _XWD_RAW.get((bits_per_pixel, red, green, blue, byte_order))
        if pixmap_format != _ZPIXMAP or visual_class != _TRUE_COLOR or raw is None:
            raise NotAPicture(f"the capture is an XWD of {bits_per_pixel} bits a pixel not "
                              "read here (set [screen] capture_command)")
        if width < 1 or height < 1 or bytes_per_line < width * bits_per_pixel // 8:
            raise NotAPicture("the capture is not a picture: an XWD of no rows")
        _refuse_size(width, height)
        return cls(Image, width, height, "RGB", raw, bytes_per_line,
                   header_size + 12 * ncolors, keep)

    def wants(self) -> int:
        """The bytes that complete what is read next (the header, the next part of a
        band): a read of this size is folded without a copy."""
        if self.at < self.start:
            return self.start - self.at
        if self.row >= self.height:
            return CHUNK_BYTES
        last = min(self._rows(self.j)[1], self.row + self.chunk_rows)
        return (last - self.row) * self.stride - len(self.band)

    def take(self, block) -> None:
        view, i = memoryview(block), 0
        if self.at < self.start:
            i = min(len(view), self.start - self.at)
            self.at += i
        while i < len(view) and self.row < self.height:
            first, last = self.row, min(self._rows(self.j)[1], self.row + self.chunk_rows)
            need = (last - first) * self.stride - len(self.band)
            n = min(len(view) - i, need)
            if i == 0 and not self.band and n == need == len(block) \
                    and isinstance(block, bytes):
                self.at += n      # a read of exactly this part: folded as it came
                i += n
                self._fold(first, last, block)
                continue
            self.band += view[i:i + n]
            i += n
            self.at += n
            if len(self.band) == (last - first) * self.stride:
                self._fold(first, last, bytes(self.band))
                self.band.clear()
        self.at += len(view) - i

    def _rows(self, j: int) -> tuple[int, int]:
        """The picture's rows that make the thumbnail's row ``j``."""
        bands = self.size[1]
        return j * self.height // bands, (j + 1) * self.height // bands

    def _fold(self, first: int, last: int, rows_of: bytes) -> None:
        """The rows first..last (``rows_of``), a part of a band at most CHUNK_BYTES long:
        counted into its band's cells, the band's row of cells made when it is whole."""
        # not Image.frombytes: its new image is filled with black first, a pass for nothing
        im = self.Image.new(self.mode, (self.width, last - first), None)
        im.frombytes(rows_of, "raw", (self.raw, self.stride, 1))
        grey = self._seen(im, first, last, 1)
        means = grey.resize((self.size[0], 1), self.Image.Resampling.BOX).tobytes()
        rows = last - first
        self.sum = [total + v * rows for total, v in zip(self.sum, means)]
        self.row = last
        top, bottom = self._rows(self.j)
        if last == bottom:
            self.cells += bytes(round(total / (bottom - top)) for total in self.sum)
            self.sum = [0] * self.size[0]
            self.j += 1

    def _seen(self, im, first: int, last: int, parts: int):
        """Of the rows first..last (``im``): the brightest pixel, the checksums of its
        ``parts`` (what moved), the picture kept where it is; their grey image."""
        grey = im if im.mode == "L" else im.convert("L")
        self.peak = max(self.peak, grey.getextrema()[1])
        rows_of, w, h = memoryview(grey.tobytes()), grey.width, grey.height
        self.sums.extend(zlib.adler32(rows_of[k * h // parts * w:(k + 1) * h // parts * w])
                         for k in range(parts))
        if self.kept is not None:
            kw, kh = self.kept.size
            top, bottom = first * kh // self.height, last * kh // self.height
            if bottom > top:
                part = im if im.size == (kw, bottom - top) else \
                    im.resize((kw, bottom - top), self.Image.Resampling.BOX)
                self.kept.paste(part if part.mode == "RGB" else part.convert("RGB"), (0, top))
        return grey

    def fold_whole(self, im) -> None:
        """A picture decoded whole (``im``, RGB or L, the fold's size): every band at once."""
        grey = self._seen(im, 0, self.height, self.size[1])
        self.cells += grey.resize(self.size, self.Image.Resampling.BOX).tobytes()
        self.row, self.j = self.height, self.size[1]

    def picture(self) -> Picture:
        if self.j < self.size[1]:
            raise NotAPicture("the capture is not a picture: cut short")
        return Picture(self.size[0], self.size[1], bytes(self.cells), self.peak,
                       tuple(self.sums))


def _refuse_size(width: int, height: int) -> None:
    if width * height > MAX_PIXELS:
        raise NotAPicture(f"the capture is too large to decode: {width}x{height} pixels")


def _fit(width: int, height: int) -> tuple[int, int]:
    """The thumbnail's size for a picture of this size: its aspect, the longer side
    THUMB_SIZE's."""
    scale = min(THUMB_SIZE[0] / width, THUMB_SIZE[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def thumbnail(Image, data: bytes) -> Picture:
    """The picture in ``data`` as the judge sees it (Picture: the cells, the brightest
    pixel, the rows' checksums); NotAPicture, in one line, when it is not a picture read here
    or is too large to decode within its bound."""
    return decode(Image, data).picture()


def decode(Image, data: bytes, keep: bool = False) -> Fold:
    """The picture in ``data`` folded: a raw one (xwd, PPM) as it streams, another decoded
    by Pillow, refused from its header where it would hold more than MAX_DECODED (a JPEG
    is decoded smaller instead)."""
    try:
        fold = Fold.of(Image, bytes(data[:HEAD_BYTES]), keep)
        if fold is not None:
            fold.take(data)
            return fold
        with Image.open(io.BytesIO(data)) as im:
            return _fold_whole(Image, im, keep)
    except NotAPicture:
        raise
    except Image.DecompressionBombError as e:
        raise NotAPicture(f"the capture is too large to decode: {e}".splitlines()[0][:200]) \
            from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:150]
        raise NotAPicture(f"the capture is not a picture: {first}") from None


def _fold_whole(Image, im, keep: bool) -> Fold:
    """A compressed picture (PNG, JPEG) decoded by Pillow whole, as a one-band fold. What
    it holds is known from its header, before anything is decoded: the picture (4 bytes
    a pixel but for grey and palette ones), its RGB copy where it is neither grey nor RGB,
    and its grey copy."""
    w, h = im.size
    _refuse_size(w, h)
    held = w * h * ((1 if im.mode in ("1", "L", "P") else 4) + 1
                    + (0 if im.mode in ("L", "RGB") else 4))   # made RGB first: 4 a pixel
    if im.format == "JPEG":
        scale = 1
        while held // (scale * scale) > MAX_DECODED:
            scale *= 2
        im.draft("RGB" if keep else "L", (w // scale, h // scale))   # decoded that small
    elif held > MAX_DECODED:
        raise NotAPicture(f"the capture is too large to decode: a {im.format} of {w}x{h} "
                          f"would take {held >> 20} MiB, over {MAX_DECODED >> 20} MiB (have "
                          "the capture command print PPM, as grim -t ppm does)")
    im.load()
    fold = Fold(Image, im.width, im.height, "RGB", "RGB", 0, 0, keep)
    fold.fold_whole(im if im.mode in ("L", "RGB") else im.convert("RGB"))
    return fold


def jpeg_of(image) -> bytes:
    """A screenshot (a Pillow RGB image) as a JPEG of at most MAX_SHOT_BYTES: a lower
    quality, then half the size, until it fits (a busy 4K screen)."""
    Image = pillow()
    while True:
        for quality in (85, 70, 50):
            out = io.BytesIO()
            image.save(out, "JPEG", quality=quality)
            if out.tell() <= MAX_SHOT_BYTES or image.width < 64:
                return out.getvalue()
        image = image.resize((max(1, image.width // 2), max(1, image.height // 2)),
                             Image.Resampling.BOX)


def png_of(picture: Picture) -> bytes:
    """The thumbnail as a PNG, made in memory (a screenshot upload)."""
    Image = pillow()
    if Image is None:
        raise RuntimeError(NO_PILLOW)
    out = io.BytesIO()
    Image.frombytes("L", (picture.width, picture.height), picture.pixels).save(out, "PNG")
    return out.getvalue()


def choose(capture_command: str | None, x_display: str | None, environ: dict,
           timeout_s: float = TIMEOUT_S, temp_dir: str | None = None) -> Capture:
    """The way this screen is captured, as the module's doc says; ``temp_dir``: a tmpfs
    for the tool's temporary files (default /dev/shm)."""
    path = environ.get("PATH")
    temp = temp_dir or TEMP_DIR
    env = {**environ, "MAGICK_TEMPORARY_PATH": temp, "TMPDIR": temp}
    if capture_command:
        argv = shlex.split(capture_command)
        return Capture(argv, f"{children.program(argv)} ([screen] capture_command)",
                       env=env, timeout_s=timeout_s)
    if environ.get("WAYLAND_DISPLAY"):
        grim = shutil.which("grim", path=path)
        if grim is None:
            return Capture(None, "no capture tool on this Wayland screen: grim is not "
                                 "installed")
        return Capture([grim, "-t", "ppm", "-"], "grim", env=env, timeout_s=timeout_s)
    if x_display:
        xwd = shutil.which("xwd", path=path)
        if xwd is not None:
            return Capture([xwd, "-display", x_display, "-root", "-silent"],
                           f"xwd on {x_display}", env=env, timeout_s=timeout_s)
        tool = shutil.which("import", path=path)
        if tool is None:
            return Capture(None, "no capture tool on this X screen: neither xwd (x11-apps) "
                                 "nor ImageMagick's import (imagemagick) is installed")
        return Capture([tool, "-display", x_display, "-window", "root", "-depth", "8",
                        "pgm:-"], f"import on {x_display}", env=env, timeout_s=timeout_s)
    return Capture(None, "no capture on this screen: no compositor (no WAYLAND_DISPLAY, no X "
                         "display); a player drawing straight to KMS is captured only by a "
                         "[screen] capture_command that works with the unit's rights")
