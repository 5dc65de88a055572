"""The doctor's probes: each looks once, bounded in time, and says what it found as
plain data for the judges (doctor.py).

Beside a running agent, nothing here disturbs it: the configuration and the status
file are read, never written; the token is looked at on disk and never sent (a second
session in this device's name could end the agent's own on a server that keeps one
per device: the running agent's status says whether the server takes it); the upgrade
opens an Engine.IO session that joins no namespace; the only write is a probe file in
the state directory, made, synced and removed as the directory's owner. The network
steps go the agent's own way (link/upgrade.py's dial and upgrade, base/egress.py's
proxy and CA), so what passes here is what the agent's connect meets.
"""
from __future__ import annotations

import json
import os
import pwd
import select
import signal
import socket
import stat
import subprocess
import time
from dataclasses import asdict
from urllib.parse import urlsplit

from ..base import children, status_file
from ..base.clock import kernel_synced
from ..base.egress import default_port
from ..base.fsutil import UnsafePath, drop_to_owner, read_json
from ..base.identifiers import token_problem
from ..config import load as cfgmod
from ..config.model import Config
from ..identity import credentials, kind_probe, kind_record
from . import doctor as D
from . import status as status_view

RESOLVE_TIMEOUT_S = 5.0      # getent: a resolver that does not answer
CLOCK_TIMEOUT_S = 3.0        # timedatectl: a bus that does not answer
CONNECT_TIMEOUT_S = 10.0     # the dial and the upgrade together, at most
OPEN_TIMEOUT_S = 5.0         # Engine.IO's open packet after the upgrade
STORAGE_TIMEOUT_S = 5.0      # a write and its fsync on a slow card
DISPLAY_TIMEOUT_S = 3.0      # one display source's program
MAX_OPEN_PACKET = 4096


def examine(config_path: str) -> tuple[list[D.Step], list[str]]:
    """Every step, in order, and notes (who ran it, whether an agent runs beside it)."""
    notes = []
    if os.geteuid() == 0:
        notes.append("run as root: the state directory is written as its owner; run it as "
                     "the agent's user to see exactly what it sees "
                     "(sudo -u edge-agent edge-agent doctor)")
    try:
        config = cfgmod.load(config_path)
    except cfgmod.ConfigError as e:
        first = D.step("configuration", D.FAIL, f"{config_path}: {e}",
                       "edge-agent check-config says the same; fix the key it names")
        return [first] + [D.not_checked(n, "configuration") for n in D.STEPS[1:]], notes
    steps = [_configuration(config)]
    agent = _running_agent(config)
    if agent:
        notes.append(f"an agent runs beside this (pid {agent.get('pid')}): it is not touched")
    storage_step = D.judge_storage(storage(config.identity.state_dir))   # before any thread
    net, skew = _network(config)
    steps.append(D.judge_clock(*clock_sync(), skew))
    steps += net
    # on disk whatever the network did; whether the server takes it, the running agent says
    steps.append(D.judge_token(token(config, agent)))
    steps.append(D.step("upload", D.INFO, "not sent: a test upload would leave a record on "
                                          "the fleet server; uploads go the way the upgrade "
                                          "went, and edge-agent status shows the queue"))
    steps.append(storage_step)
    steps.append(D.judge_display(display(config)))
    return steps, notes


def _failed(steps: list[D.Step]) -> str | None:
    return next((s.name for s in steps if s.verdict == D.FAIL), None)


def _configuration(config: Config) -> D.Step:
    said = (f"{config.source}: ok (profile {config.server.profile}, server "
            f"{config.server.display}, proxy "
            f"{config.server.egress.proxy.display if config.server.egress.proxy else 'none'})")
    if config.fleet_problem:
        return D.step("configuration", D.WARN, said + f"; the fleet's settings are not "
                                                      f"applied: {config.fleet_problem}",
                      "the local file alone is in force; edge-agent check-config")
    return D.step("configuration", D.OK, said)


def _running_agent(config: Config) -> dict | None:
    try:
        doc = status_file.read(config.status_path)
    except status_file.StatusFileError:
        return None
    running, _ = status_view.verdict(doc)
    return doc if running else None


