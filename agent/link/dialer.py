"""The link's socket, dialed by the agent rather than the library, so that a failed
connect says why.

websocket-client would do this itself, and python-socketio would turn whatever went
wrong into "Connection error". Dialing here, phase by phase, gives each failure its
reason from the journal's vocabulary (a name that does not resolve, a reset, a proxy
that wants credentials, a certificate not valid yet by a clock that is behind, a
server that accepts the TCP handshake and then says nothing), the time each phase
took (what the connect bound is learnt from), and one rule for the proxy
(``Egress.proxy_for``) instead of the library's own reading of the environment.
"""
from __future__ import annotations

import errno
import socket
import ssl
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import urlsplit

from ..egress import Egress, Proxy
from . import journal as J

MAX_PROXY_ANSWER = 16 * 1024
# verify codes of OpenSSL's X509_V_ERR_*: the clock's side of a certificate check
_NOT_YET_VALID = 9
_EXPIRED = 10
_UNREACHABLE_ERRNOS = {errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL,
                       errno.ENETDOWN}


class DialError(Exception):
    """A failed dial: ``reason`` from the journal's vocabulary, ``detail`` for a person."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Dialed:
    """A connected socket (TLS done when the URL asked for it) and what it cost."""
    sock: socket.socket
    phases: dict[str, float] = field(default_factory=dict)   # seconds each phase took
    via: str = "direct"                                      # or the proxy, for a person


def dial(url: str, egress: Egress, timeout: float) -> Dialed:
    """Connects to ``url``'s host through the proxy ``egress`` names for it, within
    ``timeout`` seconds overall; raises DialError with the reason."""
    parts = urlsplit(url)
    secure = parts.scheme in ("wss", "https")
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    deadline = time.monotonic() + timeout
    phases: dict[str, float] = {}
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
    return Dialed(sock, phases, proxy.display if proxy else "direct")


def _left(deadline: float) -> float:
    return max(0.05, deadline - time.monotonic())


def _tcp(host: str, port: int, deadline: float, phases: dict,
         proxy: Proxy | None = None) -> socket.socket:
    def fail(reason: str, what: str):
        if proxy is not None:
            return DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display}: {what}")
        return DialError(reason, f"{host}:{port}: {what}")

    start = time.monotonic()
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise fail(J.DNS_FAILED, f"name not resolved ({e.strerror})") from None
    except UnicodeError:
        raise fail(J.DNS_FAILED, "name not resolved (not a valid name)") from None
    phases["dns_s"] = round(time.monotonic() - start, 4)
    last: DialError | None = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        start = time.monotonic()
        try:
            sock.settimeout(_left(deadline))
            sock.connect(address)
            phases["tcp_s"] = round(time.monotonic() - start, 4)
            return sock
        except socket.timeout:
            last = fail(J.CONNECT_TIMEOUT, "no answer to the TCP handshake in "
                                           f"{time.monotonic() - start:.1f}s")
        except ConnectionRefusedError:
            last = fail(J.CONNECTION_REFUSED, "connection refused (nothing listens there, "
                                              "or a firewall rejects it)")
        except OSError as e:
            unreachable = e.errno in _UNREACHABLE_ERRNOS
            last = fail(J.NETWORK_UNREACHABLE if unreachable else J.CONNECT_FAILED,
                        e.strerror or type(e).__name__)
        sock.close()
        if time.monotonic() >= deadline:
            break
    raise last or fail(J.DNS_FAILED, "the name has no address")


def _tunnel(sock: socket.socket, proxy: Proxy, host: str, port: int, deadline: float,
            phases: dict) -> None:
    """HTTP CONNECT through ``proxy`` to host:port; the socket is then the server's."""
    start = time.monotonic()
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    auth = proxy.authorization()
    if auth is not None:
        request += f"Proxy-Authorization: {auth}\r\n"
    answer = b""
    try:
        sock.settimeout(_left(deadline))
        sock.sendall((request + "\r\n").encode("latin-1"))
        while b"\r\n\r\n" not in answer:
            sock.settimeout(_left(deadline))
            chunk = sock.recv(4096)
            if not chunk:
                raise DialError(J.PROXY_REFUSED, f"the proxy {proxy.display} closed the "
                                                 "connection instead of answering CONNECT")
            answer += chunk
            if len(answer) > MAX_PROXY_ANSWER:
                raise DialError(J.PROXY_REFUSED, f"the proxy {proxy.display} answered "
                                                 "CONNECT with more than a header")
    except socket.timeout:
        raise DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display} did not answer "
                                             "CONNECT in time") from None
    except OSError as e:
        raise DialError(J.PROXY_UNREACHABLE, f"the proxy {proxy.display}: "
                                             f"{e.strerror or type(e).__name__}") from None
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1")
    words = status_line.split(" ", 2)
    code = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    if code in (401, 407):   # tinyproxy answers a CONNECT with bad credentials 401
        said = "refused the configured credentials" if auth else "asks for credentials"
        raise DialError(J.PROXY_AUTH, f"the proxy {proxy.display} {said} ({code})")
    if not 200 <= code < 300:
        raise DialError(J.PROXY_REFUSED, f"the proxy {proxy.display} answered CONNECT to "
                                         f"{target} with {status_line[:80]!r}")
    phases["proxy_s"] = round(time.monotonic() - start, 4)


def _tls(sock: socket.socket, egress: Egress, host: str, deadline: float,
         phases: dict) -> ssl.SSLSocket:
    start = time.monotonic()
    try:
        sock.settimeout(_left(deadline))
        tls = egress.ssl_context().wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        sock.close()
        raise _untrusted(e, host) from None
    except socket.timeout:
        sock.close()
        raise DialError(J.NO_ANSWER, f"{host}: no answer to the TLS handshake in "
                                     f"{time.monotonic() - start:.1f}s") from None
    except ssl.SSLError as e:
        sock.close()
        raise DialError(J.TLS_FAILED, f"{host}: {e.reason or e}") from None
    except OSError as e:
        sock.close()
        raise DialError(J.TLS_FAILED, f"{host}: {e.strerror or type(e).__name__} during "
                                      "the TLS handshake (a box on the way may block it)") from None
    phases["tls_s"] = round(time.monotonic() - start, 4)
    return tls


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
