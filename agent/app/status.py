"""The status board: the document the agent keeps in its status file, the one line
systemd shows, and what `edge-agent status` makes of the file.

The file lives in the runtime directory (tmpfs under systemd) and is rewritten only
when something an operator cares about changes, never per heartbeat. Each part of the
agent gives its own snapshot; the board only puts them together and says them.
"""
from __future__ import annotations

import os
import time

from .. import __version__
from ..base.boot import boot_id
from ..base.clock import printable_wall
from ..base.server_clock import NOTABLE_SKEW_S
from ..base.text import clean
from ..device import words as device_words

STATUS_LINE_CHARS = 2000


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the document ------------------------------------------------------------------
def document(*, device_id: str, pairing: dict | None, server: str, link: dict,
             storage: dict, credentials: dict | None, uploads: dict, events: dict,
             journal: list, commands: list, board: dict | None = None,
             update: dict | None = None,
             settings: dict | None = None, hours: dict | None = None,
             screen: dict | None = None, profile: dict | None = None,
             device: dict | None = None, network: dict | None = None) -> dict:
    return {"pid": os.getpid(), "version": __version__, "device_id": device_id,
            "pairing": pairing or {"state": "pre-provisioned"}, "server": server,
            "updated_at": round(time.time(), 3), "link": link, "storage": storage,
            # when it was said, on the clock no wall-clock step moves: a reader in the
            # same boot counts every age in the file from here
            "boot_id": this_boot(), "monotonic": round(time.monotonic(), 3),
            # a credentials write the card still lacks
            "credentials": credentials, "board": board, "uploads": uploads, "events": events,
            "journal": journal, "commands": commands, "update": update, "settings": settings,
            "hours": hours, "screen": screen, "profile": profile,
            "device": device, "network": network}


# -- the line systemd shows ----------------------------------------------------------
def line(link: dict, pairing: dict | None = None, storage: dict | None = None) -> str:
    """The one-line human state systemd shows in `systemctl status`."""
    said = _link_line(link, pairing)
    if storage and storage.get("state", "ok") != "ok":
        return f"{said}; storage {storage['state']}"
    return said


def _link_line(link: dict, pairing: dict | None) -> str:
    state = link.get("state")
    if pairing and pairing.get("code") and state in ("unpaired", "waiting", "online", None):
        return f"waiting for pairing code {pairing['code']}"
    if state == "unpaired":
        return "enrolling: waiting for a pairing code" + (
            f" ({pairing['error']})" if pairing and pairing.get("error") else "")
    if state == "online":
        if link.get("rtt_ms") is not None:
            return f"online rtt={link['rtt_ms']:.0f}ms"
        return "online (waiting for the first heartbeat ack)"
    if state == "waiting":
        why = f" ({link['reason']})" if link.get("reason") else ""
        return f"reconnecting in {link.get('next_attempt_in_s') or 0:.0f}s{why}"
    if state == "connecting":
        return "connecting"
    # before the link thread's first report (the seconds after a restart)
    return str(state) if state else "starting link"


# -- what `edge-agent status` says ----------------------------------------------------
def verdict(doc: dict) -> tuple[bool, bool]:
    """(the agent runs, it is online and keeps what it is asked to keep). Online on a
    card that failed, or with a token only in memory, is still degraded."""
    running = pid_alive(doc.get("pid"))
    link = _link(doc)
    return running, (running and link.get("state") == "online"
                     and _storage(doc).get("state") == "ok"
                     and not isinstance(doc.get("credentials"), dict))


def _update_text(update: dict) -> str:
    said = [f"package {update.get('installed') or 'not installed by dpkg'}"]
    for p in update.get("pending") or []:
        if isinstance(p, dict):
            said.append(f"now {p.get('doing')} (command {p.get('id')})")
    last = update.get("last")
    if isinstance(last, dict):
        at = last.get("at")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if isinstance(at, (int, float)) else "?"
        said.append(f"last {last.get('outcome')} {last.get('from')} -> {last.get('to')} at {when}"
                    + (f" ({last['reason']})" if last.get("reason") else ""))
    repository = update.get("repository")
    if isinstance(repository, dict):
        said.append(_repository_text(repository))
    return "; ".join(said)


