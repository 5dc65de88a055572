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

import errno
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

from ..base import children, status_file, sysfs
from ..base import system_watchdog as system_watchdog_rules
from ..base import reasons as J
from ..base.clock import kernel_synced
from ..base.egress import default_port
from ..base.fsutil import UnsafePath, drop_to_owner, read_json
from ..base.hardware import board_fingerprint
from ..base.identifiers import token_problem
from ..config import load as cfgmod
from ..config.model import Config
from ..identity import board, credentials, kind_probe, kind_record
from . import doctor as D
from . import status as status_view
from . import apt_repository, unit_env

RESOLVE_TIMEOUT_S = 5.0      # getent: a resolver that does not answer
CLOCK_TIMEOUT_S = 3.0        # timedatectl: a bus that does not answer
CONNECT_TIMEOUT_S = 10.0     # the dial and the upgrade together, at most
OPEN_TIMEOUT_S = 5.0         # Engine.IO's open packet after the upgrade
STORAGE_TIMEOUT_S = 5.0      # a write and its fsync on a slow card
DISPLAY_TIMEOUT_S = 3.0      # one display source's program
MAX_OPEN_PACKET = 4096
MAX_OPEN_BYTES = 65536       # all that may come before the open (pings included)


def examine(config_path: str) -> tuple[list[D.Step], list[str]]:
    """Every step, in order, and notes (who ran it, whether an agent runs beside it)."""
    notes = []
    if os.geteuid() == 0:
        notes.append("run as root: the state directory is written as its owner; run it as "
                     "the agent's user to see exactly what it sees "
                     "(sudo -u edge-agent edge-agent doctor)")
    unit = unit_env.read()   # what systemd gives the agent, not this shell (#50.2)
    notes += [unit.said(), *unit.notes]
    environ = unit.over(os.environ)
    try:
        config = cfgmod.load(config_path, env=environ)
    except cfgmod.ConfigError as e:
        first = D.step("configuration", D.FAIL, f"{config_path}: {e}",
                       "edge-agent check-config says the same; fix the key it names")
        return [first] + [D.not_checked(n, "configuration") for n in D.STEPS[1:]], notes
    steps = [_configuration(config, unit)]
    agent = _running_agent(config)
    if agent:
        notes.append(f"an agent runs beside this (pid {agent.get('pid')}): it is not touched")
    storage_step = D.judge_storage(storage(config.identity.state_dir))   # before any thread
    on_disk = credentials_on_disk(config.identity.state_dir)             # likewise
    net, skew = _network(config)
    steps.append(D.judge_clock(*clock_sync(), skew))
    steps += net
    # on disk whatever the network did; whether the server takes it, the running agent says
    steps.append(D.judge_token(token(config, agent, on_disk)))
    steps.append(D.judge_card(card(config)))
    steps.append(D.step("upload", D.INFO, "not sent: a test upload would leave a record on "
                                          "the fleet server; uploads go the way the upgrade "
                                          "went, and edge-agent status shows the queue"))
    steps.append(storage_step)
    readings = display(config, environ=environ)
    steps.append(D.judge_display(readings))
    steps.append(D.judge_screen(screen(config, environ, agent, readings)))
    steps.append(D.judge_repository(apt_repository.examine()))
    steps.append(D.judge_watchdog(system_watchdog(config)))
    return steps, notes


def _failed(steps: list[D.Step]) -> str | None:
    return next((s.name for s in steps if s.verdict == D.FAIL), None)


def _configuration(config: Config, unit: "unit_env.UnitEnvironment") -> D.Step:
    proxy = config.server.egress.proxy
    came = ""
    if proxy is not None and proxy.source.endswith("(environment)"):
        name = proxy.source.split(" ")[0]
        came = f" from {name}, {unit.origin(name)}"
    said = (f"{config.source}: ok (profile {config.server.profile}, server "
            f"{config.server.display}, proxy {proxy.display if proxy else 'none'}{came})")
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


# -- the system's watchdog -----------------------------------------------------------------
WATCHDOG_PROPERTY = ["busctl", "get-property", "org.freedesktop.systemd1",
                     "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager",
                     "RuntimeWatchdogUSec"]


