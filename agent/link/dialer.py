"""The link's socket, dialed by the agent rather than the library, so that a failed
connect says why.

websocket-client would do this itself, and python-socketio would turn whatever went
wrong into "Connection error". Dialing here, phase by phase, gives each failure its
reason from the journal's vocabulary (a name that does not resolve, a reset, a proxy
that wants credentials, a certificate not valid yet by a clock that is behind, a
server that accepts the TCP handshake and then says nothing), the time each phase
took (for the journal), and one rule for the proxy (``Egress.proxy_for``) instead of
the library's own reading of the environment.

The socket is a ``GuardedSocket``: while guarded, its reads are bounded in time and in
bytes, so neither a proxy's answer nor the websocket upgrade's can be trickled forever
or flood memory (websocket-client reads the upgrade's headers a byte at a time with no
bound: a 10 MiB header took 37 s and 1.4 GB). ``guard()`` for those answers,
``unguard()`` once the websocket is up.
"""
from __future__ import annotations

import errno
import re
import socket
import ssl
import time
from typing import cast
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

from ..base.egress import Egress, Proxy, default_port
from ..base import reasons as J

# a proxy's answer to CONNECT, the server's to the upgrade: a status line and headers
MAX_HEADER_BYTES = 16 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})(?: |\r)")
# verify codes of OpenSSL's X509_V_ERR_*: the clock's side of a certificate check
_NOT_YET_VALID = 9
_EXPIRED = 10
_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL,
                       errno.ENETDOWN}


class DialError(Exception):
    """A failed dial: ``reason`` from the journal's vocabulary, ``detail`` for a person,
    ``timed_out`` when it was the bound that ended it (the connect bound grows on it),
    ``busy`` when the server said it is overloaded (429, 503: no second dial races the
    next connects)."""

    def __init__(self, reason: str, detail: str, timed_out: bool = False,
                 busy: bool = False):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.timed_out = timed_out
        self.busy = busy


class GuardedSocket(socket.socket):
    """Reads bounded in time and bytes while guarded; a plain socket otherwise (its TLS
    form below inherits it)."""
    _guard_deadline: float | None = None
    _guard_left = 0
    _guard_refusal: DialError | None = None
    _guard_timeout: float | None = None

    def guard(self, deadline: float, max_bytes: int, refusal: DialError) -> None:
        self._guard_timeout = self.gettimeout()
        self._guard_deadline, self._guard_left, self._guard_refusal = deadline, max_bytes, refusal

    def unguard(self, timeout: float | None) -> None:
        self._guard_deadline = None
        self.settimeout(timeout)

    def recv(self, bufsize: int, *flags: int) -> bytes:
        if self._guard_deadline is None:
            return super().recv(bufsize, *flags)
        left = self._guard_deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        self.settimeout(left if self._guard_timeout is None else min(left, self._guard_timeout))
        data = super().recv(min(bufsize, self._guard_left + 1), *flags)
        self._guard_left -= len(data)
        if self._guard_left < 0 and self._guard_refusal is not None:
            raise self._guard_refusal
        return data


class GuardedSSLSocket(GuardedSocket, ssl.SSLSocket):  # type: ignore[misc]  # recv's names
    pass


@dataclass
class Dialed:
    """A connected socket (TLS done when the URL asked for it) and what it cost."""
    sock: GuardedSocket | GuardedSSLSocket
    deadline: float                                          # of the whole connect
    phases: dict[str, float] = field(default_factory=dict)   # seconds each phase took
    via: str = "direct"                                      # or the proxy, for a person


def dial(url: str, egress: Egress, timeout: float, phases: dict | None = None) -> Dialed:
    """Connects to ``url``'s host through the proxy ``egress`` names for it, within
    ``timeout`` seconds overall; raises DialError with the reason. ``phases`` (the
    seconds each took, ``dns_s``, ``tcp_s``, ...) fills in as they finish, for a caller
    on another thread to watch."""
    parts = urlsplit(url)
    secure = parts.scheme in ("wss", "https")
    host = parts.hostname or ""
    port = parts.port or default_port(parts.scheme)
    deadline = time.monotonic() + timeout
    phases = {} if phases is None else phases
    proxy = egress.proxy_for(host, port)
    if proxy is not None:
        sock = _tcp(proxy.host, proxy.port, deadline, phases, proxy=proxy)
        try:
            _tunnel(sock, proxy, host, port, deadline, phases)
        except BaseException:
            sock.close()
            raise
    else:
        sock = _tcp(host, port, deadline, phases)
    if secure:
        sock = _tls(sock, egress, host, deadline, phases)
    sock.settimeout(_left(deadline))
    return Dialed(sock, deadline, phases, proxy.display if proxy else "direct")


def _left(deadline: float) -> float:
    return max(0.05, deadline - time.monotonic())


