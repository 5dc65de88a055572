"""`edge-agent doctor`: each step from the configuration to the display checked now, in
the order a connect meets them, each judged ok, info, warn or fail in one plain line
with what to do.

The probes (doctor_probes.py) look and measure; the judges here are pure functions of
what they found, so every verdict's words are tested without a network. A step that
later steps need stops them: with no TCP there is no TLS to judge, and those say "not
checked" rather than a second, misleading failure. The words per link reason are the
link's own (base/reasons.py, docs/troubleshooting.md): one vocabulary, one advice.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from ..base import reasons as J
from ..base import system_watchdog as W
from ..base.clock import printable_wall
from ..base.text import clean
from ..base.server_clock import NOTABLE_SKEW_S
from .status import STATUS_LINE_CHARS

OK, INFO, WARN, FAIL, NOT_CHECKED = "ok", "info", "warn", "fail", "not checked"
# the order they are checked and printed in: the link's steps as a connect meets them,
# then the device's own (what the screen has and shows, how it is upgraded)
STEPS = ("configuration", "clock", "dns", "route", "tcp", "proxy", "tls", "upgrade",
         "profile", "token", "card", "upload", "storage", "display", "screen", "repository",
         "watchdog")
# a failing step's exit status: its class (--help, the man page and operate.md say the
# same); the card step only warns, so it has none
EXIT_OK, EXIT_CONFIG, EXIT_CLOCK, EXIT_NETWORK, EXIT_TLS, EXIT_SERVER, EXIT_STORAGE, \
    EXIT_DISPLAY, EXIT_PACKAGES, EXIT_WATCHDOG = 0, 2, 3, 4, 5, 6, 7, 8, 9, 10
EXIT_OF = {"configuration": EXIT_CONFIG, "clock": EXIT_CLOCK, "dns": EXIT_NETWORK,
           "route": EXIT_NETWORK, "tcp": EXIT_NETWORK, "proxy": EXIT_NETWORK, "tls": EXIT_TLS,
           "upgrade": EXIT_SERVER, "profile": EXIT_SERVER, "token": EXIT_SERVER, "upload": EXIT_SERVER,
           "storage": EXIT_STORAGE, "display": EXIT_DISPLAY, "screen": EXIT_DISPLAY,
           "repository": EXIT_PACKAGES, "watchdog": EXIT_WATCHDOG}
DOCTOR_EXITS = """exit status (the first failing step's class; warnings exit 0):
  0  ok: every step, or only warnings and notes
  2  configuration: it does not load
  3  clock: far off the server's, or a certificate not valid yet by it
  4  network: the name, the route, the TCP handshake or the proxy
  5  TLS: the server's certificate is not trusted, or the handshake fails
  6  server: the websocket upgrade, the server's kind against [server] profile, or
     the stored token
  7  storage: the state partition is not writable
  8  display: connected, but it reads off; or the player unit failed
  9  packages: the project's repository cannot be fetched the way apt is set up
 10  watchdog: [device] hardware_watchdog is on, and the system's watchdog is not
     armed as configured"""
# the skew past which the clock fails: certificates' and tokens' times are judged by it
# (past the server clock's NOTABLE_SKEW_S it is worth a word, as in status)
SKEW_FAIL_S = 300.0
# the link's reason -> the step it fails, in the order a connect meets them
STEP_OF_REASON = {J.DNS_FAILED: "dns", J.NETWORK_UNREACHABLE: "route",
                  J.CONNECT_TIMEOUT: "tcp", J.CONNECTION_REFUSED: "tcp",
                  J.CONNECT_FAILED: "tcp", J.PROXY_UNREACHABLE: "tcp",
                  J.PROXY_AUTH: "proxy", J.PROXY_REFUSED: "proxy",
                  J.TLS_UNTRUSTED: "tls", J.CLOCK_BEHIND: "tls", J.TLS_EXPIRED: "tls",
                  J.TLS_FAILED: "tls", J.NO_ANSWER: "upgrade", J.CAPTIVE_PORTAL: "upgrade",
                  J.HTTP_ERROR: "upgrade", J.REFUSED: "token"}


@dataclass(frozen=True)
class Step:
    name: str
    verdict: str
    said: str               # one plain line: what was found (never a secret)
    todo: str = ""          # what to do about it
    reason: str | None = None   # the link's reason word, where one applies
    exit: int = EXIT_OK     # a failure's status; its step's class unless said otherwise


def step(name: str, verdict: str, said: str, todo: str = "", reason: str | None = None,
         exit: int | None = None) -> Step:
    if exit is None:
        exit = EXIT_OF[name] if verdict == FAIL else EXIT_OK
    return Step(name, verdict, said, todo, reason, exit)


def of_reason(name: str, reason: str, detail: str, exit: int | None = None) -> Step:
    """A failure in the link's words: its detail, its reason, the troubleshooting advice."""
    return step(name, FAIL, detail, J.WHAT_TO_DO.get(reason, ""), reason, exit)


# -- the judges: pure, over what the probes found -----------------------------------
def judge_clock(synchronised: bool | None, how: str, skew_s: float | None) -> Step:
    """``synchronised`` as NTP says (None: cannot tell, ``how`` says why); ``skew_s`` the
    server's Date minus this clock's time, when the upgrade was answered."""
    if skew_s is not None and abs(skew_s) > SKEW_FAIL_S:
        side = "behind" if skew_s > 0 else "ahead of"
        return step("clock", FAIL, f"this clock is {_duration(abs(skew_s))} {side} the "
                                   f"server's ({how})",
                    J.WHAT_TO_DO[J.CLOCK_BEHIND], J.CLOCK_BEHIND)
    measured = "" if skew_s is None else f", {abs(skew_s):.0f} s off the server's"
    if synchronised is False:
        return step("clock", WARN, f"not synchronised ({how}){measured}",
                    "timedatectl: is NTP on and does the site allow it (UDP 123)?")
    if skew_s is not None and abs(skew_s) > NOTABLE_SKEW_S:
        return step("clock", WARN, f"{how}{measured}", "timedatectl")
    if synchronised is None:
        return step("clock", INFO, f"synchronisation unknown ({how}){measured}")
    return step("clock", OK, f"synchronised ({how}){measured}")


def judge_dns(host: str, addresses: list[str], problem: str | None) -> Step:
    """``addresses`` the name resolved to, or ``problem`` (the resolver's words)."""
    if problem is not None:
        failed = of_reason("dns", J.DNS_FAILED, f"{host}: {problem}")
        return step("dns", FAIL, failed.said, failed.todo.replace("HOST", host), J.DNS_FAILED)
    if addresses == [host]:
        return step("dns", INFO, f"{host} is an address: nothing to resolve")
    shown = ", ".join(addresses[:3]) + (" ..." if len(addresses) > 3 else "")
    return step("dns", OK, f"{host} resolves to {shown}")


def judge_route(host: str, found: dict) -> Step:
    """``found``: the UDP connect trick per address, its local address or its error."""
    routed = {a: local for a, local in found.items() if not local.startswith("!")}
    if routed:
        address, local = next(iter(routed.items()))
        return step("route", OK, f"to {address} from {local}")
    why = "; ".join(f"{a}: {e[1:]}" for a, e in found.items())
    return of_reason("route", J.NETWORK_UNREACHABLE, f"no route to {host} ({why})")


def judge_connect(dial: dict, proxied: str | None, secure: bool) -> list[Step]:
    """The steps tcp, proxy, tls and upgrade from one dial and upgrade: ``dial`` has
    ``phases`` (dialer.dial's), and ``reason``/``detail`` if it failed, ``eio`` (what
    the server's Engine.IO said) if it was upgraded."""
    phases, reason = dial.get("phases", {}), dial.get("reason")
    failed_at = _failed_step(phases, reason, proxied, secure)
    steps: list[Step] = []
    failed: str | None = None
    for name in ("tcp", "proxy", "tls", "upgrade"):
        if failed is not None:
            steps.append(not_checked(name, failed))
        elif name == failed_at:
            exit = EXIT_CLOCK if reason == J.CLOCK_BEHIND else None
            steps.append(of_reason(name, reason, dial["detail"], exit))
            failed = name
        elif name == "proxy" and proxied is None:
            steps.append(step(name, INFO, "none: the agent goes direct to the server"))
        elif name == "tls" and not secure:
            steps.append(step(name, INFO, "none: the server's URL is plain http (no TLS)"))
        else:
            steps.append(_passed(name, dial, proxied))
            if steps[-1].verdict == FAIL:
                failed = name
    return steps


def _failed_step(phases: dict, reason: str | None, proxied: str | None,
                 secure: bool) -> str | None:
    """Where the dial stopped: the first of its phases it did not finish (the reason
    says why, in words, and not where: a handshake unanswered is ``no-answer`` in TLS as
    after the upgrade); past them all, the upgrade's answer, or the token's refusal."""
    if reason is None:
        return None
    named = STEP_OF_REASON.get(reason)
    if named in ("dns", "route"):
        return named
    for name in ("tcp", "proxy", "tls", "upgrade"):
        if (name == "proxy" and proxied is None) or (name == "tls" and not secure):
            continue
        if f"{name}_s" not in phases:
            return name
    return "token" if named == "token" else "upgrade"


def _passed(name: str, dial: dict, proxied: str | None) -> Step:
    phases = dial.get("phases", {})
    key = {"tcp": "tcp_s", "proxy": "proxy_s", "tls": "tls_s", "upgrade": "upgrade_s"}[name]
    took = f" in {phases[key] * 1000:.0f} ms" if key in phases else ""
    if name == "tcp":
        return step(name, OK, f"connected to {proxied or dial.get('target', 'the server')}{took}")
    if name == "proxy":
        return step(name, OK, f"{proxied} accepted CONNECT to the server{took}")
    if name == "tls":
        return step(name, OK, f"the server's certificate is trusted ({dial.get('ca')}){took}")
    eio = dial.get("eio")
    if eio is None:
        return step(name, FAIL, f"the websocket was upgraded{took}, then the server said "
                                f"nothing Engine.IO ({dial.get('eio_problem', 'no open')})",
                    J.WHAT_TO_DO[J.HTTP_ERROR], J.HTTP_ERROR)
    return step(name, OK, f"the websocket upgraded{took}, Engine.IO open "
                          f"(ping every {eio:g} s)")


def not_checked(name: str, because: str) -> Step:
    return step(name, NOT_CHECKED, f"{because} failed first")


def judge_profile(configured: str, recorded: str | None, verdict) -> Step:
    """The server's kind by its own answers (identity/server_kind.py's verdict) against
    the profile the agent speaks: ``configured`` ("auto" or a name), ``recorded`` (what
    auto found at an earlier start, or None)."""
    if verdict.profile is None:
        return step("profile", FAIL, f"the server's kind: {verdict.why}",
                    "check [server] url; set [server] profile to the server's kind "
                    "(edge-agent or screentinker)")
    if configured == "auto":
        if recorded is not None and recorded != verdict.profile:
            return step("profile", WARN, f"auto: {verdict.profile} now ({verdict.why}), "
                                         f"{recorded} recorded at an earlier start",
                        "the agent keeps what it recorded for this url; remove "
                        "server-kind.json from the state directory to ask again")
        return step("profile", OK, f"auto: {verdict.profile} ({verdict.why})")
    if configured == verdict.profile:
        return step("profile", OK, f"{configured}, as set ({verdict.why})")
    words = (f"the server does not enroll as edge-agent (POST /api/v1/enroll is not there): "
             f"{verdict.why}" if verdict.profile == "screentinker"
             else f"{verdict.why}, not ScreenTinker's GET /api/version")
    return step("profile", FAIL, f"[server] profile is {configured}, but {words}",
                f'set [server] profile = "{verdict.profile}", or "auto" (the default)')


def judge_token(found: dict) -> Step:
    """``found`` from doctor_probes.token(): where the token is, its mode and owner, its
    shape, and what the running agent last heard from the server. Never the token. A
    damaged status file (``status_problem``) is said, a warning at least."""
    judged = _judge_token(found)
    problem = found.get("status_problem")
    if not problem:
        return judged
    said = f"{judged.said}; the running agent's status file is damaged: {problem}"
    if judged.verdict in (OK, INFO):
        return step("token", WARN, said, "systemctl restart edge-agent writes it anew")
    return Step(judged.name, judged.verdict, said, judged.todo, judged.reason, judged.exit)


def _judge_token(found: dict) -> Step:
    if found.get("refused"):
        return of_reason("token", J.REFUSED, f"the running agent's last connect was "
                                             f"refused: {found['refused']}")
    where = found.get("where")
    if where == "config":
        return step("token", OK, "pre-provisioned in the configuration ([identity] token)"
                    + _heard(found))
    if where is None:
        return step("token", WARN, "none stored: this screen is not enrolled yet",
                    "edge-agent status shows its pairing code; enter it on the server")
    if found.get("unreadable"):
        return step("token", WARN, f"{where}: not readable here ({found['unreadable']})",
                    "run the doctor as edge-agent (sudo -u edge-agent edge-agent doctor) "
                    "or as root")
    if (found.get("problem") or "").startswith("a symbolic link"):
        return step("token", FAIL, f"{where}: {found['problem']}",
                    f"rm {where} (the agent's own file is never a link), then systemctl "
                    f"restart edge-agent: it enrolls again (a new pairing code)")
    if found.get("problem"):
        return step("token", FAIL, f"{where}: unusable ({found['problem']})",
                    "the agent sets it aside and enrolls again at its next start "
                    "(systemctl restart edge-agent; a new pairing code)")
    mode, owner = found["mode"], found.get("owner")
    if mode & 0o077:
        return step("token", FAIL, f"{where}: readable by others than its owner "
                                   f"(mode {mode:04o})", f"chmod 0600 {where}")
    if owner is not None and found.get("agent_user") not in (None, owner):
        return step("token", FAIL, f"{where}: owned by {owner}, not {found['agent_user']}",
                    f"chown {found['agent_user']}: {where}")
    return step("token", OK, f"stored in {where}, mode {mode:04o}" + _heard(found))


def judge_card(found: dict) -> Step:
    """``found`` from doctor_probes.card(): the clone check's verdict (identity/board.py)
    on what the state directory keeps and what this board says now."""
    verdict, where = found.get("verdict"), found.get("read_from")
    if found.get("cloned_from") is not None or found.get("kept_aside"):
        at = found.get("cloned_at")
        when = time.strftime("%Y-%m-%d", time.localtime(at)) if printable_wall(at) else "?"
        return step("card", INFO, f"made from screen {found.get('cloned_from') or '?'}'s card "
                                  f"(found {when}): a screen of its own now, that identity kept "
                                  f"aside as {', '.join(found.get('kept_aside') or []) or 'nothing'}",
                    found.get("todo", ""))
    if verdict == "cloned":
        return step("card", WARN, f"this card's identity was made on another board (its {where} "
                                  f"differs): a copy of another screen's card",
                    "systemctl restart edge-agent: it keeps that identity aside and pairs as a "
                    "new screen (enter the code it shows); the original keeps its own")
    if verdict == "bound-now":
        return step("card", INFO, f"the {where} is readable here: the agent binds this card's "
                                  f"identity to it at its start")
    if verdict == "unavailable":
        return step("card", INFO, "clone check unavailable: no board serial readable here, a "
                                  "copy of this card on another board cannot be told apart",
                    "image cards from one that never ran the agent (docs/install.md)")
    return step("card", OK, f"this card's identity is bound to this board (its {where})")


def _heard(found: dict) -> str:
    link = found.get("link_state")
    return f"; the running agent's link is {link}" if link else ""


def judge_storage(found: dict) -> Step:
    """``found`` from doctor_probes.storage(): the state directory, as whom it was
    tried, the error if the write failed, the bytes free."""
    where, who = found["dir"], found.get("as", "")
    owner = found.get("owner")
    if found.get("error") and owner not in (None, who):
        return step("storage", WARN, f"{where}: not writable as {who} ({found['error']}); "
                                     f"the agent writes it as {owner}",
                    f"run the doctor as {owner} (sudo -u {owner} edge-agent doctor)")
    if found.get("error"):
        return step("storage", FAIL, f"{where}: a write failed as {who}: {found['error']}",
                    "edge-agent status says whether the card is read-only or failing; "
                    "df and dmesg on the screen")
    free = found.get("free_bytes")
    text = f"{where}: written, synced and removed as {who}"
    if free is not None:
        text += f"; {free / 1e6:.0f} MB free"
    return step("storage", OK, text)


def judge_display(readings: list[dict]) -> Step:
    """``readings``: each source's reading (screen/core.py's Reading, as a dict, with
    ``unplugged`` where DRM found connectors and none connected)."""
    present = [r for r in readings if r["present"]]
    if not present:   # each source's own reason: "no DPMS" is not "no X display"
        return step("display", INFO, "no display source could be read ("
                    + "; ".join(f"{r['source']}: {r['said']}" for r in readings) + ")")
    said = "; ".join(f"{r['source']}: {r['said']}" for r in present)
    if any(r.get("unplugged") for r in present):
        return step("display", FAIL, f"no display is connected ({said})",
                    "the HDMI cable and the display's power; then systemctl restart the "
                    "player if it does not find the display again")
    if any(r["state"] == "off" for r in present):
        return step("display", FAIL, f"reads off ({said})",
                    "turn it on (the TV's input and power; a display command); outside "
                    "the working hours ([hours]) off is expected")
    if any(r["state"] == "on" for r in present):
        return step("display", OK, f"on ({said})")
    return step("display", WARN, f"cannot tell ({said})")


def judge_screen(found: dict) -> Step:
    """``found`` from doctor_probes.screen(): each means this screen has or lacks
    (``means``: [(name, has it, what it said)]), the capture tool, the running agent's
    last picture verdict and its age, the player unit's state."""
    said = [f"capture: {found['capture']}"]
    said += [f"{name}: {words}" if has else f"{name}: none ({words})"
             for name, has, words in found["means"]]
    verdict, age = found.get("picture"), found.get("picture_age_s")
    if verdict:
        said.append(f"picture: {verdict}"
                    + (f", checked {_duration(age)} ago" if age is not None else ""))
    else:
        said.append(f"picture: {found.get('picture_why') or 'no verdict'}")
    player = found.get("player")
    if player:
        said.append(f"player {player}: {found['player_said']}")
    else:
        said.append("player: none configured ([screen] player_unit)")
    text = "; ".join(said)
    if player and (found.get("player_state") == "failed"
                   or found.get("player_load") == "not-found"):
        return step("screen", FAIL, text, f"journalctl -u {player}; systemctl restart {player} "
                                          f"(or a restart-player command)")
    if verdict in ("black", "frozen"):
        return step("screen", WARN, text, "edge-agent status shows the picture; the player's "
                                          "own log, and the recovery ladder ([screen] recovery)")
    if found.get("status_problem"):
        return step("screen", WARN, f"{text}; the running agent's status file is damaged: "
                                    f"{found['status_problem']}",
                    "systemctl restart edge-agent writes it anew")
    if not any(has for _, has, _ in found["means"]) and found.get("can_capture") is False:
        return step("screen", INFO, text)
    return step("screen", OK, text)


REPOSITORY_TODO = ("apt's proxy: Acquire::http::Proxy (and ::https::) in /etc/apt/apt.conf.d/; "
                   "an HTTPS repository behind an inspecting proxy: the site's CA in "
                   "/usr/local/share/ca-certificates and update-ca-certificates, or "
                   "Acquire::https::CAInfo (docs/upgrading.md)")


def judge_repository(found: dict) -> Step:
    """``found`` from apt_repository.examine(): the project's InRelease fetched the way
    apt is set up to (its proxy, its CA), or why it was not checked."""
    if found.get("skipped"):
        return step("repository", INFO, f"not checked: {found['skipped']}")
    ca = f", CA {found['ca']}" if found.get("ca") else ""
    if found.get("problem"):
        return step("repository", FAIL, f"{found['url']} ({found['source']}) via "
                                        f"{found['via']}{ca}: {found['problem']}",
                    REPOSITORY_TODO)
    return step("repository", OK, f"{found['url']} fetched via {found['via']}{ca} in "
                                  f"{found['took_s'] * 1000:.0f} ms ({found['bytes']} bytes, "
                                  f"signed)")


# the system's watchdog (base/system_watchdog.py): its word -> the verdict, what to do
WATCHDOG_VERDICTS = {
    W.ARMED: (OK, ""), W.OFF: (INFO, ""), W.OTHERS: (INFO, ""),
    W.NO_DEVICE: (INFO, "a Pi has one (bcm2835_wdt); a container or most VMs have none"),
    W.CONFIGURED: (WARN, "the device takes its own nearest timeout: set [device] "
                         "hardware_watchdog_s to one it takes"),
    W.UNKNOWN: (WARN, "busctl get-property org.freedesktop.systemd1 /org/freedesktop/systemd1 "
                      "org.freedesktop.systemd1.Manager RuntimeWatchdogUSec"),
    W.NOT_ARMED: (FAIL, f"systemctl restart edge-agent (its start step writes {W.DROPIN} and "
                        "reloads systemd; journalctl -u edge-agent -g watchdog says what it "
                        "did); a system.conf drop-in sorted after it wins"),
}


def judge_watchdog(found: dict) -> Step:
    """``found`` from doctor_probes.system_watchdog(): what [device] asks, what systemd
    says (RuntimeWatchdogUSec), what sysfs says of /dev/watchdog0, the drop-in's place."""
    state, said = W.judge(found.get("configured_s"), found.get("systemd_s"),
                          found.get("device"), found.get("dropin"), found.get("asked", True))
    verdict, todo = WATCHDOG_VERDICTS[state]
    if found.get("systemd_problem") and state in (W.UNKNOWN, W.NO_DEVICE):
        said += f" ({found['systemd_problem']})"
    return step("watchdog", verdict, said, todo)


# -- the report -----------------------------------------------------------------------
def exit_status(steps: list[Step]) -> int:
    return next((s.exit for s in steps if s.verdict == FAIL), EXIT_OK)


def as_json(steps: list[Step], notes: list[str]) -> dict:
    return {"steps": [asdict(s) for s in steps], "notes": notes,
            "exit": exit_status(steps)}


def render(steps: list[Step], notes: list[str]) -> str:
    width = max(len(s) for s in STEPS)
    lines = [f"note: {n}" for n in notes]
    for s in steps:
        lines.append(f"{s.name:<{width}}  {s.verdict:<11}  {s.said}"
                     + (f" [{s.reason}]" if s.reason else ""))
        if s.todo:
            lines.append(f"{'':<{width}}  {'':<11}  what to do: {s.todo}")
    # a server's refusal and a library's words are in it: never a terminal escape on
    # the screen of a technician who runs this as root
    return "\n".join(clean(line, STATUS_LINE_CHARS) for line in lines)


def _duration(seconds: float) -> str:
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds >= size:
            n = seconds / size
            return f"{n:.0f} {unit}{'s' if round(n) != 1 else ''}"
    return f"{seconds:.0f} s"