def _repository_text(repository: dict) -> str:
    """What apt's lists offer, and how long ago apt last updated them (wall time, said
    only as an age): a screen that stopped upgrading shows it here."""
    offered = repository.get("newest")
    said = (f"apt offers {offered}" + (" (newer: not installed yet)"
                                       if repository.get("behind") else "")
            if offered else "apt's lists offer no edge-agent")
    at = repository.get("apt_success_at")
    if _number(at):
        age = _duration(max(0.0, time.time() - at))
        said += (f", apt updated {age} ago" if repository.get("since") == "stamp"
                 else f", apt's lists changed {age} ago")
    return said


def _settings_text(settings: dict, elapsed: float = 0.0) -> str:
    """``elapsed``: the file's age, which the countdowns in it have run since."""
    said = []
    if settings.get("revision") is not None:
        fleet = settings.get("fleet") if isinstance(settings.get("fleet"), dict) else {}
        values = ", ".join(
            f"{k}={v.get('value')}" + (f" for {_duration(_run_down(v['expires_in_s'], elapsed))} more"
                                       if _number(v.get("expires_in_s")) else "")
            for k, v in fleet.items() if isinstance(v, dict))
        said.append(f"fleet revision {settings['revision']} {settings.get('state')}"
                    + (f" (proof due in {_duration(_run_down(settings['proof_due_in_s'], elapsed))})"
                       if _number(settings.get("proof_due_in_s")) else "")
                    + (f": {values}" if values else ""))
    else:
        said.append("the local file alone")
    if settings.get("overridden_here"):
        said.append(f"the environment overrides the fleet's {', '.join(settings['overridden_here'])}")
    last = settings.get("last")
    if isinstance(last, dict) and last.get("result") != "kept":
        keys = f" {', '.join(map(str, last.get('keys') or []))}" if last.get("keys") else ""
        said.append(f"last: revision {last.get('revision')}{keys} {last.get('result')}"
                    + (f" ({last['why']})" if last.get("why") else ""))
    if settings.get("problem"):
        said.append(str(settings["problem"]))
    adjusted = settings.get("adjusted")
    if isinstance(adjusted, list) and adjusted:
        said.append("adjusted: " + "; ".join(map(str, adjusted)))
    return "; ".join(said)


def _board_lines(board) -> list[str]:
    """The clone check (identity/board.py): said where it has something to say; the
    file's words as one clean line each."""
    return [clean(said, 800) for said in _board_said(board)]


def _board_said(board) -> list[str]:
    if not isinstance(board, dict):
        return []
    check, todo = board.get("clone_check"), str(board.get("todo") or "")
    if board.get("cloned_from") is not None or board.get("kept_aside"):
        at = board.get("cloned_at")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if printable_wall(at) else "?"
        aside = board.get("kept_aside")
        aside = ", ".join(map(str, aside if isinstance(aside, list) else [])) or "nothing"
        return [f"clone       made from screen {board.get('cloned_from') or '?'}'s card "
                f"(found {when}): a screen of its own now, that identity kept aside as "
                f"{aside}; {todo}"]
    if check == "cloned":
        return [f"clone       made from another screen's card: "
                + (todo or f"cannot write {board.get('stuck')}: the identity is the copied one")]
    if check == "unavailable":
        return ["clone       check unavailable: this board has no serial readable here "
                "(a copy of this card on another screen would take this screen's place)"]
    return []


