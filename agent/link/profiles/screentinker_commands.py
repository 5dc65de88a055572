"""ScreenTinker's dashboard commands as the agent's own (screentinker.py's profile):
which device:command types mean which command, with what arguments, and the
capabilities the screen declares for them, in 1.9's vocabulary."""
from __future__ import annotations

from ...base.vocabulary import SCREEN_MEANS

# device:command types that mean one of the agent's commands
COMMANDS: dict[str, tuple[str, dict]] = {
    "reboot": ("reboot", {}), "screen_on": ("display", {"state": "on"}),
    "screen_off": ("display", {"state": "off"}), "shutdown": ("poweroff", {}),
    "launch": ("restart-player", {}), "refresh": ("restart-player", {})}
# the dashboard's sliders: {"level": percent / 100} (frontend/js/views/
# device-detail.js, bindLevel); the level is checked by the command core (level_args)
LEVELS = {"set_brightness": "brightness", "set_volume": "volume"}
# 1.9's debug switch (never gated by a capability): debug logging for an hour, as a
# revision of settings from the fleet (no revision numbers: the next one); off: the
# screen's own file again
DEBUG_FOR_S = 3600

# the dashboard's operator tools (1.9's payloads: frontend/js/views/device-detail.js
# sends shell {cmd}; its players read set_time {millis}, set_timezone {timezone});
# the command core checks what they carry
OPERATOR = {"shell": ("shell", "cmd", "cmd"),
            "set_timezone": ("set-timezone", "timezone", "zone")}


def command(kind, payload) -> tuple[str, dict]:
    """A device:command's type and payload as one of the agent's commands and its
    arguments (checked by the command core)."""
    fields = payload if isinstance(payload, dict) else {}
    if kind in OPERATOR:
        name, theirs, ours = OPERATOR[kind]
        return name, {ours: fields.get(theirs)}
    if kind == "set_time":
        ms = fields.get("millis")
        # whole milliseconds within reach of a float; anything else goes as it is,
        # and the core refuses it by name
        if isinstance(ms, int) and not isinstance(ms, bool) and abs(ms) < 10 ** 18:
            ms = ms / 1000
        return "set-time", {"time": ms}
    if kind == "set_debug":
        on = isinstance(payload, dict) and payload.get("enabled") is True
        return "configure", {"settings": {"log.level": {
            "value": "debug", "expires_in_s": DEBUG_FOR_S}} if on else {}}
    if kind in LEVELS:
        level = payload.get("level") if isinstance(payload, dict) else None
        return LEVELS[kind], {"level": level}
    return COMMANDS.get(kind, (str(kind)[:40] if kind else "(no type)", {}))


# The server (1.9 on) sends a dashboard command or screenshot request only to a device
# that declared the capability it needs, in its own vocabulary
# (server/lib/player-capabilities.js); names it does not know are dropped unread.
# shutdown needs system.reboot too (power-off "shares the reboot capability"): it is
# declared for reboot; a shutdown where poweroff is not allowed is refused, and says so
# set_time and set_timezone share system.time: it is declared where either is
# allowed, and the other is refused with words
CAPABILITIES = {"reboot": "system.reboot", "display": "display.power",
                "screenshot": "remote.screenshot", "restart-player": "system.restart_player",
                "brightness": "display.brightness", "volume": "audio.volume",
                "shell": "system.shell", "set-time": "system.time",
                "set-timezone": "system.time"}
# commands that need a means of the screen's, declared only where it has it
NEEDS_MEANS = frozenset(SCREEN_MEANS)
# What the player (not this agent) handles: content, playback, remote view, walls.
PLAYER_EVENTS = frozenset({
    "device:playlist-update", "device:content-delete", "device:remote-start",
    "device:remote-stop", "device:remote-touch", "device:remote-key", "wall:sync",
    "wall:sync-request", "group:sync", "group:sync-request", "device:live-publish",
    "device:mute-changed", "device:pip-show", "device:pip-clear", "device:talk-start",
    "device:talk-stop", "device:settings-pin", "device:self-unpair-ok",
    "device:play-offline-ack", "device:trigger-wire"})