def system_watchdog(config: Config, sysfs_root: str | None = None,
                    dropin: str = system_watchdog_rules.DROPIN) -> dict:
    """What [device] asks, what systemd's PID 1 says it runs (RuntimeWatchdogUSec, over
    D-Bus: exact microseconds, readable by any user), what sysfs says of /dev/watchdog0,
    whether the drop-in is there (never followed, never read)."""
    found: dict = {"configured_s": config.device.watchdog_s,
                   "device": sysfs.watchdog(sysfs_root or config.debug.sysfs),
                   "dropin": os.path.lexists(dropin)}
    try:
        child = children.spawn(WATCHDOG_PROPERTY)
        out, err = children.finish(child, CLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        found["systemd_problem"] = f"busctl: no answer in {CLOCK_TIMEOUT_S:g} s"
        return found
    except OSError as e:
        found["systemd_problem"] = children.failure(WATCHDOG_PROPERTY, error=e)
        return found
    seconds = system_watchdog_rules.parse_busctl(out[:256].decode("ascii", "replace"))
    if child.returncode != 0 or seconds is None:
        found["systemd_problem"] = children.failure(WATCHDOG_PROPERTY, exited=child.returncode,
                                                    stderr=err)
    else:
        found["systemd_s"] = seconds
    return found


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
        # one deadline and one byte bound for the open, whatever arrives before it: a
        # websocket ping is answered inside recv(), and would restart a read timeout
        answer.dialed.sock.guard(time.monotonic() + OPEN_TIMEOUT_S, MAX_OPEN_BYTES, DialError(
            J.HTTP_ERROR, f"more than {MAX_OPEN_BYTES} bytes and no Engine.IO open"))
        packet = answer.ws.recv()
        if isinstance(packet, str) and packet.startswith("0") and len(packet) < MAX_OPEN_PACKET:
            found["eio"] = json.loads(packet[1:])["pingInterval"] / 1000
        else:
            found["eio_problem"] = "its first message is not an Engine.IO open"
    except DialError as e:
        found["eio_problem"] = e.detail
    except Exception as e:   # whatever the library makes of a bad peer: said, not raised
        timed_out = isinstance(e, TimeoutError) or "Timeout" in type(e).__name__
        found["eio_problem"] = f"none in {OPEN_TIMEOUT_S:g} s" if timed_out else type(e).__name__
    finally:
        answer.ws.shutdown()
    return found


# -- the token, the state directory, the display -------------------------------------
def token(config: Config, agent: dict | None, on_disk: dict) -> dict:
    """Where the token is and how it is kept (``on_disk``: credentials_on_disk()'s); what
    the running agent's link says, each field of its status file read by its type."""
    found: dict = {}
    link, problem = agent_link(agent)
    if problem:
        found["status_problem"] = problem
    if link.get("reason") == "refused" and link.get("state") != "online":
        found["refused"] = link.get("detail") or "refused"
    if link.get("state"):
        found["link_state"] = link["state"]
    if config.identity.token is not None:
        return {**found, "where": "config"}
    return {**found, **on_disk}


def agent_link(agent: dict | None) -> tuple[dict, str | None]:
    """The running agent's link from its status file: (its fields of the right type,
    what is damaged). A link that is not an object, or a field that is not a string,
    is a finding, never a crash: the file is the agent user's to write."""
    if agent is None or agent.get("link") is None:   # none yet: an agent starting
        return {}, None
    link = agent["link"]
    if not isinstance(link, dict):
        return {}, f"its link is {_json_type(link)}, not an object"
    kept = {k: link[k] for k in ("state", "reason", "detail")
            if isinstance(link.get(k), str)}
    wrong = [f"link.{k} is {_json_type(link[k])}" for k in ("state", "reason", "detail")
             if link.get(k) is not None and k not in kept]
    return kept, "; ".join(wrong) + ", not a string" if wrong else None


def _json_type(value) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "?")


def credentials_on_disk(state_dir: str) -> dict:
    """credentials.json looked at as the state directory's owner (a child that becomes
    it, as storage() does): never through a link, never by root; its mode and owner,
    whether its token is usable. Never the token."""
    where = os.path.join(state_dir, credentials.FILE)
    return as_owner(state_dir, _look_at_credentials, STORAGE_TIMEOUT_S,
                    lambda why: {"where": where, "unreadable": why})


def _look_at_credentials(state_dir: str) -> dict:
    path = os.path.join(state_dir, credentials.FILE)
    found: dict = {}
    try:
        found["agent_user"] = _user(os.stat(state_dir).st_uid)
        drop_to_owner(state_dir)
        st = os.lstat(path)
    except FileNotFoundError:
        return found
    except UnsafePath as e:
        return {**found, "where": path, "unreadable": str(e)}
    except OSError as e:
        return {**found, "where": path, "unreadable": e.strerror or type(e).__name__}
    found.update(where=path, mode=stat.S_IMODE(st.st_mode), owner=_user(st.st_uid))
    if stat.S_ISLNK(st.st_mode):
        return {**found, "problem": "a symbolic link, not the agent's file: not followed"}
    try:
        doc = read_json(path, credentials.MAX_BYTES)
    except ValueError:
        return {**found, "problem": "not JSON"}
    except OSError as e:
        if e.errno == errno.ELOOP:   # made a link since: the same finding
            return {**found, "problem": "a symbolic link, not the agent's file: not followed"}
        return {**found, "unreadable": e.strerror or type(e).__name__}
    found["problem"] = (token_problem("token", doc.get("token")) if isinstance(doc, dict)
                        else "not a JSON object")
    return found