def render(doc: dict, running: bool) -> str:
    link = _link(doc)
    state = link.get("state", "unknown") if running else "not running"
    now = as_read(doc, running)
    lines = [f"edge-agent {doc.get('version', '?')}  device {doc.get('device_id', '?')}",
             f"server      {doc.get('server', '?')}",
             *([f"profile     {_profile_text(_profile(doc), now['profile_next_try_in_s'])}"]
               if _profile(doc) else []),
             *([f"pairing     {_pairing_text(doc['pairing'], now['pairing_expires_in_s'])}"]
               if isinstance(doc.get("pairing"), dict) else []),
             f"link        {state}" + (f" (last loss: {link['reason']})" if link.get("reason") else "")]
    if now["link_since_s"] is not None:
        lines.append(f"since       {_duration(now['link_since_s'])} in this state")
    if link.get("detail") and state != "online":
        lines.append(f"why         {link['detail']}")
    if link.get("rtt_ms") is not None:
        lines.append(f"rtt         {link['rtt_ms']} ms, measured "
                     f"{_duration(now['rtt_measured_s_ago'])} ago (the last time the status "
                     f"changed)" if now["rtt_measured_s_ago"] is not None
                     else f"rtt         {link['rtt_ms']} ms")
    skew = link.get("clock_skew_s")
    if isinstance(skew, (int, float)) and abs(skew) >= NOTABLE_SKEW_S:
        lines.append(f"clock       {abs(skew):.0f} s {'behind' if skew > 0 else 'ahead of'} "
                     f"the server's")
    storage = _storage(doc)
    if storage.get("state") != "ok":
        parts = storage.get("parts") if isinstance(storage.get("parts"), dict) else {}
        lines.append(f"storage     {storage.get('state')}: {storage.get('reason')} at "
                     f"{storage.get('path')}; held: {', '.join(map(str, parts)) or '?'}")
    unwritten = doc.get("credentials")
    if isinstance(unwritten, dict):
        lines.append(f"credentials not stored yet ({unwritten.get('error')}, "
                     f"{unwritten.get('failed_attempts')} failed writes): in use from memory, "
                     f"written when the card takes it")
    lines.extend(_board_lines(doc.get("board")))
    if link.get("proof"):
        within = now["proof_within_s"]
        every = link.get("heartbeat_interval_s") if link.get("proof") != "ping" else None
        lines.append(f"proof       {link['proof']}" + (
            f", {'ACKed every ' + format(every, 'g') + ' s, ' if every else ''}the last "
            f"within {within:g} s" if within is not None else ""))
    uploads = doc.get("uploads") if isinstance(doc.get("uploads"), dict) else None
    if uploads and "items" in uploads:
        lines.append(f"uploads     {uploads['items']} queued ({uploads.get('bytes', 0)} bytes), "
                     f"{uploads.get('dead_letter', 0)} dead-lettered, dropped {uploads.get('dropped') or 'none'}")
    events = doc.get("events") if isinstance(doc.get("events"), dict) else None
    if events:
        recent = events.get("recent") if isinstance(events.get("recent"), list) else []
        names = ", ".join(str(e.get("type")) for e in recent[-3:] if isinstance(e, dict)) or "none"
        lines.append(f"events      {events.get('mode')}: {events.get('pending', 0)} waiting for the "
                     f"server, {events.get('delivered', 0)} delivered; latest {names}")
    commands = doc.get("commands") if isinstance(doc.get("commands"), list) else []
    if commands:
        latest = "; ".join(f"{c.get('command')} {str(c.get('result', '')).split(':')[0]}"
                           for c in commands[-3:] if isinstance(c, dict))
        lines.append(f"commands    latest from the server: {latest}")
    update = doc.get("update") if isinstance(doc.get("update"), dict) else {}
    if update:
        lines.append(f"update      {_update_text(update)}")
    hours = doc.get("hours") if isinstance(doc.get("hours"), dict) else {}
    if hours:
        lines.append("hours       " + (
            "waiting for a synchronised clock; the display is left as it is"
            if hours.get("waiting_for_clock") else
            f"display {hours.get('applied') or '?'} (wanted {hours.get('wanted')})"
            + (f", next change {hours['next_change']}" if hours.get("next_change") else "")
            + (f"; fault: {hours['fault']}" if hours.get("fault") else "")
            + (f"; {hours['read_back']}" if hours.get("read_back") and not hours.get("fault")
               else "")))
    lines.extend(_screen_lines(doc.get("screen"), now["file_age_s"]))
    lines.extend(device_words.lines(doc.get("device")))
    lines.extend(device_words.network_lines(doc.get("network")))
    settings = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    if settings:
        lines.append(f"settings    {_settings_text(settings, now['file_age_s'])}")
    if state == "unpaired" and now["enrollment_next_try_in_s"] is not None:
        # the link waits for the pairing: the enrollment's next try is the one that counts
        lines.append(f"next try    in {_duration(now['enrollment_next_try_in_s'])} (attempt "
                     f"{doc['pairing'].get('attempts')} of the enrollment)")
    elif now["next_attempt_in_s"] is not None and state != "unpaired":
        lines.append(f"next try    in {_duration(now['next_attempt_in_s'])} "
                     f"(attempt {link.get('attempts')})")
    losses = link.get("losses_last_hour") or []
    if isinstance(losses, list):
        counts: dict = {}
        for r in losses:
            counts[str(r)] = counts.get(str(r), 0) + 1
        summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"
        lines.append(f"losses/hour {summary}")
    # much of this is what a server said (a loss's detail, a command's name): never a
    # terminal escape on the screen of an operator who runs this as root
    return "\n".join(clean(line, STATUS_LINE_CHARS) for line in lines)


