"""The one way an HTTP exchange goes out and comes back: a requests session going out
the way ``Egress`` says, each exchange under its thread's deadline, its answer bounded
in bytes and refused in any encoding but identity.

Apart from egress.py, so that what only reads the configuration (``edge-agent
status``, ``check-config``) never imports requests and urllib3: the largest import of
the agent's start, and a third of status's modules."""
from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool
from urllib3.util import parse_url

from .egress import Egress, default_port


def session(egress: Egress, url: str) -> requests.Session:
    """A requests session for ``url``'s server, going out this way and no other:
    answers in identity encoding only, each exchange under the thread's deadline()."""
    s = requests.Session()
    s.trust_env = False        # no environment proxies, no ~/.netrc credentials
    # nothing the agent fetches needs compression, and a decoder is where a
    # kilobyte becomes a gigabyte (urllib3 1.26 inflates a whole read at once)
    s.headers["Accept-Encoding"] = "identity"
    adapter = _Adapter()
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.verify = egress.ca_file or True
    if egress.client_cert:
        s.cert = (egress.client_cert, egress.client_key) if egress.client_key else egress.client_cert
    parts = urlsplit(url)
    proxy = egress.proxy_for(parts.hostname or "", parts.port or default_port(parts.scheme))
    s.proxies = {"http": proxy.url, "https": proxy.url} if proxy else {}
    return s


# -- the one way an HTTP exchange goes out and comes back ------------------------------
class HostileAnswer(requests.RequestException):
    """An answer the agent will not read (its message names what, never a secret)."""


class DeadlinePassed(requests.Timeout):
    """The exchange's deadline came first (a cut that may look like a short answer)."""


class Deadline:
    """One bound over an exchange from its first byte: the connect, the request, the
    headers and the body. A read timeout bounds each read alone, and a server that
    trickles a byte within every one holds the exchange for ever; at the deadline a
    timer (the one deadline() is given) shuts down every socket the exchange used, which
    wakes a read blocked in it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def watch(self, sock) -> None:
        if sock is None:
            return
        with self._lock:
            if not any(s is sock for s in self._socks):
                self._socks.append(sock)
            expired = self.expired
        if expired:
            _shut(sock)

    def cut(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            _shut(sock)

    def clamp(self, timeout):
        """requests' (connect, read) timeout, neither past the deadline."""
        left = max(0.001, self.left())
        if isinstance(timeout, tuple):
            return tuple(left if t is None else min(t, left) for t in timeout)
        if isinstance(timeout, (int, float)):
            return min(timeout, left)
        return left if timeout is None else timeout

    def check(self) -> None:
        """Raises if the deadline cut the exchange: http.client takes a shut socket for
        the end of the headers or of a body without a length, so what was read then
        may look like a whole (and short) answer."""
        if self.expired:
            raise DeadlinePassed(f"not done in {self.seconds:g} s")


def _check_deadline() -> None:
    d = getattr(_current, "deadline", None)
    if d is not None:
        d.check()


_current = threading.local()


# arm(seconds, cut): cut() is called in ``seconds`` unless the returned cancel() is first
Arm = Callable[[float, Callable[[], None]], Callable[[], None]]


@contextlib.contextmanager
def deadline(seconds: float, arm: Arm):
    """Every exchange this thread makes inside is over ``seconds`` after it began
    (the exchange fails with a connection error; ``Deadline.expired`` says why).

    ``arm`` sets the timer that cuts. It is the caller's, and required: base starts no
    thread (it imports nothing of the agent, and every thread of the agent is started
    in runtime/), and a deadline with no cut would look bounded and wait for ever on a
    trickle. The parts use runtime/deadline.py's deadline(), which passes the agent's.
    Not socket timeouts instead: one bounds each read alone, and a TLS socket reads
    through OpenSSL, never through a method that could be given what is left."""
    d = Deadline(seconds)
    before = getattr(_current, "deadline", None)
    _current.deadline = d
    cancel = arm(seconds, d.cut)
    try:
        yield d
    finally:
        cancel()
        _current.deadline = before


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watch(sock) -> None:
    d = getattr(_current, "deadline", None)
    if d is not None:
        d.watch(sock)


