"""The project's APT repository as apt is set up to reach it (operator #50.3): the
doctor fetches its ``InRelease`` the way apt would, through apt's proxy and with apt's
CA, so that an upgrade that would fail behind the site's proxy fails here, loudly.

What apt is told is asked of apt itself (``apt-config dump``: apt.conf.d included,
``APT_CONFIG`` honoured): ``Acquire::http::Proxy`` / ``Acquire::https::Proxy`` (and the
per-host forms, ``DIRECT`` for none), ``Acquire::https::CAInfo``, and where the sources
are (``Dir``, ``Dir::Etc``, ``Dir::Etc::sourceparts``). The project's repository is the
sources file docs/upgrading.md names: ``edge-agent.list`` (one-line form) or
``edge-agent.sources`` (deb822). The fetch goes through the agent's egress (one
deadline over the whole exchange, a byte bound), never apt-get itself.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..base import children
from ..base.fsutil import read_bounded

SOURCES = ("edge-agent.list", "edge-agent.sources")
CONFIG_TIMEOUT_S = 5.0
FETCH_TIMEOUT_S = 10.0
MAX_CONFIG_BYTES = 1 << 20
MAX_SOURCES_BYTES = 64 * 1024
MAX_INRELEASE_BYTES = 4 << 20
_DUMP_LINE = re.compile(r'^(\S+) "(.*)";$')


@dataclass(frozen=True)
class Repository:
    uri: str
    suite: str
    source: str       # the file it was read from

    @property
    def inrelease(self) -> str:
        base = self.uri.rstrip("/")
        if self.suite.endswith("/"):   # a flat repository: the suite is a path in it
            path = self.suite.strip("/").removeprefix(".").strip("/")
            return f"{base}/{path}/InRelease" if path else f"{base}/InRelease"
        return f"{base}/dists/{self.suite}/InRelease"


# -- the pure parts ---------------------------------------------------------------------
def parse_dump(text: str) -> dict[str, str]:
    """``apt-config dump``'s ``Key "value";`` lines (a list's items repeat a key: the
    last is kept, and none of the keys read here is a list). Keys in lower case: apt
    looks them up without case, and the dump prints them as the operator wrote them
    (``CaInfo``, a host in capitals); read them with ``_get``."""
    values = {}
    for line in text.splitlines():
        m = _DUMP_LINE.match(line.strip())
        if m:
            values[m.group(1).lower()] = m.group(2).replace('\\"', '"')
    return values


def _get(config: dict[str, str], key: str, default: str | None = None) -> str | None:
    return config.get(key.lower(), default)


def sources_dir(config: dict[str, str]) -> str:
    root = _get(config, "Dir", "/")
    etc = _get(config, "Dir::Etc", "etc/apt")
    parts = _get(config, "Dir::Etc::sourceparts", "sources.list.d")
    etc = etc if etc.startswith("/") else os.path.join(root, etc)
    return parts if parts.startswith("/") else os.path.join(etc, parts)


def parse_sources(name: str, text: str) -> Repository | None:
    """The first ``deb`` entry of a one-line ``.list`` or a deb822 ``.sources`` file."""
    if name.endswith(".sources"):
        for stanza in re.split(r"\n\s*\n", text):
            fields = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" in fields.get("types", "").split() and fields.get("uris") \
                    and fields.get("suites"):
                return Repository(fields["uris"].split()[0], fields["suites"].split()[0], name)
        return None
    for line in text.splitlines():
        line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
        if len(line) >= 3 and line[0] == "deb":
            return Repository(line[1], line[2], name)
    return None


def apt_proxy(config: dict[str, str], url: str) -> tuple[str | None, str]:
    """(apt's proxy for ``url``, the key that says it); None: direct. The per-host key
    first; https falls back to http's, as apt's https method does."""
    parts = urlsplit(url)
    schemes = ("https", "http") if parts.scheme == "https" else ("http",)
    for scheme in schemes:
        for key in (f"Acquire::{scheme}::Proxy::{parts.hostname}", f"Acquire::{scheme}::Proxy"):
            value = _get(config, key)
            if value:
                return (None if value.upper() == "DIRECT" else value), key
    return None, "no Acquire::http::Proxy"


def apt_ca(config: dict[str, str], url: str) -> str | None:
    host = urlsplit(url).hostname
    return _get(config, f"Acquire::https::{host}::CAInfo") or _get(config, "Acquire::https::CAInfo")


# -- the shell -------------------------------------------------------------------------
def apt_config() -> tuple[dict[str, str] | None, str]:
    argv = ["apt-config", "dump"]
    try:
        child = children.spawn(argv)
        out, _ = children.finish(child, CONFIG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"apt-config did not answer in {CONFIG_TIMEOUT_S:g} s"
    except OSError as e:
        return None, ("apt-config is not here (no apt)" if isinstance(e, FileNotFoundError)
                      else children.failure(argv, error=e))
    if child.returncode != 0:
        return None, children.failure(argv, exited=child.returncode)
    return parse_dump(out[:MAX_CONFIG_BYTES].decode("utf-8", "replace")), ""


def find(config: dict[str, str]) -> Repository | None:
    where = sources_dir(config)
    for name in SOURCES:
        try:
            text = read_bounded(os.path.join(where, name), MAX_SOURCES_BYTES,
                                follow_links=True).decode("utf-8", "replace")
        except (OSError, ValueError):
            continue
        found = parse_sources(os.path.join(where, name), text)
        if found is not None:
            return found
    return None


def examine() -> dict:
    """What the doctor's repository step judges: {skipped} or {url, via, ca, and either
    took_s and bytes, or problem}."""
    config, why = apt_config()
    if config is None:
        return {"skipped": why}
    repo = find(config)
    if repo is None:
        return {"skipped": f"no project repository configured ({' or '.join(SOURCES)} "
                           f"in {sources_dir(config)})"}
    proxy, key = apt_proxy(config, repo.inrelease)
    ca = apt_ca(config, repo.inrelease)
    return {"url": repo.inrelease, "source": repo.source, "ca": ca,
            **fetch(repo.inrelease, proxy, key, ca)}


def fetch(url: str, proxy: str | None, key: str, ca: str | None) -> dict:
    """InRelease at ``url`` through ``proxy`` (None: direct) trusting ``ca`` (None: the
    system's store), under one deadline and a byte bound: {via, took_s, bytes} or
    {via, problem}. The proxy's password is never in what it says."""
    import requests

    from ..base.egress import Egress, EgressError, parse_proxy
    from ..base.http import HostileAnswer, read_capped
    from ..runtime.deadline import deadline
    try:
        egress = Egress(proxy=parse_proxy(proxy, key) if proxy else None, ca_file=ca)
    except EgressError as e:
        return {"via": key, "problem": str(e)}
    via = f"{egress.proxy.display} ({key})" if egress.proxy else "direct"
    secret = egress.proxy.password if egress.proxy else None
    start = time.monotonic()
    session = egress.session(url)
    session.max_redirects = 3
    try:
        with deadline(FETCH_TIMEOUT_S):
            r = session.get(url, timeout=(FETCH_TIMEOUT_S, FETCH_TIMEOUT_S), stream=True)
            try:
                raw = read_capped(r, MAX_INRELEASE_BYTES)
            finally:
                r.close()
    except (requests.RequestException, HostileAnswer, OSError) as e:
        words = _words(e)
        return {"via": via, "problem": words.replace(secret, "***") if secret else words}
    took = round(time.monotonic() - start, 3)
    if r.status_code != 200:
        return {"via": via, "problem": f"HTTP {r.status_code}", "took_s": took}
    if len(raw) > MAX_INRELEASE_BYTES:
        return {"via": via, "problem": f"over {MAX_INRELEASE_BYTES} bytes: not an InRelease"}
    if not raw.startswith(b"-----BEGIN PGP SIGNED MESSAGE-----"):
        return {"via": via, "problem": "the answer is not a signed InRelease (a proxy's "
                                       "or a portal's page?)", "took_s": took}
    return {"via": via, "took_s": took, "bytes": len(raw)}


def _words(e: Exception) -> str:
    text = str(e) or type(e).__name__
    if "ProxyError" in type(e).__name__:
        return f"the proxy refused or did not answer ({text[:200]})"
    if "SSLError" in type(e).__name__:
        return f"the repository's certificate is not trusted ({text[:200]})"
    return f"{type(e).__name__}: {text[:200]}"