# -- the clock --------------------------------------------------------------------------
def clock_sync() -> tuple[bool | None, str]:
    """Whether NTP has the clock, and who said so: timedatectl, else the kernel."""
    argv = ["timedatectl", "show", "-p", "NTPSynchronized", "--value"]
    try:
        child = children.spawn(argv)
        out, _ = children.finish(child, CLOCK_TIMEOUT_S)
        said = out.strip()
        if child.returncode == 0 and said in (b"yes", b"no"):
            return said == b"yes", "timedatectl"
    except (OSError, subprocess.TimeoutExpired):
        pass
    # no systemd to ask (a container): the kernel's own flag, set by any NTP client
    synced = kernel_synced()
    if synced is None:
        return None, "neither timedatectl nor adjtimex answered"
    return synced, "the kernel's NTP state"


# -- the network: the name, the route, then the agent's own dial and upgrade -----------
def _network(config: Config) -> tuple[list[D.Step], float | None]:
    parts = urlsplit(config.server.url)
    host, port = parts.hostname or "", parts.port or default_port(parts.scheme)
    egress = config.server.egress
    proxy = egress.proxy_for(host, port)
    first_host, first_port = (proxy.host, proxy.port) if proxy else (host, port)
    addresses, problem = resolve(first_host)
    steps = [D.judge_dns(first_host, addresses, problem)]
    if problem is None:
        steps.append(D.judge_route(first_host, route(addresses, first_port)))
    later = ["route", "tcp", "proxy", "tls", "upgrade", "profile"][len(steps) - 1:]
    if _failed(steps):
        return steps + [D.not_checked(n, _failed(steps)) for n in later], None
    found = upgrade(config.server.url, egress, min(config.server.connect_timeout_s * 2,
                                                   CONNECT_TIMEOUT_S))
    found["target"] = f"{host}:{port}"
    found["ca"] = egress.ca_file or "the system's CA store"
    steps += D.judge_connect(found, proxy.display if proxy else None,
                             parts.scheme in ("https", "wss"))
    if _failed(steps):
        return steps + [D.not_checked("profile", _failed(steps))], found.get("skew_s")
    steps.append(D.judge_profile(*server_kind(config)))
    return steps, found.get("skew_s")


def server_kind(config: Config) -> tuple:
    """(the profile configured, the one auto recorded, the server's kind by its answers):
    two questions that change nothing on the server (identity/server_kind.py)."""
    recorded = kind_record.chosen(config.server, config.identity.state_dir)
    verdict = kind_probe.ask(config.server.egress.session(config.server.url), config.server.url)
    return (config.server.profile,
            recorded.profile if recorded.how == "recorded" else None, verdict)