def _tcp(host: str, port: int, deadline: float, phases: dict,
         proxy: Proxy | None = None) -> GuardedSocket:
    def fail(reason: str, what: str, timed_out: bool = False):
        if proxy is not None:
            return DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display}: {what}", timed_out)
        return DialError(reason, f"{host}:{port}: {what}", timed_out)

    start = time.monotonic()
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise fail(J.DNS_FAILED, f"name not resolved ({e.strerror})") from None
    except UnicodeError:
        raise fail(J.DNS_FAILED, "name not resolved (not a valid name)") from None
    phases["dns_s"] = round(time.monotonic() - start, 4)
    last: DialError | None = None
    for n, (family, kind, proto, _, address) in enumerate(addresses):
        sock = None
        start = time.monotonic()
        try:
            sock = GuardedSocket(family, kind, proto)
            # small messages go at once, as websocket-client's own sockets do: behind
            # Nagle a heartbeat waits for the peer's (delayed) ACK of the last write
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # a share of what is left for each address: a black-holed IPv6 must not
            # take all of it from the IPv4 behind it
            sock.settimeout(max(0.05, (deadline - start) / (len(addresses) - n)))
            sock.connect(address)
            phases["tcp_s"] = round(time.monotonic() - start, 4)
            return sock
        except socket.timeout:
            last = fail(J.CONNECT_TIMEOUT, "no answer to the TCP handshake in "
                                           f"{time.monotonic() - start:.1f}s", timed_out=True)
        except ConnectionRefusedError:
            last = fail(J.CONNECTION_REFUSED, "connection refused (nothing listens there, "
                                              "or a firewall rejects it)")
        except OSError as e:
            unreachable = e.errno in _UNREACHABLE_ERRNOS
            last = fail(J.NETWORK_UNREACHABLE if unreachable else J.CONNECT_FAILED,
                        e.strerror or type(e).__name__)
        if sock is not None:
            sock.close()
        if time.monotonic() >= deadline:
            break
    raise last or fail(J.DNS_FAILED, "the name has no address")


def _tunnel(sock: GuardedSocket, proxy: Proxy, host: str, port: int, deadline: float,
            phases: dict) -> None:
    """HTTP CONNECT through ``proxy`` to host:port; the socket is then the server's."""
    start = time.monotonic()
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    auth = proxy.authorization()
    if auth is not None:
        request += f"Proxy-Authorization: {auth}\r\n"
    answer = b""
    sock.guard(deadline, MAX_HEADER_BYTES, DialError(
        J.PROXY_REFUSED, f"the proxy {proxy.display} answered CONNECT with more than a header"))
    try:
        sock.settimeout(_left(deadline))
        sock.sendall((request + "\r\n").encode("ascii"))
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                raise DialError(J.PROXY_REFUSED, f"the proxy {proxy.display} closed the "
                                                 "connection instead of answering CONNECT")
            answer += chunk
    except socket.timeout:
        raise DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display} did not answer "
                                             "CONNECT in time", timed_out=True) from None
    except OSError as e:
        raise DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display}: "
                                             f"{e.strerror or type(e).__name__}") from None
    sock.unguard(_left(deadline))
    status = _STATUS_LINE.match(answer)
    code = int(status.group(1)) if status else 0
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    if code in (401, 407):   # tinyproxy answers a CONNECT with bad credentials 401
        said = "refused the configured credentials" if auth else "asks for credentials"
        raise DialError(J.PROXY_AUTH, f"the proxy {proxy.display} {said} ({code})")
    if not 200 <= code < 300:
        raise DialError(J.PROXY_REFUSED, f"the proxy {proxy.display} answered CONNECT to "
                                         f"{target} with {status_line[:80]!r}")
    phases["proxy_s"] = round(time.monotonic() - start, 4)


def _tls(sock: socket.socket, egress: Egress, host: str, deadline: float,
         phases: dict) -> GuardedSSLSocket:
    start = time.monotonic()
    try:
        sock.settimeout(_left(deadline))
        context = egress.ssl_context()
        context.sslsocket_class = GuardedSSLSocket
        tls = context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        sock.close()
        raise _untrusted(e, host) from None
    except socket.timeout:
        sock.close()
        raise DialError(J.NO_ANSWER, f"{host}: no answer to the TLS handshake in "
                                     f"{time.monotonic() - start:.1f}s", timed_out=True) from None
    except ssl.SSLError as e:
        sock.close()
        raise DialError(J.TLS_FAILED, f"{host}: {e.reason or e}") from None
    except OSError as e:
        sock.close()
        raise DialError(J.TLS_FAILED, f"{host}: {e.strerror or type(e).__name__} during "
                                      "the TLS handshake (a box on the way may block it)") from None
    phases["tls_s"] = round(time.monotonic() - start, 4)
    return cast(GuardedSSLSocket, tls)   # the context's sslsocket_class


def _untrusted(e: ssl.SSLCertVerificationError, host: str) -> DialError:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if e.verify_code == _NOT_YET_VALID:
        return DialError(J.CLOCK_BEHIND, f"{host}: its certificate is not valid yet by this "
                                         f"device's clock ({now}): is the clock synchronised?")
    if e.verify_code == _EXPIRED:
        return DialError(J.TLS_EXPIRED, f"{host}: its certificate has expired by this device's "
                                        f"clock ({now})")
    return DialError(J.TLS_UNTRUSTED, f"{host}: {e.verify_message} (is a box inspecting TLS? "
                                      "then [server] ca_file is its CA)")
