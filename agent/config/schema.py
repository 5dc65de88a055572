"""The configuration's schema: every key of agent.toml, its type, its default, the rule
it must obey and where it lands in the Config (model.py). Defaults are the model's own,
so each is written once; every rule here is the configuration's alone and imports no
part of the agent that acts on it."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..base import system_watchdog
from ..base.backoff import JITTER_MODES, BackoffPolicy
from ..base.vocabulary import PROFILE_AUTO, PROFILE_NAMES
from . import files
# the errors' home is files.py (light: `status` finds its file with it), named here too
from .files import ConfigError, ConfigMissing  # noqa: F401
from .policies import IdlePolicy, KeepalivePolicy, LivenessPolicy, UploadPolicy


# -- schema -------------------------------------------------------------------
# Every key is declared here and only here: its type, its default, the rule it must
# obey, and where it lands in Config ("uploads.base_s" is Config.uploads.base_s). A
# default that a policy object already has is taken from it, not written twice.
# Every number has a lower and an upper bound: a value that the TOML parser accepts
# but the kernel or the link cannot (a keepalive idle time past TCP_KEEPIDLE's range,
# a 1 ms heartbeat, a 1e308 s one) is refused here, where check-config sees it, and
# never reaches a socket option or a timer in a running thread.
REQUIRED = object()
LOG_LEVELS = ("debug", "info", "warning", "error")
DAY = 86400.0


@dataclass(frozen=True)
class Range:
    """Inclusive bounds for a number; the reason for them is in the SCHEMA entry."""
    lo: float
    hi: float

    def check(self, name: str, v) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{name}: must be a finite number")
        if not self.lo <= v <= self.hi:
            raise ConfigError(f"{name}: must be between {self.lo:g} and {self.hi:g}, "
                              f"got {shown_number(v)}")


def shown_number(v) -> str:
    """A number as an error says it: an integer of 400 digits has no float to show."""
    if isinstance(v, int) and abs(v) >= 10 ** 15:
        return f"a number of {len(str(abs(v)))} digits"
    return f"{v:g}"


@dataclass(frozen=True)
class Text:
    """What a string may hold: printable ASCII within a length, matching ``pattern``."""
    what: str
    pattern: re.Pattern
    max_len: int = 4096

    def check(self, name: str, v: str) -> None:
        if not v or len(v) > self.max_len or not self.pattern.fullmatch(v):
            raise ConfigError(f"{name}: must be {self.what}, got {_shown(v)}")


# An absolute path: the rule's home is files.py (light: `status` reads [runtime] dir with it)
ABS_PATH = Text("an absolute path (/...)", files.ABS_PATH, files.ABS_PATH_MAX)
# node_exporter's textfile collector reads only files named *.prom
PROM_PATH = Text("an absolute path ending in .prom",
                 re.compile(r"(?:/[^\x00-\x1f\x7f/]+)*/[^\x00-\x1f\x7f/]+\.prom"), 1024)
# Run through shlex.split, never a shell: one line of printable characters.
COMMAND_LINE = Text("one line of printable characters", re.compile(r"[^\x00-\x1f\x7f]+"))
X_DISPLAY = Text("an X display such as :0",
                 re.compile(r"[A-Za-z0-9._-]*:[0-9]{1,5}(?:\.[0-9]{1,3})?"), 64)
# a systemd unit's name (kiosk.service, cage@tty1.service): what polkit is asked to
# restart, so nothing that could name a path or a pattern
UNIT_NAME = Text("a systemd service's name such as kiosk.service",
                 re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]*(?:@[A-Za-z0-9:_.-]+)?\.service"), 128)
# an ALSA simple mixer control (amixer's "Master", "PCM", "HDMI Playback Volume")
MIXER_CONTROL = Text("an ALSA mixer control such as Master", re.compile(r"[A-Za-z0-9 ,._-]+"), 64)
TIME_ZONE = Text("an IANA time zone such as Europe/Berlin",
                 re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9][A-Za-z0-9_+-]*){0,2}"), 64)


def _shown(v: str) -> str:
    return repr(v if len(v) <= 60 else v[:57] + "...")


@dataclass(frozen=True)
class Key:
    """One key of the schema: its type, literal default, the field it goes into and its rule."""
    type: type
    default: Any
    into: str
    rule: Range | Text | tuple | None = None   # bounds, a string rule, or the allowed values
    fleet: bool = False    # the fleet server may set it (agent/settings/, docs/PROTOCOL.md)


SCHEMA: dict[str, dict[str, Key]] = {
    "server": {
        "url": Key(str, REQUIRED, "server.url", fleet=True),     # its own rule: _check_url
        # the site's CA (a TLS-inspecting box), for every TLS connection the agent makes
        "ca_file": Key(str, None, "server.egress.ca_file", ABS_PATH),
        # "auto": the server's own answers tell which (identity/server_kind.py)
        "profile": Key(str, PROFILE_AUTO, "server.profile", (PROFILE_AUTO,) + PROFILE_NAMES),
        # a cellular link needs seconds; minutes only hide a dead server
        "connect_timeout_s": Key(float, 10.0, "server.connect_timeout_s", Range(0.5, 300), fleet=True),
    },
    "network": {
        # The way out of a site that allows no other: http://[user:password@]host:port
        # (HTTP CONNECT, Basic authentication). Unset: the environment's https_proxy
        # (or http_proxy for an http:// server), which a systemd service only has if
        # its unit sets it. Its own check (egress.parse_proxy): the value may hold a
        # password, which no error message may show.
        "proxy": Key(str, None, "server.egress.proxy"),
        # hosts that go direct (egress.bypasses); unset: none if proxy is set here, else
        # the environment's no_proxy
        "no_proxy": Key(str, None, "server.egress.no_proxy"),
        # mutual TLS: a certificate (PEM, with its key unless client_key is given)
        "client_cert": Key(str, None, "server.egress.client_cert", ABS_PATH),
        "client_key": Key(str, None, "server.egress.client_key", ABS_PATH),
    },
    "identity": {
        # Both optional: without a device_id one is derived and kept in state_dir;
        # without a token the agent enrolls and shows a pairing code.
        "device_id": Key(str, None, "identity.device_id"),
        "token": Key(str, None, "identity.token"),
        "state_dir": Key(str, "/var/lib/edge-agent", "identity.state_dir", ABS_PATH),
        "show_code_on_console": Key(bool, False, "identity.show_code_on_console"),
    },
    "runtime": {
        # systemd's RuntimeDirectory= sets $RUNTIME_DIRECTORY; tmpfs, never the SD card.
        "dir": Key(str, None, "runtime.dir", ABS_PATH),
    },
    "link": {
        # below a second the heartbeats are the load (and the ACK cannot come back in
        # time over a slow link); above an hour no middlebox keeps the flow open
        "heartbeat_interval_s": Key(float, LivenessPolicy.heartbeat_interval_s,
                                    "link.liveness.heartbeat_interval_s", Range(1, 3600), fleet=True),
        "ack_timeout_s": Key(float, LivenessPolicy.ack_timeout_s, "link.liveness.ack_timeout_s",
                             Range(0.1, 600), fleet=True),
        "missed_acks": Key(int, LivenessPolicy.missed_acks, "link.liveness.missed_acks", Range(1, 10), fleet=True),
        "silence_timeout_s": Key(float, LivenessPolicy.silence_timeout_s,
                                 "link.liveness.silence_timeout_s", Range(1, 7200), fleet=True),
        "stable_after_s": Key(float, 60.0, "link.stable_after_s", Range(1, DAY), fleet=True),
        "wake_min_interval_s": Key(float, 5.0, "link.wake_min_interval_s", Range(0, 3600)),
        # learn a site's idle limit from the connections it reaps, heartbeat under it
        # (link/idle_limit.py), and step back up after this long without a reap
        "adapt_heartbeat": Key(bool, IdlePolicy.enabled, "link.idle.enabled", fleet=True),
        "adapt_probe_after_s": Key(float, IdlePolicy.probe_after_s, "link.idle.probe_after_s",
                                   Range(10, 7 * DAY)),
    },
    "link.backoff": {
        "base_s": Key(float, BackoffPolicy.base_s, "link.backoff.base_s", Range(0.1, 3600), fleet=True),
        # a screen that waits more than an hour between tries is a screen nobody can reach
        "cap_s": Key(float, BackoffPolicy.cap_s, "link.backoff.cap_s", Range(0.1, 3600), fleet=True),
        "jitter": Key(str, BackoffPolicy.jitter, "link.backoff.jitter", JITTER_MODES, fleet=True),
    },
    "link.keepalive": {
        # Linux's own limits: TCP_KEEPIDLE and TCP_KEEPINTVL <= 32767 s, TCP_KEEPCNT <= 127
        "idle_s": Key(int, KeepalivePolicy.idle_s, "link.keepalive.idle_s", Range(1, 32767), fleet=True),
        "interval_s": Key(int, KeepalivePolicy.interval_s, "link.keepalive.interval_s",
                          Range(1, 32767), fleet=True),
        "count": Key(int, KeepalivePolicy.count, "link.keepalive.count", Range(1, 127), fleet=True),
        "user_timeout_s": Key(float, KeepalivePolicy.user_timeout_s, "link.keepalive.user_timeout_s",
                              Range(1, 3600), fleet=True),
    },
    "uploads": {
        "base_s": Key(float, UploadPolicy.base_s, "uploads.base_s", Range(0.1, DAY), fleet=True),
        "cap_s": Key(float, UploadPolicy.cap_s, "uploads.cap_s", Range(0.1, 7 * DAY), fleet=True),
        "max_items": Key(int, UploadPolicy.max_items, "uploads.max_items", Range(1, 1_000_000)),
        "max_bytes": Key(int, UploadPolicy.max_bytes, "uploads.max_bytes", Range(1, 1 << 40)),
        "max_age_days": Key(float, UploadPolicy.max_age_days, "uploads.max_age_days",
                            Range(0.001, 3650)),   # not the fleet's: it would drop what is queued
        "dedupe_window_s": Key(float, UploadPolicy.dedupe_window_s, "uploads.dedupe_window_s",
                               Range(0, 30 * DAY)),
    },
    "events": {
        "enabled": Key(bool, True, "events.enabled"),
        # one event per kind per settle window
        "settle_s": Key(float, 2.0, "events.settle_s", Range(0.05, 3600)),
        # sysfs reads when netlink is unavailable
        "fallback_interval_s": Key(float, 60.0, "events.fallback_interval_s", Range(0.1, DAY)),
        "udev_source": Key(str, "auto", "events.udev_source", ("auto", "udev", "kernel")),
        "telemetry_every_s": Key(float, 300.0, "events.telemetry_every_s", Range(1, DAY), fleet=True),
    },
    "watchdog": {
        # Pet systemd's watchdog only while the link is proven live (docs/operate.md).
        "require_link": Key(bool, True, "watchdog.require_link"),
    },
    "commands": {
        # What the fleet server may ask of this screen (docs/PROTOCOL.md, remote
        # operations). reboot, restart-agent, display and screenshot are opt-in.
        "allow": Key(list, ["diagnostics", "logs"], "commands.allow", fleet=True),
        # prints a JPEG or PNG, e.g. "grim -t jpeg -"; unset: the screen captured full
        # size by the picture check's means ([screen] capture_command, xwd, grim)
        "screenshot_command": Key(str, None, "commands.screenshot_command", COMMAND_LINE),
        # e.g. "wlr-randr --output HDMI-A-1 --on"
        "display_on_command": Key(str, None, "commands.display_on_command", COMMAND_LINE),
        "display_off_command": Key(str, None, "commands.display_off_command", COMMAND_LINE),
        "timeout_s": Key(float, 60.0, "commands.timeout_s", Range(0.1, 3600)),
    },
    "hours": {
        # Working hours (agent/config/week.py): ["mon-fri 08:00-18:00", "sat 10:00-14:00"];
        # days not listed are off; empty: no schedule. Run through [commands]
        # display_on_command / display_off_command, which they need.
        "week": Key(list, [], "hours.week", fleet=True),
        "exceptions": Key(list, [], "hours.exceptions", fleet=True),   # ["2026-12-25 off"]
        # an IANA zone (Europe/Berlin); unset: the system's local time
        "timezone": Key(str, None, "hours.timezone", TIME_ZONE, fleet=True),
        # synchronised: act only once NTP set the clock; trusted: a board with an RTC
        "clock": Key(str, "synchronised", "hours.clock", ("synchronised", "trusted"),
                     fleet=True),
    },
    "screen": {
        # after a display command (the display command, working hours), how long the
        # display has to read the state asked for (agent/screen/core.py): a TV woken by
        # CEC takes seconds; longer only holds the command's result back
        "settle_s": Key(float, 10.0, "screen.settle_s", Range(0, 120)),
        # the X server whose DPMS is read back; unset: the display the display commands
        # name (xset -display :0), else the agent's DISPLAY
        "x_display": Key(str, None, "screen.x_display", X_DISPLAY),
        # the HDMI-CEC adapter whose TV is asked its power status (where cec-ctl is)
        "cec_device": Key(str, "/dev/cec0", "screen.cec_device", ABS_PATH),
        # the display watched between commands (agent/screen/display_watch.py): a TV
        # switched off by hand, a cable pulled; its state read this often and soon after
        # each DRM hotplug, a change told once (display.changed); 0: never
        "display_every_s": Key(float, 60.0, "screen.display_every_s", Range(0, 3600)),
        # Picture health (agent/screen/picture.py): how often the screen is captured and
        # judged black, frozen or ok; 0: never. A check of a 1080p screen costs ~28 ms of
        # CPU (xwd and every row of its dump, measured): every 15 min it adds under half
        # the idle agent's CPU; a screen found black or frozen is looked at every minute
        "picture_every_s": Key(float, 900.0, "screen.picture_every_s", Range(0, 3600)),
        # prints an image of the screen (PPM, PNG or JPEG) on stdout; unset: grim on
        # Wayland, xwd (else ImageMagick's import) on X11
        "capture_command": Key(str, None, "screen.capture_command", COMMAND_LINE),
        # black: the brightest pixel of the whole picture (0-255, every row) below
        # black_luma, and less than black_contrast above the ground (the median level):
        # a starfield, a small clock, dim text on near-black have a bright detail
        "black_luma": Key(float, 16.0, "screen.black_luma", Range(0, 255)),
        "black_contrast": Key(float, 4.0, "screen.black_contrast", Range(0, 128)),
        # frozen: judged only where the content is declared to move (a static menu board
        # is not frozen); the same picture this long is
        "content_moves": Key(bool, False, "screen.content_moves", fleet=True),
        "frozen_after_s": Key(float, 300.0, "screen.frozen_after_s", Range(30, DAY), fleet=True),
        # a black or frozen verdict queues its thumbnail as a screenshot upload, where
        # [commands] allow lists screenshot (a picture of the screen is that command's)
        "upload_pictures": Key(bool, False, "screen.upload_pictures", fleet=True),
        # The player: the systemd unit that shows the content (a kiosk browser); its
        # state and restarts are reported, and the recovery ladder restarts it
        "player_unit": Key(str, None, "screen.player_unit", UNIT_NAME),
        # the recovery ladder (agent/screen/ladder.py): restart the player, wake the
        # display, then reboot (where [commands] allow lists reboot); off by default
        # the operator's alone: it lets root grant the restart of player_unit
        "recovery": Key(bool, False, "screen.recovery"),
        "player_restarts_per_hour": Key(int, 3, "screen.player_restarts_per_hour",
                                        Range(0, 20), fleet=True),
        # counted across reboots (a small file in state_dir, written before each reboot)
        "reboots_per_day": Key(int, 1, "screen.reboots_per_day", Range(0, 10), fleet=True),
        # after a rung, how long the picture and the player have to come back
        "recovery_wait_s": Key(float, 60.0, "screen.recovery_wait_s", Range(5, 3600),
                               fleet=True),
        # how the brightness and volume commands act and read back: auto finds the
        # first this screen has (a backlight in sysfs, then DDC/CI; PipeWire's wpctl,
        # PulseAudio's pactl, then ALSA's amixer)
        "brightness_via": Key(str, "auto", "screen.brightness_via",
                              ("auto", "backlight", "ddcutil", "none")),
        "volume_via": Key(str, "auto", "screen.volume_via",
                          ("auto", "wpctl", "pactl", "amixer", "none")),
        "mixer_control": Key(str, "Master", "screen.mixer_control", MIXER_CONTROL),
    },
    "update": {
        # after a self-update, how long the new agent has to prove its link live before
        # the root side reinstalls the version it replaced (agent/update/rules.py)
        "proof_timeout_s": Key(float, 180.0, "update.proof_timeout_s", Range(10, 3600)),
        # an older version than the installed one: off, so that whoever holds the fleet
        # server cannot bring back an old signed release with a known hole
        "allow_downgrade": Key(bool, False, "update.allow_downgrade"),
    },
    "fleet": {
        # after settings from the fleet are applied, how long the link has to prove
        # itself live with them before the last good revision comes back
        "proof_timeout_s": Key(float, 120.0, "fleet.proof_timeout_s", Range(10, 3600)),
        # [commands] allow and the server's URL are the operator's: the fleet may set
        # them only when these say so (a URL from the fleet takes the token elsewhere)
        "manage_commands_allow": Key(bool, False, "fleet.manage_commands_allow"),
        "manage_server_url": Key(bool, False, "fleet.manage_server_url"),
    },
    "log": {
        "level": Key(str, "info", "log.level", LOG_LEVELS, fleet=True),
    },
    "metrics": {
        # Prometheus' text format for node_exporter's textfile collector (docs/operate.md,
        # metrics); off: a screen nobody scrapes pays nothing for it
        "enabled": Key(bool, False, "metrics.enabled"),
        # unset: <[runtime] dir>-metrics/edge-agent.prom; tmpfs, never the card; node_exporter
        # reads only *.prom
        "textfile": Key(str, None, "metrics.textfile", PROM_PATH),
        # the least time between two writes: a change waits at most this (and the link
        # thread's next wake-up, 30 s at most); never a write per heartbeat
        "every_s": Key(float, 15.0, "metrics.every_s", Range(1, 3600)),
    },
    "device": {
        # the device's truth (docs/operate.md, the device): the card's verdict, the
        # firmware's power flags, why the last boot ended; reads only, never the card
        "enabled": Key(bool, True, "device.enabled"),
        # everything read this often on the link thread's wake-ups; mountinfo (a card
        # remounted read-only) at most every 10 s between
        "every_s": Key(float, 60.0, "device.every_s", Range(1, 3600)),
        # the system's own watchdog (base/system_watchdog.py): systemd's RuntimeWatchdogSec
        # by a drop-in root's start step writes; the operator's alone, never the fleet's
        # (root acts on it, and a fleet that turned it off would hide a hung board)
        "hardware_watchdog": Key(bool, False, "device.hardware_watchdog"),
        # the Pi's BCM2835 takes at most 15 s; under 5 s a PID 1 held by a slow card's
        # write resets a healthy screen
        "hardware_watchdog_s": Key(int, system_watchdog.PI_MAX_S, "device.hardware_watchdog_s",
                                   Range(system_watchdog.MIN_S, system_watchdog.PI_MAX_S)),
        # the network healed on the device (docs/operate.md, the network healed): off,
        # nothing is probed nor done and polkit grants nothing; on, a device-side cause
        # (no carrier, no lease, a gateway that answers nothing) climbs a ladder: the
        # interface bounced through its manager, the manager restarted, a reboot (within
        # [screen] reboots_per_day, where [commands] allow lists reboot); upstream causes
        # only wait
        "heal_network": Key(bool, False, "device.heal_network"),
        # while the link is down for a reason where nothing answered: a probe this often
        "heal_probe_s": Key(float, 10.0, "device.heal_probe_s", Range(2, 300)),
        # a device-side cause seen this long (and by two probes) before the first rung;
        # doubled for each episode in the hour before (16 times at most)
        "heal_confirm_s": Key(float, 60.0, "device.heal_confirm_s", Range(10, 3600)),
        # each rung's time to work before the next: with the defaults the three rungs fit
        # in the first WatchdogSec (5 min) of an outage, whose restart would begin again
        "heal_wait_s": Key(float, 90.0, "device.heal_wait_s", Range(30, 3600)),
    },
    "debug": {
        # Test hook: the link thread wedges itself this long after start.
        "stall_link_after_s": Key(float, None, "debug.stall_link_after_s", Range(0, DAY)),
        # Test hook: the link loop's longest wait (link/runner.py MAX_WAIT_S, 30 s), which
        # a stalled loop's detection waits out.
        "link_max_wait_s": Key(float, None, "debug.link_max_wait_s", Range(0.5, 60)),
        # Test hook: read display/power/network state from this tree instead of /sys.
        "sysfs_root": Key(str, None, "debug.sysfs_root", ABS_PATH),
    },
}