def _screen_lines(screen, elapsed: float) -> list[str]:
    """What the screen shows, each part's age as it stands now (the file is written on
    changes only, so an age in it grows by the file's own)."""
    if not isinstance(screen, dict):
        return []
    lines = []

    def ago(value) -> str:
        return f"{_duration(value + elapsed)} ago" if _number(value) else "at an unknown time"

    display = screen.get("display")
    if isinstance(display, dict):
        lines.append(f"display     {display.get('asked')} {ago(display.get('age_s'))}: "
                     f"{display.get('said')}")
    watched = screen.get("watched")
    if isinstance(watched, dict):
        since = (f" for {_duration(watched['since_s'] + elapsed)}"
                 if _number(watched.get("since_s")) else " (not read yet)")
        meant = f", meant dark: {watched['meant_dark']}" if watched.get("meant_dark") else ""
        every = (f"; read every {watched['every_s']:g} s and at each hotplug"
                 if _number(watched.get("every_s")) else "")
        read = f" ({watched['read']})" if watched.get("read") else ""
        lines.append(f"display now {watched.get('state')}{since}{meant}{read}{every}")
    picture = screen.get("picture")
    if isinstance(picture, dict):
        # never "None": a screen not judged yet says so, and why
        verdict = picture.get("verdict") or f"not checked yet ({picture.get('pending') or '?'})"
        since = (f" for {_duration(picture['since_s'] + elapsed)}"
                 if _number(picture.get("since_s")) else "")
        checked = (f", checked {ago(picture['checked_s_ago'])}"
                   if _number(picture.get("checked_s_ago")) else "")
        said = picture.get("dark") or picture.get("unavailable") or picture.get("failure")
        why = f" ({said})" if said else ""
        lines.append(f"picture     {verdict}{since}{checked}{why}")
    player = screen.get("player")
    if isinstance(player, dict):
        lines.append(f"player      {player.get('unit')} "
                     f"{player.get('state') or 'not read yet'}"
                     + (f", {player['restarts']} restarts" if _number(player.get("restarts"))
                        and player.get("restarts") else "")
                     + (f"; recovery {player['recovery']}" if player.get("recovery") else ""))
    return lines


def _storage(doc: dict) -> dict:
    """The status file's storage health; a file from a build before it: ok."""
    storage = doc.get("storage")
    if not isinstance(storage, dict):
        return {"state": "ok"}
    return storage if isinstance(storage.get("state"), str) else {"state": "unknown"}