def card(config: Config) -> dict:
    """The clone check as the agent's next start would judge it: nothing is written."""
    kept = board.read(config.identity.state_dir)
    found = board_fingerprint(config.debug.sysfs)
    return {"verdict": board.judge(kept, found), "read_from": found[0] if found else None,
            **board.history(kept)}


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def storage(state_dir: str) -> dict:
    """A tiny write, its fsync and its removal in ``state_dir``, as its owner."""
    return as_owner(state_dir, _write_probe, STORAGE_TIMEOUT_S,
                    lambda why: {"dir": state_dir, "error": why})


def as_owner(state_dir: str, probe, timeout_s: float, failed) -> dict:
    """``probe(state_dir)``'s dict, made in a child, which may become the directory's
    owner for good (root's dropping has no way back); ``failed(why)`` if it has not
    answered in ``timeout_s`` or said nothing. Run before any thread is started."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            os.write(write_end, json.dumps(probe(state_dir)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], timeout_s)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return failed(f"no answer in {timeout_s:g} s (a failing card?)")
        with os.fdopen(read_end, "rb", closefd=False) as f:
            out = f.read(65536)
    finally:
        os.close(read_end)
        # a child stuck in an fsync on a dying card outlives SIGKILL: looked at once,
        # then left to init; the doctor never waits on the card it diagnoses
        for _ in range(20):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
            select.select([], [], [], 0.05)   # time.sleep: EINVAL under faketime on 3.11
    try:
        return json.loads(out)
    except ValueError:
        return failed("the probe ended without a word")


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


def screen(config: Config, environ, agent: dict | None, readings: list[dict]) -> dict:
    """What this screen has, as the screen part finds it (its capture's choice, the
    display sources' readings), what the running agent last saw of the picture (its
    status file, each field by its type), the player unit's state (screen/player.py)."""
    from ..screen.capture import choose
    from ..screen.player import Player
    from ..screen.service import x_display_of
    capture = choose(config.screen.capture_command,
                     x_display_of(config.screen, config.commands, environ), environ)
    found: dict = {"capture": capture.how, "can_capture": capture.argv is not None,
                   "means": [(r["source"], r["present"], r["said"]) for r in readings]}
    found.update(_last_picture(agent))
    unit = config.screen.player_unit
    if unit:
        state = Player(unit).state()
        found.update(player=unit, player_said=state.said(), player_state=state.active,
                     player_load=state.load)
    return found


def _last_picture(agent: dict | None) -> dict:
    if agent is None:
        return {"picture_why": "no agent runs here, so no verdict"}
    shown = agent.get("screen")
    if shown is None:
        return {"picture_why": "the running agent watches no picture"}
    picture = shown.get("picture") if isinstance(shown, dict) else None
    if not isinstance(shown, dict) or not isinstance(picture, (dict, type(None))):
        return {"status_problem": "its screen is not an object"}
    if picture is None:
        return {"picture_why": "the running agent watches no picture ([screen] "
                               "picture_every_s)"}
    verdict, ago = picture.get("verdict"), picture.get("checked_s_ago")
    if not isinstance(verdict, (str, type(None))):
        return {"status_problem": f"screen.picture.verdict is {_json_type(verdict)}"}
    if verdict is None:
        return {"picture_why": "not checked yet"}
    number = (int, float)
    updated = agent.get("updated_at")
    age = None
    if isinstance(ago, number) and not isinstance(ago, bool):
        elapsed = (time.time() - updated if isinstance(updated, number)
                   and not isinstance(updated, bool) else 0.0)
        age = max(0.0, ago + max(0.0, elapsed))
    return {"picture": verdict[:40], "picture_age_s": age}


def display(config: Config, sysfs_root: str = "/sys", environ=None) -> list[dict]:
    """Each display source read once, as the screen part reads it (screen/sources.py),
    in the agent's environment (``environ``: the unit's; default this process's)."""
    environ = os.environ if environ is None else environ
    from ..screen.service import x_display_of
    from ..screen.sources import NO_CONNECTOR_CONNECTED, Cec, Drm, Runner, Wayland, X11Dpms
    runner = Runner(DISPLAY_TIMEOUT_S)
    path = environ.get("PATH")
    sources = [Drm(sysfs_root), X11Dpms(x_display_of(config.screen, config.commands, environ),
                                    runner, path),
               Wayland(dict(environ), runner), Cec(config.screen.cec_device, runner, path)]
    readings = [asdict(source.read()) for source in sources]
    for reading in readings:
        reading["unplugged"] = reading["source"] == Drm.name and \
            reading["said"] == NO_CONNECTOR_CONNECTED
    return readings
