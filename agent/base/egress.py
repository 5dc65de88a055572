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

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

if TYPE_CHECKING:
    import ssl

    import requests  # type: ignore[import]  # no stubs on Debian 12 (python3-typeshed)


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
        import base64
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
    """The way out to the server: a proxy or none, what bypasses it, the CA, a client cert."""
    proxy: Proxy | None = None
    no_proxy: tuple[str, ...] = ()
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def proxy_for(self, host: str, port: int) -> Proxy | None:
        if self.proxy is None or bypasses(self.no_proxy, host, port):
            return None
        return self.proxy

    def session(self, url: str) -> "requests.Session":
        """A requests session for ``url``'s server, going out this way and no other
        (base/http.py: requests is imported only by what makes an exchange)."""
        from . import http
        return http.session(self, url)

    def ssl_context(self) -> ssl.SSLContext:
        """Verification on, against the site's CA when one is configured (and then
        only it, as requests does with a CA path), with the client certificate."""
        import ssl
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def default_port(scheme: str | None) -> int:
    return 443 if scheme in ("https", "wss") else 80
