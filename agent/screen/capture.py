"""The screen's picture, captured with the platform's tool and shrunk in memory.

Which tool: ``[screen] capture_command`` when set (it prints a PNG, PPM or JPEG on
stdout); else on Wayland (``WAYLAND_DISPLAY``) ``grim -t ppm -``; else on X11 (the X
display the read-back asks, service.x_display_of) ImageMagick's ``import``, asked for an
8-bit grey PGM: a third of the bytes of a colour one to read and decode, and the judge
wants grey. None of these: no capture on this screen (said, not a failure).

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

    def _run(self) -> tuple[bytes, str]:
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

    def _read(self, child: subprocess.Popen) -> tuple[bytes, bytes, str]:
        """stdout whole (at most max_bytes), stderr's tail, or why not; the child reaped."""
        deadline = time.monotonic() + self.timeout_s
        chunks, size, err = [], 0, b""
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
                        chunks.append(block)
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
        out = b"".join(chunks)
        chunks.clear()
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


def thumbnail(Image, data: bytes) -> Picture:
    """The picture in ``data`` decoded, grey, at most THUMB_SIZE; NotAPicture, in one
    line, when it is not a picture Pillow reads or is too large to be a screen."""
    try:
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
        tool = shutil.which("import", path=path)
        if tool is None:
            return Capture(None, "no capture tool on this X screen: ImageMagick's import "
                                 "is not installed (imagemagick)")
        return Capture([tool, "-display", x_display, "-window", "root", "-depth", "8",
                        "pgm:-"], f"import on {x_display}", env=env, timeout_s=timeout_s)
    return Capture(None, "no capture tool on this screen: no WAYLAND_DISPLAY, no X display")
