"""The configuration reference, made from the schema (agent/config/load.py SCHEMA): the
package's defaults file (debian/agent.toml, installed as /usr/lib/edge-agent/agent.toml)
and docs/configure.md. Each key's type, default, bounds, environment variable and
whether the fleet may set it come from SCHEMA; only what a key does is written here,
once. tests/test_config_reference.py holds both files to what this makes, and this
table to SCHEMA: a key added, removed or changed in the schema fails it until
`python -m devtools.configref --write` is run.
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from agent.config import load as C, schema as S
from agent.commands.core import COMMANDS

REPO = Path(__file__).resolve().parent.parent
TOML_PATH = REPO / "debian" / "agent.toml"
MD_PATH = REPO / "docs" / "configure.md"
MAN_PATH = REPO / "debian" / "edge-agent.1"
MAN_BEGIN = '.\\" CONFIGURATION: made from the schema by python -m devtools.configref --write\n'
MAN_END = '.\\" end of CONFIGURATION\n'

# What each section is for (a line above its keys).
SECTIONS = {
    "server": "Where the fleet server is, and how it is spoken to.",
    "network": "The way out of the site: a proxy, hosts that go direct, a client certificate.",
    "identity": "Who this screen is to the server, and where it keeps that.",
    "runtime": "The runtime directory (tmpfs): status, pairing code, backoff schedule.",
    "link": "The live link: heartbeats, their ACKs, and when a link counts as dead.",
    "link.backoff": "The wait between reconnect attempts.",
    "link.keepalive": "TCP keepalive and TCP_USER_TIMEOUT on the link's socket.",
    "uploads": "The upload queue (screenshots, logs, proof-of-play) in the state directory.",
    "events": "Hardware and network events, and telemetry.",
    "watchdog": "systemd's watchdog (WatchdogSec=5min in the unit).",
    "commands": "What the fleet server may ask of this screen (remote operations).",
    "hours": "Working hours: the display off outside them, offline, through the display "
             "commands.",
    "screen": "The display's state read back after each display on/off (the display "
              "command, working hours).",
    "update": "Self-update from the fleet (\"update\" in [commands] allow, a release key in "
              "/etc/edge-agent/update-keys/).",
    "fleet": "Settings from the fleet (\"configure\" in [commands] allow).",
    "log": "The journal.",
    "metrics": "Metrics in Prometheus' text format, for node_exporter's textfile collector.",
    "device": "The device's truth: the card's verdict, the firmware's power flags, why the "
              "last boot ended.",
    "debug": "Test hooks: never set on a screen.",
}

# What each key does. Facts only the code can vouch for: read it before changing one.
DOCS = {
    "server.url": "The fleet server: https://host[:port] or http://host[:port] (a self-hosted "
                  "ScreenTinker is http://host:3001). Required: until it is set systemd skips "
                  "starting the agent (ExecCondition), without a failure.",
    "server.ca_file": "A PEM file of CA certificates (a TLS-inspecting box's CA) that REPLACES "
                      "the system's CA store for every TLS connection the agent makes: the "
                      "link, enrollment, uploads and the update download. To add a CA to the "
                      "system's store instead, use update-ca-certificates and leave this unset. "
                      "check-config and the start refuse a file holding no PEM certificate.",
    "server.profile": "The server's protocol: \"auto\" (the server's own answers tell "
                      "which, at the first start with this url; kept in the state directory, "
                      "said by status, check-config and doctor), \"edge-agent\" (this "
                      "project's fleet server, PROTOCOL.md) or \"screentinker\" (ScreenTinker "
                      "1.2 and 1.9, /usr/share/doc/edge-agent/docs/screentinker.md). Set, it "
                      "wins.",
    "server.connect_timeout_s": "The ceiling of the connect bound. The bound in use is learnt: "
                                "four times the slowest of the last 8 connects, never below "
                                "4 s, never above this.",
    "network.proxy": "http://[user:password@]host:port: an HTTP proxy reached with CONNECT "
                     "(Basic authentication; user and password percent-encoded), used by "
                     "enrollment, the link, uploads and updates. Unset: the environment's "
                     "https_proxy (then HTTPS_PROXY, http_proxy, HTTP_PROXY) for an https:// "
                     "server, http_proxy (then HTTP_PROXY) for an http:// one; a systemd "
                     "service has none unless a drop-in sets it. The password is never "
                     "shown (http://***@host:port).",
    "network.no_proxy": "Comma-separated hosts that go direct: *, an address or network "
                        "(10.0.0.0/8, fd00::/8), or a domain covering the names under it "
                        "(.site.example and site.example alike), each with an optional :port. "
                        "Unset: none when proxy is set here, else the environment's no_proxy.",
    "network.client_cert": "Mutual TLS: a PEM certificate (with its key, unless client_key is "
                           "given) presented to the server and to the update download.",
    "network.client_key": "The client certificate's key, when not in client_cert; refused if "
                          "every user may read it (0600 or 0640).",
    "identity.device_id": "This screen's id (1-128 of A-Z a-z 0-9 . _ : -). Unset: derived once "
                          "from /etc/machine-id and the board serial, hashed, and kept in "
                          "state_dir/device_id.",
    "identity.token": "A pre-provisioned bearer token (needs device_id): the screen skips "
                      "pairing. Unset: the agent pairs and keeps its token in "
                      "state_dir/credentials.json (0600).",
    "identity.state_dir": "The state directory: device id, credentials, upload queue, "
                          "dead letters, command ledger, settings from the fleet.",
    "identity.show_code_on_console": "Also write the native profile's pairing code to "
                                     "/dev/console.",
    "runtime.dir": "Unset: $RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), else "
                   "/run/edge-agent.",
    "link.heartbeat_interval_s": "A heartbeat every this many seconds; the server ACKs each.",
    "link.ack_timeout_s": "How long an ACK may take; must be less than heartbeat_interval_s.",
    "link.missed_acks": "Missed ACKs in a row that end the link.",
    "link.silence_timeout_s": "Nothing received for this long ends the link. Unset: "
                              "max(heartbeat_interval_s, the server's ping interval) plus "
                              "ack_timeout_s.",
    "link.stable_after_s": "A link must live this long before the reconnect backoff resets.",
    "link.wake_min_interval_s": "The network coming back wakes the link at once, at most once "
                                "per this many seconds.",
    "link.adapt_heartbeat": "Learn a site's idle limit from connections it reaps after the "
                            "same idle gap, and heartbeat at half of it on that network.",
    "link.adapt_probe_after_s": "After this long without a reap, step the learnt heartbeat "
                                "back up by half.",
    "link.backoff.base_s": "The first wait after a failed connect; it doubles per attempt.",
    "link.backoff.cap_s": "The longest wait between attempts (the agent never gives up).",
    "link.backoff.jitter": "full (a random wait up to the step), equal (half fixed, half "
                           "random) or none.",
    "link.keepalive.idle_s": "TCP_KEEPIDLE: idle seconds before the first keepalive probe.",
    "link.keepalive.interval_s": "TCP_KEEPINTVL: seconds between probes.",
    "link.keepalive.count": "TCP_KEEPCNT: unanswered probes that end the connection.",
    "link.keepalive.user_timeout_s": "TCP_USER_TIMEOUT: unacknowledged data older than this "
                                     "ends the connection.",
    "uploads.base_s": "An item's first retry wait; it doubles per failure, each item on its "
                      "own schedule.",
    "uploads.cap_s": "An item's longest retry wait.",
    "uploads.max_items": "Items the queue holds at most; past it, screenshots go before "
                         "proof-of-play.",
    "uploads.max_bytes": "Bytes the queue holds at most.",
    "uploads.max_age_days": "An item older than this is dropped (never while the clock is not "
                            "synchronised).",
    "uploads.dedupe_window_s": "An item whose idempotency key (enqueue --key, or a "
                               "proof-of-play record's \"play_id\") is queued or was sent "
                               "within this window is a duplicate (enqueue exits 7); equal "
                               "content alone never is: two plays of one clip are two "
                               "records.",
    "events.enabled": "Watch udev and rtnetlink for hardware and network events.",
    "events.settle_s": "One event per kind per settle window, with a count.",
    "events.fallback_interval_s": "Where netlink is unavailable, read sysfs this often.",
    "events.udev_source": "auto (udev when udevd runs, else kernel uevents), udev or kernel.",
    "events.telemetry_every_s": "Telemetry (CPU, memory, disk, temperature, uptime) goes when "
                                "it moved, and at least this often.",
    "watchdog.require_link": "Pet systemd's watchdog only while the link is proven live; "
                             "false: only while the agent's loops make progress (a screen "
                             "offline for long stretches).",
    "commands.allow": "The commands the fleet may run here, of: "
                      + ", ".join(sorted(COMMANDS)) + ". Each is logged with the server's "
                      "command id. reboot is also gated by polkit, update by polkit and the "
                      "release keys; configure takes settings from the fleet. shell runs one "
                      "line as the agent's user in its sandbox; set-time and set-timezone go "
                      "through timedated (polkit), set-time only while NTP does not "
                      "synchronise the clock.",
    "commands.screenshot_command": "Prints a JPEG or PNG on stdout, e.g. \"grim -t jpeg -\" "
                                   "(split into words, no shell). Unset: the screen full "
                                   "size by the picture check's means.",
    "commands.display_on_command": "Turns the display on, e.g. \"wlr-randr --output HDMI-A-1 "
                                   "--on\" (split into words, no shell).",
    "commands.display_off_command": "Turns the display off, e.g. \"wlr-randr --output "
                                    "HDMI-A-1 --off\".",
    "commands.timeout_s": "A command (or a shell line) running longer is ended (its whole "
                          "process group).",
    "hours.week": "[\"mon-fri 08:00-18:00\", \"sat 10:00-14:00\"]: the display on within these, "
                  "off outside; days not listed are off; empty: no schedule. Needs both "
                  "display commands.",
    "hours.exceptions": "[\"2026-12-25 off\", \"2026-12-24 08:00-12:00\"]: dates that differ "
                        "from the week.",
    "hours.timezone": "An IANA zone (Europe/Berlin). Unset: the system's local time.",
    "hours.clock": "synchronised: act only once NTP (systemd-timesyncd) set the clock; "
                   "trusted: a board with an RTC, or chrony/ntpsec.",
    "screen.settle_s": "After a display command, how long the display has to read the "
                       "state asked for (DRM, X11 DPMS, Wayland, CEC) before the result "
                       "says unconfirmed; 0: one look.",
    "screen.x_display": "The X server whose DPMS is read back (:0). Unset: the display "
                        "the display commands name (xset -display :0 ...), else the "
                        "agent's DISPLAY; none: X11 is not read.",
    "screen.cec_device": "The HDMI-CEC adapter whose TV is asked its power status, where "
                         "cec-ctl is installed and the adapter exists.",
    "screen.display_every_s": "How often the display is read between commands (and soon "
                              "after each DRM hotplug): a TV switched off by hand or a "
                              "cable pulled is told once, display.changed; 0: never.",
    "screen.picture_every_s": "How often the screen is captured and judged black, frozen "
                              "or ok (What the screen shows); 0: never. A black or frozen "
                              "screen is looked at every minute.",
    "screen.capture_command": "Prints an image of the screen (PPM, PNG or JPEG). Unset: "
                              "grim on Wayland, xwd (else ImageMagick's import) on X11.",
    "screen.black_luma": "Black: the picture's brightest pixel (0-255), every row of it, "
                         "below this, and...",
    "screen.black_contrast": "...standing less than this above its ground (the median "
                             "level): a starfield or dim text on near-black is not black.",
    "screen.content_moves": "The content is declared to move: only then is the same "
                            "picture for frozen_after_s frozen (a menu board is not).",
    "screen.frozen_after_s": "How long the same picture is seen before a moving screen is "
                             "frozen.",
    "screen.upload_pictures": "A black or frozen verdict queues its thumbnail as a "
                              "screenshot upload.",
    "screen.player_unit": "The systemd unit that shows the content (a kiosk browser): its "
                          "state and restarts are reported; restart-player and the "
                          "recovery ladder restart it.",
    "screen.recovery": "The recovery ladder: a black or frozen picture or a player down "
                       "restarts the player, then wakes the display, then reboots (only "
                       "where [commands] allow lists reboot).",
    "screen.player_restarts_per_hour": "The ladder's player restarts, at most, in an hour.",
    "screen.reboots_per_day": "The ladder's reboots, at most, in a day, counted across "
                              "reboots.",
    "screen.recovery_wait_s": "After a rung of the ladder, how long the picture and the "
                              "player have to come back before the next.",
    "screen.brightness_via": "How brightness is set and read back: a backlight in sysfs, "
                             "DDC/CI (ddcutil), or auto: the first this screen has.",
    "screen.volume_via": "How volume is set and read back: PipeWire (wpctl), PulseAudio "
                         "(pactl), ALSA (amixer), or auto: the first this screen has.",
    "screen.mixer_control": "amixer's control for volume.",
    "update.proof_timeout_s": "After a self-update the new version must prove its link live "
                              "within this, or the version it replaced is reinstalled.",
    "update.allow_downgrade": "Take an older version than the installed one. Off, so that "
                              "whoever holds the fleet server cannot bring back an old "
                              "signed release with a known hole.",
    "fleet.proof_timeout_s": "Settings from the fleet are kept only if the link is proven live "
                             "with them within this, else the last good ones return.",
    "fleet.manage_commands_allow": "true: the fleet may set [commands] allow too (never "
                                   "adding shell: only this file can).",
    "fleet.manage_server_url": "true: the fleet may move this screen to another server.",
    "log.level": "debug, info, warning or error.",
    "metrics.enabled": "Write the agent's metrics (the link, its heals, the queue, commands, "
                       "update and settings, watchdog pets, the display, the picture, the player "
                       "and its ladder, the card and power, the package apt offers) in "
                       "Prometheus' text format for "
                       "node_exporter's textfile collector. Needs python3-prometheus-client "
                       "(recommended by the package); docs/operate.md lists the series.",
    "metrics.textfile": "Where the metrics are written; unset: edge-agent.prom in the "
                        "runtime directory's sibling <dir>-metrics (/run/edge-agent-metrics: "
                        "root's small tmpfs, where the agent can write that file and nothing "
                        "else), which the package links into node_exporter's textfile "
                        "directory. Another path gets no link. Keep it on tmpfs: it is "
                        "rewritten every few seconds.",
    "metrics.every_s": "The least time between two writes of the textfile; a change waits at "
                       "most this, and the link thread's next wake-up (30 s at most).",
    "device.enabled": "Read the card's health (ext4's errors, a read-only remount, eMMC wear, "
                      "space left, bytes written a day), the Pi firmware's throttling flags "
                      "and why the last boot ended; status, events and metrics say them. "
                      "Reads only: the one write is a small mark at each orderly stop.",
    "device.every_s": "How often all of it is read, on the link thread's wake-ups; whether "
                      "the card went read-only is looked at every 10 s at most between.",
    "device.hardware_watchdog": "The system's own (hardware) watchdog: systemd's PID 1 pets "
                                "/dev/watchdog0 and a board that hangs resets. Root's start "
                                "step writes /etc/systemd/system.conf.d/edge-agent-watchdog.conf "
                                "(RuntimeWatchdogSec) and reloads systemd; off, it removes "
                                "the file. The operator's alone: never the fleet's.",
    "device.hardware_watchdog_s": "The board resets this long after PID 1's last pet (every "
                                  "half of it); the Pi's BCM2835 takes at most 15 s.",
    "device.heal_network": "Heal the network on the device, never blindly: while the link "
                           "is down for a reason where nothing answered and the kernel sees "
                           "the cause on the device (no carrier, no address, no default "
                           "route, a gateway whose neighbour entry is FAILED), bounce the "
                           "interface through its manager (systemd-networkd, NetworkManager, "
                           "ifupdown), then restart the manager, then reboot within [screen] "
                           "reboots_per_day where [commands] allow lists reboot. An upstream "
                           "cause only waits. Off: nothing probed, polkit grants nothing.",
    "device.heal_probe_s": "While the link is down for such a reason, the device's network "
                           "is probed this often (sysfs and rtnetlink, each bounded).",
    "device.heal_confirm_s": "A device-side cause seen this long, and by two probes, before "
                             "the first rung; twice as long for each episode in the hour "
                             "before (16 times at most).",
    "device.heal_wait_s": "Each rung's time to work before the next one is tried.",
    "debug.stall_link_after_s": "The link thread wedges itself this long after start.",
    "debug.link_max_wait_s": "The link loop's longest wait (30 s), shortened.",
    "debug.sysfs_root": "Read display, power and network state from this tree, not /sys.",
}

# Values shown for keys that are unset by default (not defaults: examples).
EXAMPLES = {
    "server.url": "https://fleet.example.com",
    "server.ca_file": "/etc/edge-agent/site-ca.pem",
    "network.proxy": "http://user:password@proxy.site.example:3128",
    "network.no_proxy": "10.0.0.0/8, .site.example",
    "network.client_cert": "/etc/edge-agent/client.pem",
    "network.client_key": "/etc/edge-agent/client.key",
    "identity.device_id": "lobby-screen-3",
    "identity.token": "...",
    "runtime.dir": "/run/edge-agent",
    "link.silence_timeout_s": 20,
    "commands.screenshot_command": "grim -t jpeg -",
    "commands.display_on_command": "wlr-randr --output HDMI-A-1 --on",
    "commands.display_off_command": "wlr-randr --output HDMI-A-1 --off",
    "hours.timezone": "Europe/Berlin",
    "screen.x_display": ":0",
    "screen.capture_command": "grim -t ppm -",
    "screen.player_unit": "kiosk.service",
    "metrics.textfile": "/run/edge-agent-metrics/edge-agent.prom",
}
# Not for an operator's file (test hooks): in docs/configure.md, not in agent.toml.
HIDDEN_SECTIONS = ("debug",)


def keys() -> list[tuple[str, str, S.Key]]:
    return [(section, key, spec) for section, ks in S.SCHEMA.items() for key, spec in ks.items()]


def unset(spec: S.Key) -> bool:
    return spec.default is None or spec.default is S.REQUIRED


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)   # strings and lists of strings: TOML's basic strings


def rule_text(spec: S.Key) -> str:
    rule = spec.rule
    if isinstance(rule, S.Range):
        return f"{rule.lo:g} to {rule.hi:g}"
    if isinstance(rule, tuple):
        return " | ".join(rule)
    if isinstance(rule, S.Text):
        return rule.what
    return ""


def fleet_text(name: str, spec: S.Key) -> str:
    if not spec.fleet:
        return "no"
    gate = C.FLEET_GATES.get(name)
    return f"if {gate} = true" if gate else "yes"


HEADER = """\
# edge-agent: the package's defaults, /usr/lib/edge-agent/agent.toml. Every upgrade
# replaces this file: do not edit it. This screen's settings go in
# /etc/edge-agent/agent.toml, which the agent reads over this one, key by key, and
# which no upgrade touches: copy a line there, uncommented, under its [section].
# Every key can also be set in the environment as EDGE_AGENT_<SECTION>_<KEY> (dots as
# underscores), e.g. EDGE_AGENT_SERVER_URL.
# After editing: edge-agent check-config && systemctl restart edge-agent
# Every key with its bounds: /usr/share/doc/edge-agent/docs/configure.md, man edge-agent.
#
# Made from the configuration schema by python -m devtools.configref --write.
# Below, each key commented out at its built-in default ("unset" where it has none: the
# value shown is an example); a line uncommented here is the package's default in its
# place.
#
# Until [server] url is set, systemd skips starting the agent (a condition, not a
# failure); set it, then systemctl restart edge-agent. Any other error in either file
# stops the agent with one line in the journal (priority err) and exit status 2,
# which systemd does not restart (RestartPreventExitStatus=2). With only the url set, it
# derives a device id, enrolls and shows a pairing code (journalctl -u edge-agent,
# edge-agent status, /run/edge-agent/pairing-code); enter the code on the server.
"""


def render_toml() -> str:
    out = [HEADER]
    for section, ks in S.SCHEMA.items():
        if section in HIDDEN_SECTIONS:
            continue
        out.append(f"\n[{section}]\n")
        out.extend(f"# {line}\n"
                   for line in textwrap.wrap(SECTIONS[section], 86, break_on_hyphens=False))
        for key, spec in ks.items():
            name = f"{section}.{key}"
            for line in textwrap.wrap(DOCS[name], 84, break_on_hyphens=False):
                out.append(f"#   {line}\n")
            if unset(spec):
                what = "required" if spec.default is S.REQUIRED else "unset"
                out.append(f"# {key} = {toml_value(EXAMPLES[name])}   # {what} by default; "
                           f"an example\n")
            else:
                out.append(f"# {key} = {toml_value(spec.default)}\n")
    return "".join(out)


def render_markdown() -> str:
    out = ["""\
