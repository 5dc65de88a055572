"""The journal gate's exchange, both ends of it (the gate itself, which serves it as its
own sandboxed program: programs/journal_gate.py, says why there is a gate):

    request  ``<since> <priority> <lines>\\n``: ASCII decimal integers, the window's
             start in epoch seconds, the lowest priority wanted (0-7), at most how many
             lines (the newest ones)
    reply    ``ok <n> <dropped>\\n`` and n bytes of journalctl's JSON lines (the newest
             that fit in MAX_BODY_BYTES; ``dropped`` older ones did not), or
             ``error <text>\\n``

Neither end ever holds more than MAX_BODY_BYTES of it: the gate keeps the newest lines
that fit as journalctl writes them, the agent reads the reply a line at a time here
(a 38 MB journal once took the agent past its MemoryMax).
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Iterator

SOCKET = "/run/edge-agent-logs.sock"
UNIT = "edge-agent.service"
MAX_LINES = 20_000
# what a line of the bundle carries; journalctl adds its own timestamps and cursor
FIELDS = "MESSAGE,PRIORITY,_PID"
MAX_REQUEST = 64       # bytes: the longest request that parses is 26
MAX_HEADER = 512       # bytes: "ok <n> <dropped>" or "error <one line>"
# what one reply may carry: a bundle's worth, well under both units' MemoryMax
MAX_BODY_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 10   # journald's own LineMax is 48K
JOURNALCTL_TIMEOUT_S = 50.0  # under the helper unit's RuntimeMaxSec=60s
_REQUEST = re.compile(rb"(\d{1,12}) (\d{1,3}) (\d{1,6})\n")


class GateError(Exception):
    """A one-line reason the journal lines could not be had."""


@dataclass(frozen=True)
class Request:
    """Which journal lines a log bundle asks for: since when, how urgent, how many."""
    since: int      # epoch seconds
    priority: int   # 0 (emerg) .. 7 (debug): this and everything more urgent
    lines: int      # the newest this many of the window

    def __post_init__(self):
        if self.priority not in range(8):
            raise GateError(f"priority: {self.priority} is not 0-7")
        if not 1 <= self.lines <= MAX_LINES:
            raise GateError(f"lines: {self.lines} is not 1-{MAX_LINES}")
        if not 0 <= self.since < 10 ** 12:
            raise GateError(f"since: {self.since} is not an epoch second")

    def encode(self) -> bytes:
        return f"{self.since} {self.priority} {self.lines}\n".encode()

    def argv(self) -> list[str]:
        """journalctl for exactly this unit and window; nothing from the request
        reaches it but three checked integers."""
        return ["journalctl", "--no-pager", "--quiet", "--output=json",
                f"--output-fields={FIELDS}", f"--unit={UNIT}", f"--since=@{self.since}",
                f"--priority={self.priority}", f"--lines={self.lines}"]


def parse_request(raw: bytes) -> Request:
    if not raw.endswith(b"\n"):
        raise GateError("request: not one line ending in a newline")
    m = _REQUEST.fullmatch(raw)
    if m is None:
        raise GateError("request: expected '<since> <priority> <lines>', decimal integers")
    return Request(*(int(g) for g in m.groups()))


def reply_ok(body: bytes, dropped: int = 0) -> bytes:
    return b"ok %d %d\n" % (len(body), dropped) + body


def reply_error(text: str) -> bytes:
    return b"error " + " ".join(text.split()).encode(errors="replace")[:MAX_HEADER - 8] + b"\n"


# (a helper from the release before says no "dropped": an upgrade's moment between)
_OK = re.compile(rb"ok (\d{1,9})(?: (\d{1,9}))?\n")


def parse_header(line: bytes) -> tuple[int, int]:
    """The body's length and how many older lines the gate dropped, from a reply's
    first line, or the gate's error as GateError."""
    m = _OK.fullmatch(line)
    if m is not None:
        length, dropped = int(m.group(1)), int(m.group(2) or 0)
        if length > MAX_BODY_BYTES:
            raise GateError(f"the gate offered {length} bytes, over {MAX_BODY_BYTES}")
        return length, dropped
    if line.startswith(b"error ") and line.endswith(b"\n"):
        raise GateError(line[6:-1].decode(errors="replace"))
    raise GateError(f"the gate answered {line[:60]!r}, not a reply")


# -- the helper's side: stdin and stdout are the connection -------------------------
def read_lines(f, length: int | None = None) -> Iterator[bytes]:
    """Whole lines from ``f`` (of ``length`` bytes, or to its end), each within
    MAX_LINE_BYTES: a longer one is skipped whole."""
    left = length
    skipping = False
    while left is None or left > 0:
        line = f.readline(MAX_LINE_BYTES if left is None else min(MAX_LINE_BYTES, left))
        if not line:
            if left and length is not None:
                raise GateError(f"the reply was cut short ({length - left} of {length} bytes)")
            return
        if left is not None:
            left -= len(line)
        whole = line.endswith(b"\n")
        if not skipping and whole:
            yield line
        skipping = not whole


# -- the agent's side ---------------------------------------------------------------
class Reply:
    """An open reply: ``lines()`` once, read as they arrive; ``dropped`` older lines
    the gate could not fit."""

    def __init__(self, sock: socket.socket, path: str, timeout: float):
        self._sock, self._path, self._timeout = sock, path, timeout
        self._file = sock.makefile("rb")
        self.length, self.dropped = parse_header(self._file.readline(MAX_HEADER))

    def lines(self) -> Iterator[bytes]:
        with _said(self._path, self._timeout):
            yield from read_lines(self._file, self.length)

    def close(self) -> None:
        self._file.close()
        self._sock.close()


class _said:
    """Socket errors as GateError, in words for the result."""

    def __init__(self, path: str, timeout: float):
        self.path, self.timeout = path, timeout

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is None or issubclass(kind, GateError):
            return False
        path = self.path
        if issubclass(kind, FileNotFoundError):
            raise GateError(f"{path}: no such socket (edge-agent-logs.socket not running?)") from None
        if issubclass(kind, ConnectionRefusedError):
            raise GateError(f"{path}: nobody listens (edge-agent-logs.socket stopped?)") from None
        if issubclass(kind, TimeoutError):
            raise GateError(f"{path}: no answer in {self.timeout:g}s") from None
        if issubclass(kind, OSError):
            raise GateError(f"{path}: {e.strerror or e}") from None
        return False


def ask(request: Request, timeout: float, path: str | None = None) -> Reply:
    """The gate's reply to ``request`` (close it when done), asked at ``path``."""
    path = path or SOCKET
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _said(path, timeout):
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(request.encode())
            return Reply(sock, path, timeout)
    except BaseException:
        sock.close()
        raise


def fetch(request: Request, timeout: float, path: str | None = None) -> bytes:
    """The reply's lines whole (bounded by MAX_BODY_BYTES)."""
    reply = ask(request, timeout, path)
    try:
        return b"".join(reply.lines())
    finally:
        reply.close()
