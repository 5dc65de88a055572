"""The screen's picture, captured with the platform's tool and shrunk in memory.

Which tool: ``[screen] capture_command`` when set (it prints a PNG, PPM or JPEG on
stdout); else on Wayland (``WAYLAND_DISPLAY``) ``grim -t ppm -``; else on X11 (the X
display the read-back asks, service.x_display_of) ``xwd -root`` (x11-apps), its dump's
pixels taken by Pillow as they are (a third of the CPU of ImageMagick's ``import``,
measured: most of import's is its own start), else ImageMagick's ``import``, asked for
an 8-bit grey PGM. None of these: no capture on this screen (said, not a failure).

ImageMagick's import writes its picture to a temporary file before it prints it (2 MB a
1080p check, on the card where /tmp is on it): every tool runs with its temporary files
(MAGICK_TEMPORARY_PATH, TMPDIR) in ``temp_dir``, a tmpfs (the agent's runtime directory,
else /dev/shm).

A capture runs through base/children.py (its own session, killed at its bound or when
the agent stops), its stdout read up to MAX_BYTES and its stderr's tail kept for the
failure's words. Pillow (Debian's python3-pil) is imported at the first capture only,
so an agent without it runs and says so. The picture is decoded from memory, shrunk to
a thumbnail of at most THUMB_SIZE, and dropped: nothing is written anywhere.
"""
from __future__ import annotations

import io
import os
import selectors
import shlex
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass

from ..base import children
from .picture import Picture

TIMEOUT_S = 5.0
MAX_BYTES = 32 * 1024 * 1024     # a 4K screen's PPM is 25 MiB
MAX_PIXELS = 40_000_000          # 8K is 33 M: more is no screen but a decompression bomb
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
        """A capture, bounded; the decoded image is dropped once the thumbnail is made."""
        if self.argv is None:
            return Shot(why=self.how, absent=True)
        image_module = pillow()
        if image_module is None:
            return Shot(why=NO_PILLOW, absent=True)
        data, why = self._run()
        if why:
            return Shot(why=why)
        try:
            return Shot(picture=thumbnail(image_module, data))
        except NotAPicture as e:
            return Shot(why=str(e))
        except MemoryError:
            return Shot(why="no memory left to decode the capture")
        finally:
            del data

    def stop(self) -> None:
        """From any thread: the capture running is killed, none runs again."""
        with self._lock:
            self._stopping = True
            child = self._running
        if child is not None:
            children.kill_group(child)

    def _run(self) -> tuple[bytes | bytearray, str]:
        argv = self.argv
        try:
            with self._lock:
                if self._stopping:
                    return b"", "not captured: the agent is stopping"
                child = self._running = children.spawn(argv, env=self.env)
        except OSError as e:
            return b"", children.failure(argv, error=e)
        try:
            out, err, why = self._read(child)
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

    def _read(self, child: subprocess.Popen) -> tuple[bytearray, bytes, str]:
        """stdout whole (at most max_bytes), stderr's tail, or why not; the child reaped.
        One buffer, not chunks and a join; of an XWD dump only the rows the thumbnail
        takes are kept as they stream by (RowPicker): a frame's 8 MB is never held."""
        deadline = time.monotonic() + self.timeout_s
        out, size, err = bytearray(), 0, b""
        rows: RowPicker | None = None
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
                    block = os.read(key.fileobj.fileno(), 1 << 16)
                    if not block:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is child.stdout:
                        size += len(block)
                        if size > self.max_bytes:
                            why = (f"{children.program(self.argv)} printed more than "
                                   f"{_size(self.max_bytes)}")
                            break
                        if size == len(block):   # the first: an XWD dump's header
                            rows = RowPicker.of(block)
                        if rows is None:
                            out += block
                        else:
                            rows.take(block, out)
                    else:
                        err = (err + block)[-MAX_STDERR:]
        if rows is not None:
            rows.done(out)
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
        return out, err, why


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
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS // 2
    return Image


# xwd's dump (X11/XWDFile.h): a header of 25 big-endian 32-bit words, then the window's
# name, the colour map (12 bytes an entry), then the pixels, a row each bytes_per_line
_XWD_WORDS = struct.Struct(">25I")
_XWD_VERSION, _ZPIXMAP, _TRUE_COLOR = 7, 2, 4
# (bits per pixel, red, green, blue masks, byte order) -> Pillow's raw mode
_XWD_RAW = {(32, 0xFF0000, 0xFF00, 0xFF, 0): "BGRX", (32, 0xFF0000, 0xFF00, 0xFF, 1): "XRGB",
            (16, 0xF800, 0x7E0, 0x1F, 0): "BGR;16"}


def is_xwd(data: bytes) -> bool:
    return len(data) >= _XWD_WORDS.size and \
        struct.unpack_from(">I", data, 4)[0] == _XWD_VERSION