class _Watched:
    # _new_conn and request: the same names in urllib3 1.26 (Debian 12) and 2.x
    def _new_conn(self):
        sock = super()._new_conn()
        _watch(sock)          # before TLS or a proxy's CONNECT: both are under the bound
        return sock

    def request(self, *args, **kw):
        _watch(getattr(self, "sock", None))   # a kept-alive connection, used again
        return super().request(*args, **kw)


class _Connection(_Watched, urllib3.connection.HTTPConnection):
    pass


class _TLSConnection(_Watched, urllib3.connection.HTTPSConnection):
    pass


class _Pool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


def _watched(manager):
    manager.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
    return manager


class _Adapter(requests.adapters.HTTPAdapter):
    def init_poolmanager(self, *args, **kw):
        super().init_poolmanager(*args, **kw)
        _watched(self.poolmanager)

    def proxy_manager_for(self, proxy, **kw):
        return _watched(super().proxy_manager_for(proxy, **kw))

    def send(self, request, stream=False, timeout=None, *args, **kw):
        d = getattr(_current, "deadline", None)
        if d is not None:
            timeout = d.clamp(timeout)
        r = super().send(request, stream, timeout, *args, **kw)
        if d is not None and d.expired:
            r.close()
            d.check()
        return r

    def build_response(self, req, resp):
        r = super().build_response(req, resp)
        coding = (r.headers.get("Content-Encoding") or "identity").strip().lower()
        if coding != "identity":
            # refused before a byte is decoded, whatever urllib3 would make of it
            r.close()
            raise HostileAnswer(f"the server answered in {coding[:40]!r} encoding; "
                                "identity was asked for")
        return r


def read_capped(response, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of the body, as sent (the caller tells "too large"
    from "just fits"); the one place a body is read whole."""
    raw = response.raw.read(limit + 1, decode_content=False) if response.raw else b""
    _check_deadline()
    return raw


def body_chunks(response, chunk: int):
    """The body in chunks of at most ``chunk`` bytes, as sent. Read through http.client's
    parser, whose chunk-size lines are bounded: urllib3 1.26's own chunked reader
    (``stream()``) reads one whole, 2.7 GB of a line that never ends in 6 s."""
    while True:
        data = response.raw.read(chunk, decode_content=False)
        _check_deadline()
        if not data:
            return
        yield data


def fleet_url(url: str, server_url: str) -> str:
    """Where an order sends the agent to fetch: a path on the fleet server, or a URL on
    it (its scheme, host and port). Parsed once, by urllib3's parser, the one requests
    connects with: two parsers that read a host differently (``http://a:1\\@fleet/``
    is ``a`` to urllib3, ``fleet`` to urlsplit) cannot both be asked. Backslashes and
    user info are refused outright. ValueError naming the field otherwise."""
    if not isinstance(url, str) or "\\" in url or not url.isprintable() \
            or any(c.isspace() for c in url):
        raise ValueError("url: printable, no spaces or backslashes")
    want = parse_url(server_url)
    origin = f"{want.scheme}://{want.netloc}"
    if url.startswith("/") and not url.startswith("//"):
        url = origin + url
    try:
        got = parse_url(url)
    except ValueError:   # urllib3's LocationParseError is one
        raise ValueError("url: not a URL") from None
    if got.scheme not in ("http", "https"):
        raise ValueError("url: a path on the fleet server, or an http or https URL on it")
    if got.auth is not None or re.match(r"[^:/?#]*://[^/?#]*@", url):
        raise ValueError("url: no user or password in it")
    if ((got.scheme, (got.host or "").lower(), got.port or default_port(got.scheme or ""))
            != (want.scheme, (want.host or "").lower(), want.port or default_port(want.scheme or ""))):
        raise ValueError("url: not on the fleet server this screen is linked to")
    return got.url
