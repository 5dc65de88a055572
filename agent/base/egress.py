"""How the agent reaches its server: through which proxy, trusting which CA, showing
which client certificate. The link, the uploads and enrollment all go out this way, so
a site's proxy or inspecting box is configured once and never half-honoured.

The libraries each had their own idea: requests reads ``HTTPS_PROXY``/``NO_PROXY``
(and ~/.netrc) from the environment, websocket-client reads them again with its own
matching and never proxies ``localhost``/``127.0.0.1`` unless told, and a systemd
service inherits neither from an operator's shell. Here the agent decides: the proxy
is ``[network] proxy``, or the environment's when that is unset, and ``bypasses`` is
the one rule for which hosts go direct. Neither library consults the environment on
its own (a requests session with ``trust_env`` off; the link dials its own sockets).
"""
from __future__ import annotations

import base64
import contextlib
import ipaddress
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool
from urllib3.util import parse_url

# curl's and requests' names, lower case first (the convention; httpoxy taught CGI
# servers to distrust HTTP_PROXY, not an issue for a daemon)
PROXY_ENV = {"https": ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"),
             "http": ("http_proxy", "HTTP_PROXY")}
NO_PROXY_ENV = ("no_proxy", "NO_PROXY")
MAX_VALUE = 4096

_NAME = re.compile(r"(?:\*\.|\.)?((?!-)[a-z0-9-]{1,63}(?:\.(?!-)[a-z0-9-]{1,63})*)\.?")


class EgressError(ValueError):
    """A proxy or no-proxy value that cannot be used; the message names no secret."""


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy reached with CONNECT, with Basic credentials if it wants them."""
    host: str
    port: int
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    source: str = ""      # the key or environment variable it came from

    @property
    def display(self) -> str:
        creds = "***@" if self.user is not None else ""
        return f"http://{creds}{_bracketed(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        """As requests takes it: credentials percent-encoded, which it decodes."""
        creds = ""
        if self.user is not None:
            creds = quote(self.user, safe="") + ":" + quote(self.password or "", safe="") + "@"
        return f"http://{creds}{_bracketed(self.host)}:{self.port}"

    def authorization(self) -> str | None:
        """The Proxy-Authorization header value, or None without credentials."""
        if self.user is None:
            return None
        pair = f"{self.user}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def parse_proxy(value: str, source: str) -> Proxy:
    """``http://[user:password@]host[:port]``: the user and password percent-encoded
    as in any URL. Raises EgressError naming ``source`` and never the password."""
    value = value.strip()
    if len(value) > MAX_VALUE:
        raise EgressError(f"{source}: longer than {MAX_VALUE} characters")
    if "://" not in value:          # curl and requests take "host:port" as http://
        value = "http://" + value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise EgressError(f"{source}: not a proxy URL (http://host:port)") from None
    if parts.scheme != "http":
        raise EgressError(f"{source}: only http:// proxies (HTTP CONNECT) are supported, "
                          f"not {parts.scheme}://")
    host = parts.hostname
    if not host or not _usable_host(host):
        raise EgressError(f"{source}: not a proxy URL (http://host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EgressError(f"{source}: a proxy URL has no path (http://host:port)")
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    if user is not None and ":" in user:     # Basic sends "user:password"
        raise EgressError(f"{source}: the proxy user cannot contain ':'")
    for what, text in (("user", user), ("password", password)):
        # requests encodes Basic credentials as latin-1, the link as UTF-8: only ASCII
        # means the same to both
        if text is not None and (not text.isascii() or re.search(r"[\x00-\x1f\x7f]", text)):
            raise EgressError(f"{source}: the proxy {what} must be printable ASCII "
                              f"(percent-encoded in the URL)")
    return Proxy(host, port or 80, user, password, source)


def parse_no_proxy(value: str, source: str) -> tuple[str, ...]:
    """Entries separated by commas or spaces; each is checked now, so a typo is an
    error at start-up rather than traffic that silently takes the wrong way."""
    if len(value) > MAX_VALUE:
        raise EgressError(f"{source}: longer than {MAX_VALUE} characters")
    entries = []
    for raw in re.split(r"[,\s]+", value.strip().lower()):
        if not raw:
            continue
        if raw != "*" and _entry(raw) is None:
            raise EgressError(f"{source}: {raw[:60]!r} is not a host, domain, address or "
                              f"network (e.g. fleet.example.com, .example.com, 10.0.0.0/8)")
        entries.append(raw)
    return tuple(entries)


def bypasses(no_proxy: tuple[str, ...], host: str, port: int) -> bool:
    """The one rule for which hosts go direct. An entry is ``*`` (every host), an
    address or a network (``10.0.0.0/8``, ``fd00::/8``: matches a host given as an
    address in it; names are not resolved to decide), or a domain (the host itself and
    every name under it; a leading ``.`` or ``*.`` changes nothing), each with an
    optional ``:port``. Localhost is not special: list it if it should go direct."""
    host = host.lower().rstrip(".").strip("[]")
    for raw in no_proxy:
        if raw == "*":
            return True
        entry = _entry(raw)
        if entry is None:
            continue
        pattern, only_port = entry
        if only_port is not None and only_port != port:
            continue
        if isinstance(pattern, str):
            if host == pattern or host.endswith("." + pattern):
                return True
            continue
        try:
            if ipaddress.ip_address(host) in pattern:
                return True
        except ValueError:
            continue
    return False


def _entry(raw: str):
    """(a domain, or an address network; the port or None), or None if unusable."""
    port = None
    text = raw
    m = re.fullmatch(r"\[([0-9a-f:.]+)\](?::(\d{1,5}))?", raw) or \
        re.fullmatch(r"([^:]+):(\d{1,5})", raw)
    if m:
        text, port = m.group(1), (int(m.group(2)) if m.group(2) else None)
        if port is not None and not 0 < port < 65536:
            return None
    try:
        return ipaddress.ip_network(text, strict=False), port
    except ValueError:
        pass
    name = _NAME.fullmatch(text)
    return (name.group(1), port) if name else None


def _usable_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _NAME.fullmatch(host) is not None and not host.startswith((".", "*"))


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def proxy_from_env(env, scheme: str) -> Proxy | None:
    """The environment's proxy for a server reached over ``scheme``, or None."""
    for name in PROXY_ENV[scheme]:
        value = env.get(name, "").strip()
        if value:
            return parse_proxy(value, f"{name} (environment)")
    return None