# Configuring a screen

<!-- Made from the configuration schema (agent/config/load.py SCHEMA) by
     `python -m devtools.configref --write`; tests/test_config_reference.py fails when
     this page and the schema differ. Edit devtools/configref.py, not this page. -->

One TOML file, `/etc/edge-agent/agent.toml` (root:edge-agent, 0640; made by the package at
its first install and never changed by an upgrade), read key by key over the package's
defaults in `/usr/lib/edge-agent/agent.toml` (every key below, commented out at its
default). Every key can be set in the environment as `EDGE_AGENT_<SECTION>_<KEY>` (dots as
underscores), which wins over both files and over the fleet's settings. A list there is
its items separated by commas, `EDGE_AGENT_COMMANDS_ALLOW=reboot,logs` (a working-hours
entry's spans then separated by spaces), or a JSON list,
`EDGE_AGENT_COMMANDS_ALLOW='["reboot","logs"]'`; any other list syntax is refused with
one line saying these two. Where each value
in force comes from, layer by layer (built-in default, the package's defaults, this
screen's file, the fleet's settings, the environment): `edge-agent check-config`, and
`edge-agent status --json` under `settings.origins`.

A bad value stops the agent at start with one line naming the key (`journalctl -p err -u
edge-agent`) and exit status 2, which systemd does not restart; `edge-agent check-config`
applies the very same rules, says what is in force (profile, proxy with its password
hidden, CA), and checks that the `edge-agent` user can read every file the configuration
names. `EDGE_AGENT_` variables that name no section are not configuration and are left
alone; one a letter away from a real override is refused with the name it was close to.
"Fleet" says whether settings from the fleet may set the key (docs/PROTOCOL.md,
"configure"; `[fleet]` below).

After editing: `edge-agent check-config && systemctl restart edge-agent`.
"""]
    for section, ks in S.SCHEMA.items():
        out.append(f"\n## [{section}]\n\n{SECTIONS[section]}\n\n")
        out.append("| key | default | allowed | fleet | environment | what it does |\n")
        out.append("|---|---|---|---|---|---|\n")
        for key, spec in ks.items():
            name = f"{section}.{key}"
            default = default_text(spec, "`{}`")
            allowed = rule_text(spec) or spec.type.__name__
            if spec.type is list:
                allowed = "list of strings"
            out.append(f"| `{key}` | {default} | {allowed.replace('|', '&#124;')} | "
                       f"{fleet_text(name, spec)} | `{C.env_name(section, key)}` | "
                       f"{DOCS[name].replace('|', '&#124;')} |\n")
    return "".join(out)


def default_text(spec, shown: str = "{}") -> str:
    """A key's built-in default in words: required, unset, or its TOML value (in
    ``shown``)."""
    if spec.default is S.REQUIRED:
        return "required"
    if spec.default is None:
        return "unset"
    return shown.format(toml_value(spec.default))


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def render_man() -> str:
    """The man page's CONFIGURATION section: every key an operator may set, its default
    and what it does (bounds and the rest: configure.md)."""
    out = [MAN_BEGIN, ".SH CONFIGURATION\n",
           _roff("Keys of /etc/edge-agent/agent.toml, by [section], with their built-in "
                 "defaults; each can be set in the environment as EDGE_AGENT_<SECTION>_<KEY>. "
                 "Bounds, the environment variables and what the fleet may set: "
                 "/usr/share/doc/edge-agent/docs/configure.md.") + "\n"]
    for section, ks in S.SCHEMA.items():
        if section in HIDDEN_SECTIONS:
            continue
        out.append(f".SS [{_roff(section)}]\n")
        for key, spec in ks.items():
            name = f"{section}.{key}"
            default = default_text(spec)
            out.append(f".TP\n.B {_roff(key)}\n{_roff('(' + default + ') ' + DOCS[name])}\n")
    out.append(MAN_END)
    return "".join(out)


def with_man_section(page: str) -> str:
    """The man page with its CONFIGURATION section as render_man() makes it."""
    start, end = page.index(MAN_BEGIN), page.index(MAN_END) + len(MAN_END)
    return page[:start] + render_man() + page[end:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true",
                   help="write debian/agent.toml, docs/configure.md and the man page's "
                        "CONFIGURATION section")
    args = p.parse_args(argv)
    if not args.write:
        sys.stdout.write(render_toml())
        return 0
    TOML_PATH.write_text(render_toml())
    MD_PATH.write_text(render_markdown())
    MAN_PATH.write_text(with_man_section(MAN_PATH.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