def resolve(host: str) -> tuple[list[str], str | None]:
    """The addresses ``host`` resolves to (getent: the system's resolver, bounded)."""
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return [host], None
    except OSError:
        pass
    argv = ["getent", "ahosts", host]
    try:
        child = children.spawn(argv)
        out, err = children.finish(child, RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [], f"no answer from the resolver in {RESOLVE_TIMEOUT_S:g} s"
    except OSError as e:
        return [], children.failure(argv, error=e)
    addresses: list[str] = []
    for line in out[:65536].decode("ascii", "replace").splitlines():
        address = line.split(" ", 1)[0]
        if address and address not in addresses:
            addresses.append(address)
    if child.returncode != 0 or not addresses:
        return [], "the name does not resolve"
    return addresses, None


def route(addresses: list[str], port: int) -> dict:
    """The UDP connect trick: the kernel picks a route and a source address, and sends
    nothing. {address: the local address, or "!" and why not}."""
    found = {}
    for address in addresses[:4]:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((address, port))
                found[address] = s.getsockname()[0]
        except OSError as e:
            found[address] = "!" + (e.strerror or type(e).__name__)
    return found


def upgrade(url: str, egress, timeout: float) -> dict:
    """The link's own dial and websocket upgrade (link/upgrade.py), then Engine.IO's open
    packet: {phases, reason and detail if it failed, eio (the ping interval), skew_s}."""
    from ..link.dialer import DialError           # the link's libraries: only when asked
    from ..link.upgrade import dial_and_upgrade
    parts = urlsplit(url)
    scheme = "wss" if parts.scheme in ("https", "wss") else "ws"
    ws_url = f"{scheme}://{parts.netloc}/socket.io/?transport=websocket&EIO=4"
    phases: dict = {}
    try:
        answer = dial_and_upgrade(ws_url, egress, timeout, {}, phases=phases)
    except DialError as e:
        return {"phases": phases, "reason": e.reason, "detail": e.detail}
    found: dict = {"phases": phases}
    if answer.server_date is not None:
        found["skew_s"] = round(answer.server_date - answer.answered_at, 1)
    try:
        answer.dialed.sock.settimeout(OPEN_TIMEOUT_S)
        packet = answer.ws.recv()
        if isinstance(packet, str) and packet.startswith("0") and len(packet) < MAX_OPEN_PACKET:
            found["eio"] = json.loads(packet[1:])["pingInterval"] / 1000
        else:
            found["eio_problem"] = "its first message is not an Engine.IO open"
    except Exception as e:   # whatever the library makes of a bad peer: said, not raised
        found["eio_problem"] = type(e).__name__
    finally:
        answer.ws.shutdown()
    return found


# -- the token, the state directory, the display -------------------------------------
def token(config: Config, agent: dict | None) -> dict:
    """Where the token is and how it is kept; what the running agent's link says."""
    found: dict = {}
    link = (agent or {}).get("link") or {}
    if link.get("reason") == "refused" and link.get("state") != "online":
        found["refused"] = link.get("detail") or "refused"
    if link.get("state"):
        found["link_state"] = link["state"]
    if config.identity.token is not None:
        return {**found, "where": "config"}
    path = os.path.join(config.identity.state_dir, credentials.FILE)
    try:
        st = os.stat(path)
        found["agent_user"] = _user(os.stat(config.identity.state_dir).st_uid)
    except FileNotFoundError:
        return found
    except OSError as e:
        return {**found, "where": path, "unreadable": e.strerror}
    found.update(where=path, mode=stat.S_IMODE(st.st_mode), owner=_user(st.st_uid))
    try:
        doc = read_json(path, credentials.MAX_BYTES, follow_links=True)
    except ValueError:
        return {**found, "problem": "not JSON"}
    except OSError as e:
        return {**found, "unreadable": e.strerror}
    found["problem"] = (token_problem("token", doc.get("token")) if isinstance(doc, dict)
                        else "not a JSON object")
    return found


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def storage(state_dir: str) -> dict:
    """A tiny write, its fsync and its removal in ``state_dir``, as its owner: in a
    child, which may become that user for good (root's dropping has no way back)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(_write_probe(state_dir)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], STORAGE_TIMEOUT_S)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return {"dir": state_dir, "error": f"no write done in {STORAGE_TIMEOUT_S:g} s "
                                               f"(a failing card?)"}
        with os.fdopen(read_end, "rb", closefd=False) as f:
            out = f.read(4096)
    finally:
        os.close(read_end)
        # a child stuck in an fsync on a dying card outlives SIGKILL: looked at once,
        # then left to init; the doctor never waits on the card it diagnoses
        for _ in range(20):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            time.sleep(0.05)
    try:
        return json.loads(out)
    except ValueError:
        return {"dir": state_dir, "error": "the probe ended without a word"}


def _write_probe(state_dir: str) -> dict:
    found: dict = {"dir": state_dir}
    try:
        found["owner"] = _user(os.stat(state_dir).st_uid)
        drop_to_owner(state_dir)
        found["as"] = _user(os.geteuid())
        path = os.path.join(state_dir, f".doctor-probe-{os.getpid()}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, b"edge-agent doctor\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(path)
        fs = os.statvfs(state_dir)
        found["free_bytes"] = fs.f_bavail * fs.f_frsize
    except UnsafePath as e:
        found["error"] = str(e)
    except OSError as e:
        found["error"] = e.strerror or type(e).__name__
    found.setdefault("as", _user(os.geteuid()))
    return found


def display(config: Config, sysfs_root: str = "/sys") -> list[dict]:
    """Each display source read once, as the screen part reads it (screen/sources.py)."""
    from ..screen.service import x_display_of
    from ..screen.sources import NO_CONNECTOR_CONNECTED, Cec, Drm, Runner, Wayland, X11Dpms
    runner = Runner(DISPLAY_TIMEOUT_S)
    path = os.environ.get("PATH")
    sources = [Drm(sysfs_root), X11Dpms(x_display_of(config.screen, config.commands, os.environ),
                                    runner, path),
               Wayland(dict(os.environ), runner), Cec(config.screen.cec_device, runner, path)]
    readings = [asdict(source.read()) for source in sources]
    for reading in readings:
        reading["unplugged"] = reading["source"] == Drm.name and \
            reading["said"] == NO_CONNECTOR_CONNECTED
    return readings