def as_read(doc: dict, running: bool) -> dict:
    """The board's times as they are now, not as they were when the file was written
    (it is written on changes only: no write per heartbeat). An age grows by the
    file's age, a countdown shrinks by it, and the last proof of a link still online
    and proven is bounded by what would have ended it (and rewritten the file). What
    cannot be known now says how old it is. None where the file has nothing to say."""
    elapsed = _elapsed_since(doc)
    link = _link(doc)
    online = running and link.get("state") == "online"

    def grown(value):
        return round(value + elapsed, 1) if _number(value) else None

    def left(value):
        return _run_down(value, elapsed) if _number(value) and running else None

    pairing = doc.get("pairing") if isinstance(doc.get("pairing"), dict) else {}
    proven = online and link.get("proven_live") is True and _number(link.get("proof_within_s"))
    return {"file_age_s": round(elapsed, 1),
            "link_since_s": grown(link.get("since_s")) if running else None,
            "proof_within_s": link["proof_within_s"] if proven else None,
            "rtt_measured_s_ago": grown(link.get("last_ack_age_s"))
            if link.get("rtt_ms") is not None else None,
            "next_attempt_in_s": left(link.get("next_attempt_in_s")),
            "pairing_expires_in_s": left(pairing.get("expires_in_s")),
            "enrollment_next_try_in_s": left(pairing.get("next_try_in_s")),
            "profile_next_try_in_s": left(_profile(doc).get("next_try_in_s"))}


def _profile(doc: dict) -> dict:
    return doc.get("profile") if isinstance(doc.get("profile"), dict) else {}


def _profile_text(p: dict, next_try_in_s) -> str:
    """The server's profile and how it was chosen (identity/server_kind.py)."""
    why = p.get("why") or "?"
    if p.get("how") == "detecting":
        again = (f"; asking again in {_duration(next_try_in_s)} (attempt {p.get('attempts')})"
                 if next_try_in_s is not None else "")
        return f"not known yet: {why}{again}"
    how = {"configured": "", "recorded": "detected at an earlier start: ",
           "detected": "detected: "}.get(str(p.get("how")), "")
    return f"{p.get('profile')} ({how}{why})" + (
        f"; {p['record_error']}" if p.get("record_error") else "")


def _run_down(seconds: float, elapsed: float) -> float:
    """A countdown the file holds, as it stands ``elapsed`` seconds after the writing."""
    return round(max(0.0, seconds - elapsed), 1)


def _number(value) -> bool:
    """A figure the board can do sums with: the file is read as the agent's user wrote
    it, and a 400-digit integer or an infinity is no age."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and abs(value) < 1e12 and value == value)


_BOOT: list = []


def this_boot() -> str:
    """The kernel's boot id, read once a process."""
    if not _BOOT:
        _BOOT.append(boot_id())
    return _BOOT[0]


def _elapsed_since(doc: dict) -> float:
    """How long ago the file was written: on the monotonic clock when it was written in
    this boot (a wall clock set by NTP after a boot without one jumps years), else by
    the wall clock."""
    said = doc.get("monotonic")
    if _number(said) and doc.get("boot_id") and doc.get("boot_id") == this_boot():
        return max(0.0, time.monotonic() - said)
    updated_at = doc.get("updated_at")
    if not _number(updated_at):
        return 0.0
    return max(0.0, time.time() - updated_at)


def _duration(seconds) -> str:
    if not _number(seconds):
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _link(doc: dict) -> dict:
    return doc.get("link") if isinstance(doc.get("link"), dict) else {}


def claimed(doc: dict) -> bool | None:
    """Whether an operator has claimed this screen: paired, or given its token in the
    configuration. A screen with a code to show, or still asking for one, is not; a
    file without the pairing part says nothing (None)."""
    pairing = doc.get("pairing")
    if not isinstance(pairing, dict):
        return None
    return pairing.get("state") in CLAIMED_STATES


# the pairing states (identity/enrollment.py, daemon._pairing) of a claimed screen
CLAIMED_STATES = ("paired", "pre-provisioned")


def _pairing_text(p: dict, expires_in_s=None) -> str:
    if p.get("code"):
        if expires_in_s is not None:
            expiry = f"expires in {_duration(expires_in_s)}"
        else:   # a server that sets no deadline says so; a file without either: unknown
            expiry = str(p.get("expiry") or "expiry unknown")
        where = p.get("where") or "the fleet server"
        return f"unclaimed: code {p['code']} (enter it on {where}; {expiry})"
    if p.get("state") in CLAIMED_STATES:
        return f"claimed ({p['state']})"
    return f"unclaimed ({p.get('state')}" + (f": {p['error']}" if p.get("error") else "") + ")"
