"""Names the configuration, root's programs and the parts share, here once: the
configuration checks a file against them without loading the parts that act on them.
Each part holds its own table keyed by these (tests/test_layering.py keeps them equal)."""
from __future__ import annotations

# the commands the fleet server may ask of a screen ([commands] allow, docs/PROTOCOL.md)
COMMAND_NAMES = ("diagnostics", "logs", "screenshot", "display", "restart-agent", "reboot",
                 "update", "configure", "restart-player", "brightness", "volume", "poweroff",
                 "shell", "set-time", "set-timezone")
# commands the fleet's settings may never add to [commands] allow, even where the
# screen's file lets the fleet manage it: a shell line as the agent's user, and a clock
# set by hand (its polkit grant implies NTP's switch, docs/security.md), are the
# operator's own choice, made in the file (or the environment) on the screen
OPERATOR_ONLY_COMMANDS = frozenset({"shell", "set-time"})
# the screen's commands that need a means of the screen's (a player unit, a backlight,
# a sound server; logind; a way to capture it): a server is offered each only where the
# screen has it, and the first three are acted by the screen's controls
# (agent/screen/controls.py)
SCREEN_CONTROLS = ("restart-player", "brightness", "volume")
SCREEN_MEANS = SCREEN_CONTROLS + ("poweroff", "screenshot")
MAX_COMMAND_ID = 64     # characters of a command's id, wherever one is kept

# the fleet servers the link speaks to ([server] profile, agent/link/profiles/)
PROFILE_NAMES = ("edge-agent", "screentinker")
# [server] profile's default: the server's own answers tell which (identity/server_kind.py)
PROFILE_AUTO = "auto"