def no_proxy_from_env(env) -> tuple[str, ...]:
    for name in NO_PROXY_ENV:
        value = env.get(name, "").strip()
        if value:
            return parse_no_proxy(value, f"{name} (environment)")
    return ()


@dataclass(frozen=True)
class Egress:
    proxy: Proxy | None = None
    no_proxy: tuple[str, ...] = ()
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def proxy_for(self, host: str, port: int) -> Proxy | None:
        if self.proxy is None or bypasses(self.no_proxy, host, port):
            return None
        return self.proxy

    def session(self, url: str) -> requests.Session:
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
        s.verify = self.ca_file or True
        if self.client_cert:
            s.cert = (self.client_cert, self.client_key) if self.client_key else self.client_cert
        parts = urlsplit(url)
        proxy = self.proxy_for(parts.hostname or "", parts.port or default_port(parts.scheme))
        s.proxies = {"http": proxy.url, "https": proxy.url} if proxy else {}
        return s

    def ssl_context(self) -> ssl.SSLContext:
        """Verification on, against the site's CA when one is configured (and then
        only it, as requests does with a CA path), with the client certificate."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def default_port(scheme: str) -> int:
    return 443 if scheme in ("https", "wss") else 80


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
    if ((got.scheme, (got.host or "").lower(), got.port or default_port(got.scheme))
            != (want.scheme, (want.host or "").lower(), want.port or default_port(want.scheme))):
        raise ValueError("url: not on the fleet server this screen is linked to")
    return got.url
