"""Configuration: one TOML file, environment overrides, validated before anything starts.

Every problem is reported as one line naming the key (``link.ack_timeout_s: ...``);
the CLI turns a ConfigError into exit code 2, never a traceback.

Environment overrides are ``EDGE_AGENT_<SECTION>_<KEY>`` with dots as underscores,
e.g. ``EDGE_AGENT_LINK_BACKOFF_BASE_S=2`` for ``[link.backoff] base_s``.
"""
from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from .identity.rules import DEVICE_ID_RULE, TOKEN_RULE, usable_device_id, usable_token
from .link.backoff import JITTER_MODES, BackoffPolicy
from .link.liveness import LivenessPolicy
from .link.sockopts import KeepalivePolicy
from .uploads.schedule import UploadPolicy

DEFAULT_PATH = "/etc/edge-agent/agent.toml"
ENV_PREFIX = "EDGE_AGENT_"
PROFILES = ("edge-agent", "screentinker")


class ConfigError(Exception):
    """A one-line, user-facing description of what is wrong and where."""


class ConfigMissing(ConfigError):
    """A required key is not set anywhere: the device is not configured yet."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


# -- schema -------------------------------------------------------------------
# Each key: (type, default). ``None`` default means optional-and-unset; REQUIRED
# means the key must be given (in the file or the environment).
REQUIRED = object()

SCHEMA: dict[str, dict[str, tuple[type, Any]]] = {
    "server": {
        "url": (str, REQUIRED),
        "ca_file": (str, None),
        "profile": (str, "edge-agent"),
        "connect_timeout_s": (float, 10.0),
    },
    "identity": {
        # Both optional: without a device_id one is derived and kept in state_dir;
        # without a token the agent enrolls and shows a pairing code.
        "device_id": (str, None),
        "token": (str, None),
        "state_dir": (str, "/var/lib/edge-agent"),
        "show_code_on_console": (bool, False),
    },
    "runtime": {
        # systemd's RuntimeDirectory= sets $RUNTIME_DIRECTORY; tmpfs, never the SD card.
        "dir": (str, None),
    },
    "link": {
        "heartbeat_interval_s": (float, 15.0),
        "ack_timeout_s": (float, 5.0),
        "missed_acks": (int, 1),
        "silence_timeout_s": (float, None),
        "stable_after_s": (float, 60.0),
        "wake_min_interval_s": (float, 5.0),
    },
    "link.backoff": {
        "base_s": (float, 1.0),
        "cap_s": (float, 60.0),
        "jitter": (str, "full"),
    },
    "link.keepalive": {
        "idle_s": (int, 15),
        "interval_s": (int, 5),
        "count": (int, 3),
        "user_timeout_s": (float, 20.0),
    },
    "uploads": {
        "base_s": (float, 30.0),
        "cap_s": (float, 1800.0),
        "max_items": (int, 10_000),
        "max_bytes": (int, 256 * 1024 * 1024),
        "max_age_days": (float, 14.0),
        "dedupe_window_s": (float, 3600.0),
    },
    "events": {
        "enabled": (bool, True),
        "settle_s": (float, 2.0),              # one event per kind per settle window
        "fallback_interval_s": (float, 60.0),  # sysfs reads when netlink is unavailable
        "udev_source": (str, "auto"),          # auto | udev | kernel
        "telemetry_every_s": (float, 300.0),
    },
    "watchdog": {
        # Pet systemd's watchdog only while the link is proven live (see README).
        "require_link": (bool, True),
    },
    "commands": {
        # What the fleet server may ask of this screen (docs/PROTOCOL.md, remote
        # operations). reboot, restart-agent, display and screenshot are opt-in.
        "allow": (list, ["diagnostics", "logs"]),
        "screenshot_command": (str, None),   # prints a JPEG or PNG, e.g. "grim -t jpeg -"
        "display_on_command": (str, None),   # e.g. "wlr-randr --output HDMI-A-1 --on"
        "display_off_command": (str, None),
        "timeout_s": (float, 60.0),
    },
    "log": {
        "level": (str, "info"),
    },
    "debug": {
        # Test hook: the link thread wedges itself this long after start.
        "stall_link_after_s": (float, None),
        # Test hook: read display/power/network state from this tree instead of /sys.
        "sysfs_root": (str, None),
    },
}

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Config:
    server_url: str
    ca_file: str | None
    profile: str
    connect_timeout_s: float
    device_id: str | None
    token: str | None = field(repr=False)
    state_dir: str
    runtime_dir: str
    liveness: LivenessPolicy
    backoff: BackoffPolicy
    keepalive: KeepalivePolicy
    stable_after_s: float
    wake_min_interval_s: float
    log_level: str
    uploads: UploadPolicy = UploadPolicy()
    show_code_on_console: bool = False
    events_enabled: bool = True
    events_settle_s: float = 2.0
    events_fallback_interval_s: float = 60.0
    events_udev_source: str = "auto"
    telemetry_every_s: float = 300.0
    watchdog_require_link: bool = True
    commands_allow: frozenset = frozenset({"diagnostics", "logs"})
    screenshot_command: str | None = None
    display_on_command: str | None = None
    display_off_command: str | None = None
    command_timeout_s: float = 60.0
    debug_stall_link_after_s: float | None = None
    debug_sysfs_root: str | None = None
    source: str = ""

    @property
    def server_display(self) -> str:
        """The server URL for logs and the world-readable status file: without any
        user:password a URL may carry."""
        return redact_url(self.server_url)

    @property
    def status_path(self) -> str:
        return os.path.join(self.runtime_dir, "status.json")

    @property
    def commands_path(self) -> str:
        return os.path.join(self.state_dir, "commands.json")

    @property
    def queue_path(self) -> str:
        return os.path.join(self.state_dir, "queue")

    @property
    def schedule_path(self) -> str:
        return os.path.join(self.runtime_dir, "backoff.json")


def redact_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.username is None and parsed.password is None:
        return url
    host = parsed.hostname or ""
    if parsed.port:
        host += f":{parsed.port}"
    return parsed._replace(netloc=f"***@{host}").geturl()


def env_name(section: str, key: str) -> str:
    return ENV_PREFIX + (section.replace(".", "_") + "_" + key).upper()


def _flatten(table: dict, path: str, out: dict[str, dict]) -> dict[str, dict]:
    """TOML nests [link.backoff] inside [link]; split it back into schema sections."""
    for name, value in table.items():
        sub = f"{path}.{name}" if path else name
        if isinstance(value, dict):
            if sub not in SCHEMA:
                raise ConfigError(f"{sub}: unknown section")
            out.setdefault(sub, {})
            _flatten(value, sub, out)
        elif not path:
            raise ConfigError(f"{sub}: unknown key (keys belong in a [section])")
        else:
            out[path][name] = value
    return out


def _coerce(name: str, typ: type, value: Any, from_env: bool) -> Any:
    if typ is bool:
        if from_env:
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {type(value).__name__}")
        return value
    if typ is list:
        items = ([x.strip() for x in value.split(",") if x.strip()] if from_env else value)
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ConfigError(f"{name}: expected a list of strings")
        return items
    if from_env:
        try:
            if typ is int:
                return int(value.strip())
            if typ is float:
                return float(value.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected a {typ.__name__}, got {value!r}") from None
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected a {typ.__name__}, got {type(value).__name__}")
    return value


def load(path: str | None = None, env: dict[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    path = path or DEFAULT_PATH
    doc: dict = {}
    if path != "-":
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except PermissionError:
            raise ConfigError(f"{path}: permission denied") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a directory") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not valid UTF-8") from None
    sections = _flatten(doc, "", {})

    values: dict[str, Any] = {}
    for section, keys in SCHEMA.items():
        given = sections.get(section, {})
        for key in given:
            if key not in keys:
                raise ConfigError(f"{section}.{key}: unknown key")
        for key, (typ, default) in keys.items():
            name = f"{section}.{key}"
            ename = env_name(section, key)
            if ename in env:
                values[name] = _coerce(f"{name} (from {ename})", typ, env[ename], True)
            elif key in given:
                values[name] = _coerce(name, typ, given[key], False)
            elif default is REQUIRED:
                raise ConfigMissing(name, f"{name}: required (set it in {path} or {ename})")
            else:
                values[name] = default
    for ename in env:
        if ename.startswith(ENV_PREFIX) and not any(
                ename == env_name(s, k) for s, ks in SCHEMA.items() for k in ks):
            raise ConfigError(f"{ename}: unknown environment override")
    return _validate(values, env, path)


def _positive(values: dict, name: str, allow_zero: bool = False) -> None:
    v = values[name]
    if v is None:
        return
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{name}: must be a finite number")
    if v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(f"{name}: must be {'>= 0' if allow_zero else '> 0'}, got {v}")


def _validate(v: dict, env: dict, path: str) -> Config:
    url = v["server.url"]
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"server.url: must be an http:// or https:// URL, got {url!r}")
    try:
        parsed.port
    except ValueError:
        raise ConfigError(f"server.url: bad port in {url!r}") from None
    if v["server.ca_file"] is not None and not os.path.isfile(v["server.ca_file"]):
        raise ConfigError(f"server.ca_file: no such file: {v['server.ca_file']}")
    if v["server.profile"] not in PROFILES:
        raise ConfigError(f"server.profile: must be one of {', '.join(PROFILES)}")
    if v["identity.device_id"] is not None and not usable_device_id(v["identity.device_id"]):
        raise ConfigError(f"identity.device_id: {DEVICE_ID_RULE}")
    token = v["identity.token"]
    if token is not None and not usable_token(token):
        raise ConfigError(f"identity.token: {TOKEN_RULE}")
    if token is not None and v["identity.device_id"] is None:
        raise ConfigError("identity.token: a pre-provisioned token needs identity.device_id too")

    for name in ("server.connect_timeout_s", "link.heartbeat_interval_s", "link.ack_timeout_s",
                 "link.silence_timeout_s", "link.stable_after_s", "link.backoff.base_s",
                 "link.backoff.cap_s", "link.keepalive.idle_s", "link.keepalive.interval_s",
                 "link.keepalive.count", "link.keepalive.user_timeout_s", "link.missed_acks"):
        _positive(v, name)
    _positive(v, "link.wake_min_interval_s", allow_zero=True)
    _positive(v, "debug.stall_link_after_s", allow_zero=True)
    for name in ("uploads.base_s", "uploads.cap_s", "uploads.max_items", "uploads.max_bytes",
                 "uploads.max_age_days"):
        _positive(v, name)
    _positive(v, "uploads.dedupe_window_s", allow_zero=True)
    for name in ("events.settle_s", "events.fallback_interval_s", "events.telemetry_every_s"):
        _positive(v, name)
    if v["events.udev_source"] not in ("auto", "udev", "kernel"):
        raise ConfigError("events.udev_source: must be one of auto, udev, kernel")
    if v["uploads.cap_s"] < v["uploads.base_s"]:
        raise ConfigError("uploads.cap_s: must be >= uploads.base_s")
    hb, ack = v["link.heartbeat_interval_s"], v["link.ack_timeout_s"]
    if ack >= hb:
        raise ConfigError(f"link.ack_timeout_s: must be less than link.heartbeat_interval_s ({hb})")
    silence = v["link.silence_timeout_s"]
    if silence is not None and silence <= hb:
        raise ConfigError(
            f"link.silence_timeout_s: must be greater than link.heartbeat_interval_s ({hb})")
    if v["link.backoff.cap_s"] < v["link.backoff.base_s"]:
        raise ConfigError("link.backoff.cap_s: must be >= link.backoff.base_s")
    if v["link.backoff.jitter"] not in JITTER_MODES:
        raise ConfigError(f"link.backoff.jitter: must be one of {', '.join(JITTER_MODES)}")
    from .commands.core import COMMANDS
    unknown = [c for c in v["commands.allow"] if c not in COMMANDS]
    if unknown:
        raise ConfigError(f"commands.allow: unknown command {unknown[0]!r} (one of "
                          f"{', '.join(sorted(COMMANDS))})")
    _positive(v, "commands.timeout_s")
    if v["log.level"] not in LOG_LEVELS:
        raise ConfigError(f"log.level: must be one of {', '.join(LOG_LEVELS)}")

    runtime_dir = v["runtime.dir"] or env.get("RUNTIME_DIRECTORY") or "/run/edge-agent"
    return Config(
        server_url=url.rstrip("/"),
        ca_file=v["server.ca_file"],
        profile=v["server.profile"],
        connect_timeout_s=v["server.connect_timeout_s"],
        device_id=v["identity.device_id"],
        token=token,
        state_dir=v["identity.state_dir"],
        runtime_dir=runtime_dir.split(":")[0],
        liveness=LivenessPolicy(
            heartbeat_interval_s=hb, ack_timeout_s=ack, missed_acks=v["link.missed_acks"],
            silence_timeout_s=silence),
        backoff=BackoffPolicy(base_s=v["link.backoff.base_s"], cap_s=v["link.backoff.cap_s"],
                              jitter=v["link.backoff.jitter"]),
        keepalive=KeepalivePolicy(
            idle_s=v["link.keepalive.idle_s"], interval_s=v["link.keepalive.interval_s"],
            count=v["link.keepalive.count"], user_timeout_s=v["link.keepalive.user_timeout_s"]),
        stable_after_s=v["link.stable_after_s"],
        wake_min_interval_s=v["link.wake_min_interval_s"],
        log_level=v["log.level"],
        uploads=UploadPolicy(base_s=v["uploads.base_s"], cap_s=v["uploads.cap_s"],
                             max_items=v["uploads.max_items"], max_bytes=v["uploads.max_bytes"],
                             max_age_days=v["uploads.max_age_days"],
                             dedupe_window_s=v["uploads.dedupe_window_s"]),
        show_code_on_console=v["identity.show_code_on_console"],
        events_enabled=v["events.enabled"],
        events_settle_s=v["events.settle_s"],
        events_fallback_interval_s=v["events.fallback_interval_s"],
        events_udev_source=v["events.udev_source"],
        telemetry_every_s=v["events.telemetry_every_s"],
        watchdog_require_link=v["watchdog.require_link"],
        commands_allow=frozenset(v["commands.allow"]),
        screenshot_command=v["commands.screenshot_command"],
        display_on_command=v["commands.display_on_command"],
        display_off_command=v["commands.display_off_command"],
        command_timeout_s=v["commands.timeout_s"],
        debug_stall_link_after_s=v["debug.stall_link_after_s"],
        debug_sysfs_root=v["debug.sysfs_root"],
        source=path,
    )