def _row_step(height: int) -> int:
    """Every step-th row: at least two kept for each of the thumbnail's rows."""
    return max(1, height // (THUMB_SIZE[1] * 2))


class RowPicker:
    """An XWD dump kept as it streams by: its header and colour map whole, then only
    every _row_step-th row of pixels; at the end the header says the rows kept, so the
    result is an XWD dump of a picture that many rows high."""

    def __init__(self, head: int, bytes_per_line: int, height: int):
        self.head, self.bytes_per_line = head, bytes_per_line
        self.step = _row_step(height)
        self.rows = height // self.step
        self.at = 0

    @classmethod
    def of(cls, first: bytes) -> "RowPicker | None":
        if not is_xwd(first):
            return None
        words = _XWD_WORDS.unpack_from(first)
        if words[12] < 1 or words[5] < 1:
            return None   # the decoder says what is wrong with it
        return cls(words[0] + 12 * words[19], words[12], words[5])

    def take(self, block: bytes, out: bytearray) -> None:
        i = 0
        while i < len(block):
            if self.at < self.head:
                n = min(len(block) - i, self.head - self.at)
                out += block[i:i + n]
            else:
                row, col = divmod(self.at - self.head, self.bytes_per_line)
                n = min(len(block) - i, self.bytes_per_line - col)
                if row % self.step == 0 and row // self.step < self.rows:
                    out += block[i:i + n]
            i += n
            self.at += n

    def done(self, out: bytearray) -> None:
        if len(out) >= _XWD_WORDS.size:
            struct.pack_into(">I", out, 20, self.rows)   # pixmap_height: the rows kept


def _xwd_size(data: bytes) -> tuple[int, int]:
    """The picture's size as shown: the window's (the root's), which RowPicker leaves as
    it was, else the pixmap's."""
    words = _XWD_WORDS.unpack_from(data)
    return (words[20], words[21]) if words[20] and words[21] else (words[4], words[5])


def _fit(width: int, height: int) -> tuple[int, int]:
    """The thumbnail's size for a picture of this size: its aspect, the longer side
    THUMB_SIZE's."""
    scale = min(THUMB_SIZE[0] / width, THUMB_SIZE[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _open_xwd(Image, data: bytes):
    """xwd's dump as a Pillow image over its pixels (no copy): the true-colour forms an
    X server shows a screen in; another is told, in one line."""
    (header_size, _version, pixmap_format, _depth, width, height, _xoffset, byte_order,
     _unit, _bit_order, _pad, bits_per_pixel, bytes_per_line, visual_class, red, green,
     blue, _bits_per_rgb, _entries, ncolors, *_window) = _XWD_WORDS.unpack_from(data)
    raw = _XWD_RAW.get((bits_per_pixel, red, green, blue, byte_order))
    if pixmap_format != _ZPIXMAP or visual_class != _TRUE_COLOR or raw is None:
        raise NotAPicture(f"the capture is an XWD of {bits_per_pixel} bits a pixel not read "
                          "here (set [screen] capture_command)")
    if width * height > MAX_PIXELS:
        raise NotAPicture(f"the capture is too large to decode: {width}x{height} pixels")
    start = header_size + 12 * ncolors
    if width < 1 or height < 1 or bytes_per_line * height > len(data) - start \
            or bytes_per_line < width * bits_per_pixel // 8:
        raise NotAPicture("the capture is not a picture: an XWD cut short")
    # every step-th row only (a dump RowPicker kept has only those: step 1); bytes:
    # Pillow 9.4, bookworm's, decodes from an immutable buffer only
    step = _row_step(height)
    stride = bytes_per_line * step
    rows = b"".join(data[at:at + bytes_per_line]
                    for at in range(start, start + stride * (height // step), stride))
    return Image.frombytes("RGB", (width, height // step), rows, "raw", raw, bytes_per_line, 1)


def thumbnail(Image, data: bytes) -> Picture:
    """The picture in ``data`` decoded, grey, at most THUMB_SIZE; NotAPicture, in one
    line, when it is not a picture Pillow reads or is too large to be a screen."""
    try:
        if is_xwd(data):
            (width, height), rows = _xwd_size(data), _open_xwd(Image, data)
            small = rows.resize(_fit(width, height), Image.Resampling.BOX).convert("L")
            return Picture(small.width, small.height, small.tobytes())
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            im.draft("L", (max(1, w // 8), max(1, h // 8)))   # JPEG: decoded small
            im.thumbnail(THUMB_SIZE, Image.Resampling.BOX)
            small = im if im.mode == "L" else im.convert("L")
            return Picture(small.width, small.height, small.tobytes())
    except Image.DecompressionBombError as e:
        raise NotAPicture(f"the capture is too large to decode: {e}".splitlines()[0][:200]) \
            from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:150]
        raise NotAPicture(f"the capture is not a picture: {first}") from None


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
    return Capture(None, "no capture tool on this screen: no WAYLAND_DISPLAY, no X display")
