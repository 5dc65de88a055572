"""Configuration: the operator's TOML file over the package's defaults, environment
overrides, validated before anything starts.

The layers, lowest first: the defaults in SCHEMA; the package's file
(``/usr/lib/edge-agent/agent.toml``, replaced by every upgrade, never edited); the
operator's file (``/etc/edge-agent/agent.toml``, which no upgrade touches); the fleet's
settings; the environment. Every problem is reported as one line naming the key
(``link.ack_timeout_s: ...``); the CLI turns a ConfigError into exit code 2, never a
traceback.

Environment overrides are ``EDGE_AGENT_<SECTION>_<KEY>`` with dots as underscores,
e.g. ``EDGE_AGENT_LINK_BACKOFF_BASE_S=2`` for ``[link.backoff] base_s``. A list there
is its items separated by commas (``reboot,logs``) or a JSON list (``["reboot","logs"]``);
anything else that looks like a list is refused with that syntax.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import time
from typing import Any
from urllib.parse import urlparse

from ..base.boot import boot_id
from ..base.egress import Egress, EgressError, no_proxy_from_env, parse_no_proxy, parse_proxy, proxy_from_env
from ..base.identifiers import DEVICE_ID_RULE, TOKEN_RULE, usable_device_id, usable_token
from ..base.vocabulary import COMMAND_NAMES, OPERATOR_ONLY_COMMANDS
from . import overlay as fleet_store, revision as fleet_rules
from .model import POLICIES, SECTIONS, Config
from .week import Schedule, ScheduleError
from .schema import REQUIRED, SCHEMA, ConfigError, ConfigMissing, Key, Range, _shown, shown_number
from .files import DEFAULT_PATH, ENV_PREFIX, VENDOR_PATH, env_name, read_toml as _read_toml, runtime_dir


# where a value came from, as check-config and the docs say it
ORIGINS = {"default": "built-in default", "package": f"the package's defaults ({VENDOR_PATH})",
           "file": "this screen's file", "fleet": "the fleet's settings",
           "env": "the environment"}


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
        items = _env_list(name, value) if from_env else value
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
        try:
            return float(value)
        except OverflowError:   # TOML's integers have no bound; a float does
            raise ConfigError(f"{name}: must be a finite number, got {shown_number(value)}") \
                from None
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected a {typ.__name__}, got {type(value).__name__}")
    return value


# An example of each list key's items, for the one line that says how a list is written
_LIST_EXAMPLES = {"commands.allow": ("reboot", "logs"),
                  "hours.week": ("mon-fri 08:00-18:00", "sat 10:00-14:00"),
                  "hours.exceptions": ("2026-12-25 off", "2026-12-24 08:00-12:00")}
# No item of any list has these: a value with one is a list in another syntax (TOML's
# quotes, a bracket left over), which splitting at commas would turn into odd items
_NOT_IN_AN_ITEM = re.compile(r"[\[\]\"']")
# what a refusal repeats of the value (an environment variable may hold 128 KiB)
MAX_SHOWN = 120


def _env_list(name: str, value: str) -> list:
    """A list from the environment: its items separated by commas, or a JSON list of
    strings (unambiguous: no item starts with "["). Anything else that looks like a
    list is refused with the syntax, never split into items nobody wrote."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):   # nested past the parser's depth
            items = None
        if isinstance(items, list) and all(isinstance(x, str) for x in items):
            return [x.strip() for x in items if x.strip()]
    else:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not any(_NOT_IN_AN_ITEM.search(x) for x in items):
            return items
    first, second = _LIST_EXAMPLES.get(name.partition(" ")[0], ("first", "second"))
    raise ConfigError(f"{name}: a list is written {first},{second} (items separated by "
                      f"commas) or as a JSON list {json.dumps([first, second])}, got "
                      f"{value[:MAX_SHOWN]!r}{'...' if len(value) > MAX_SHOWN else ''}")


def _package_defaults(vendor: str | None) -> dict[str, dict]:
    """The package's file, by schema section; none where it is absent (a checkout).
    Its keys obey the same rules as the operator's; a problem names the file."""
    if vendor is None or not os.path.exists(vendor):
        return {}
    doc = _read_toml(vendor)
    try:
        sections = _flatten(doc, "", {})
    except ConfigError as e:
        raise ConfigError(f"{e} (in {vendor})") from None
    for section, given in sections.items():
        for key, value in given.items():
            spec = SCHEMA[section].get(key)
            if spec is None:
                raise ConfigError(f"{section}.{key}: unknown key (in {vendor})")
            name = f"{section}.{key} (in {vendor})"
            given[key] = _coerce(name, spec.type, value, False)
            _check_rule(name, spec, given[key])   # bounded even where the operator's wins
    return sections


def load(path: str | None = None, env: dict[str, str] | None = None,
         fleet: dict | None = None, vendor: str | None = VENDOR_PATH) -> Config:
    """The operator's file over the package's (``vendor``), the environment over
    both, and the fleet's settings between them: the overlay in the state directory,
    or ``fleet`` (a revision's values) to try one, when a bad value is this function's
    ConfigError. A bad overlay on disk is not: the file alone runs, and
    ``fleet_problem`` says why."""
    env = os.environ if env is None else env
    path = path or DEFAULT_PATH
    doc: dict = _read_toml(path) if path != "-" else {}
    sections = _flatten(doc, "", {})
    packaged = _package_defaults(vendor)

    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for section, keys in SCHEMA.items():
        given = sections.get(section, {})
        for key in given:
            if key not in keys:
                raise ConfigError(f"{section}.{key}: unknown key")
        for key, spec in keys.items():
            name = f"{section}.{key}"
            ename = env_name(section, key)
            default = packaged.get(section, {}).get(key, spec.default)
            if ename in env:
                values[name] = _coerce(f"{name} (from {ename})", spec.type, env[ename], True)
                origins[name] = "env"
            elif key in given:
                values[name] = _coerce(name, spec.type, given[key], False)
                origins[name] = "file"
            elif default is REQUIRED:
                raise ConfigMissing(name, f"{name}: required (set it in {path} or {ename})")
            else:
                values[name] = default
                origins[name] = "package" if key in packaged.get(section, {}) else "default"
    _check_overrides(env)
    adjusted = _adjust(values, origins)
    if fleet is not None:
        return _validate(*_with_fleet(values, origins, fleet), env, path, adjusted=adjusted)
    overlay, problem = fleet_store.read(values["identity.state_dir"])
    if overlay.current is not None:
        live, _ = fleet_rules.live(overlay.current.values, overlay.current.until, boot_id(),
                                   time.monotonic())
        try:
            return _validate(*_with_fleet(values, origins, live), env, path,
                             overlay.current.revision, adjusted=adjusted)
        except ConfigError as e:   # the file changed under it, or the file was tampered with
            problem = f"fleet revision {overlay.current.revision} not applied: {e}"
    return _validate(values, origins, env, path, problem=problem, adjusted=adjusted)


# -- what an earlier release accepted ------------------------------------------------------
# 0.1.0 took any positive number where today's rules have bounds: a file it accepted
# must start this release (an apt upgrade must not leave a screen dark until someone
# edits it). Such a number, from the operator's file or the environment, is taken at the
# nearest bound, and said (the journal, status, the server's config.adjusted); a value
# no release accepted (negative, not a number) is still an error. The fleet's values
# are never adjusted: a revision is tried as sent, or refused.
ADJUSTABLE_ORIGINS = ("file", "env")
# the keys 0.1.0 bounded by their sign alone, and whether it took 0 (its schema is kept
# in tests/data/config-0.1.0.json, which tests/test_config.py holds this list to)
EARLIER_SIGN_ONLY = {
    **dict.fromkeys(("server.connect_timeout_s", "link.heartbeat_interval_s",
                     "link.ack_timeout_s", "link.missed_acks", "link.silence_timeout_s",
                     "link.stable_after_s", "link.backoff.base_s", "link.backoff.cap_s",
                     "link.keepalive.idle_s", "link.keepalive.interval_s", "link.keepalive.count",
                     "link.keepalive.user_timeout_s", "uploads.base_s", "uploads.cap_s",
                     "uploads.max_items", "uploads.max_bytes", "uploads.max_age_days",
                     "events.settle_s", "events.fallback_interval_s",
                     "events.telemetry_every_s", "commands.timeout_s"), "> 0"),
    **dict.fromkeys(("link.wake_min_interval_s", "uploads.dedupe_window_s",
                     "debug.stall_link_after_s"), ">= 0")}
# pairs whose order an adjustment may upset: (the lower, the higher), and what the
# higher becomes then
_ORDERED = (("uploads.base_s", "uploads.cap_s"), ("link.backoff.base_s", "link.backoff.cap_s"))


def adjustment_text(key: str, given, used) -> str:
    """One adjusted value, as the journal, status, check-config and the server say it."""
    if used is None:
        return f"{key} = {shown_number(given)} no longer fits the heartbeat's: using its default"
    way = "over" if used < given else "under"
    return f"{key} = {shown_number(given)} is {way} what this release takes: using {used:g}"


def _adjust(values: dict, origins: dict) -> tuple:
    """Numbers out of bounds that an earlier release took, moved to the nearest bound in
    ``values``; returns ((key, given, used), ...)."""
    adjusted = []
    for section, keys in SCHEMA.items():
        for key, spec in keys.items():
            name = f"{section}.{key}"
            v, earlier = values[name], EARLIER_SIGN_ONLY.get(name)
            if earlier is None or origins.get(name) not in ADJUSTABLE_ORIGINS \
                    or not isinstance(spec.rule, Range) or isinstance(v, bool) \
                    or not isinstance(v, (int, float)) \
                    or isinstance(v, float) and not math.isfinite(v) \
                    or v < 0 or (v == 0 and earlier == "> 0"):
                continue
            used = min(max(v, spec.rule.lo), spec.rule.hi)
            if used != v:
                values[name] = spec.type(used)
                adjusted.append((name, v, values[name]))
    if not adjusted:
        return ()
    moved = {name for name, _, _ in adjusted}
    for lower, higher in _ORDERED:
        if values[higher] < values[lower] and moved & {lower, higher}:
            adjusted.append((higher, values[higher], values[lower]))
            values[higher] = values[lower]
    hb, ack = values["link.heartbeat_interval_s"], values["link.ack_timeout_s"]
    if ack >= hb and moved & {"link.heartbeat_interval_s", "link.ack_timeout_s"}:
        values["link.ack_timeout_s"] = max(SCHEMA["link"]["ack_timeout_s"].rule.lo, hb / 3)
        adjusted.append(("link.ack_timeout_s", ack, values["link.ack_timeout_s"]))
    silence = values["link.silence_timeout_s"]
    if silence is not None and silence <= hb \
            and moved & {"link.heartbeat_interval_s", "link.silence_timeout_s"}:
        values["link.silence_timeout_s"] = None   # its default: derived from the heartbeat
        adjusted.append(("link.silence_timeout_s", silence, None))
    return tuple(adjusted)


# keys the fleet may set only where the file (or the environment) turns this on
FLEET_GATES = {"commands.allow": "fleet.manage_commands_allow",
               "server.url": "fleet.manage_server_url"}


def _with_fleet(values: dict, origins: dict, fleet: dict) -> tuple[dict, dict]:
    """The values with the fleet's over the file's; the environment's stay (an operator
    on the device overrides the fleet). Each key by its own rule, as from the file."""
    values, origins = dict(values), dict(origins)
    for name, value in sorted(fleet.items()):
        section, _, key = name.rpartition(".")
        spec = SCHEMA.get(section, {}).get(key)
        if spec is None:
            raise ConfigError(f"{name}: unknown key")
        gate = FLEET_GATES.get(name)
        if not spec.fleet or (gate is not None and not values[gate]):
            raise ConfigError(f"{name}: not set from the fleet on this device"
                              + (f" ([fleet] {gate.split('.')[1]} is off)" if gate else ""))
        coerced = _coerce(f"{name} (from the fleet)", spec.type, value, False)
        _check_rule(f"{name} (from the fleet)", spec, coerced)
        if name == "commands.allow":
            added = sorted(set(coerced) & OPERATOR_ONLY_COMMANDS - set(values[name]))
            if added:
                raise ConfigError(f"commands.allow (from the fleet): {added[0]} is allowed only "
                                  "by the screen's own file")
        if origins[name] != "env":
            values[name], origins[name] = coerced, "fleet"
    return values, origins


def _check_overrides(env) -> None:
    """An EDGE_AGENT_ variable that names a section but no key of it is a typo and
    fatal, as is one a letter or two away from a real override; any other (the
    project's tools use EDGE_AGENT_PYTHON and the like) is not configuration and is
    left alone."""
    known = {env_name(s, k)[len(ENV_PREFIX):]: (s, k) for s, ks in SCHEMA.items() for k in ks}
    sections = sorted({env_name(s, "")[len(ENV_PREFIX):] for s in SCHEMA}, key=len, reverse=True)
    for ename in env:
        rest = ename[len(ENV_PREFIX):]
        if not ename.startswith(ENV_PREFIX) or rest in known:
            continue
        import difflib   # here: only a mistyped override pays for it, not every start
        near = difflib.get_close_matches(rest, known, n=1, cutoff=0.8)
        if near:
            raise ConfigError(f"{ename}: unknown environment override "
                              f"(did you mean {ENV_PREFIX}{near[0]}?)")
        if any(rest.startswith(s) for s in sections):
            raise ConfigError(f"{ename}: unknown environment override")


def _check_rule(name: str, spec: Key, v: Any) -> None:
    if v is None or spec.rule is None:
        return
    if isinstance(spec.rule, tuple):
        if v not in spec.rule:
            raise ConfigError(f"{name}: must be one of {', '.join(spec.rule)}")
        return
    spec.rule.check(name, v)


# A host name as DNS has it (an internationalised one in its xn-- form); urlparse alone
# lets "fleet example.com" and control characters through to the resolver.
_HOST = re.compile(r"(?!-)[a-z0-9-]{1,63}(?:\.(?!-)[a-z0-9-]{1,63})*\.?")
_URL_CHARS = re.compile(r"[!-~]{1,2048}")   # printable ASCII, no space


def _check_url(url: str) -> None:
    if not _URL_CHARS.fullmatch(url):
        raise ConfigError(f"server.url: must be up to 2048 printable ASCII characters without "
                          f"spaces (percent-encode the rest), got {_shown(url)}")
    try:
        parsed = urlparse(url)   # Python >= 3.11.4 checks a bracketed host itself
    except ValueError as e:
        raise ConfigError(f"server.url: {e}") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"server.url: must be an http:// or https:// URL, got {url!r}")
    host = parsed.hostname   # lowercased, an IPv6 literal without its brackets
    try:
        if ":" in host:
            import ipaddress   # here: most servers are named, and a start is short
            ipaddress.IPv6Address(host)
        elif not _HOST.fullmatch(host):
            raise ValueError(host)
    except ValueError:
        raise ConfigError(f"server.url: {host!r} is not a host name or IP address") from None
    try:
        parsed.port
    except ValueError:
        raise ConfigError(f"server.url: bad port in {url!r}") from None


def _check_command(name: str, command: str | None) -> None:
    if command is None:
        return
    try:
        words = shlex.split(command)
    except ValueError as e:
        raise ConfigError(f"{name}: cannot be split into words ({e})") from None
    if not words:
        raise ConfigError(f"{name}: is empty")


def _validate(v: dict, origins: dict, env: dict, path: str, revision: int | None = None,
              problem: str | None = None, adjusted: tuple = ()) -> Config:
    for section, keys in SCHEMA.items():
        for key, spec in keys.items():
            _check_rule(f"{section}.{key}", spec, v[f"{section}.{key}"])
    _check_url(v["server.url"])
    for key in ("commands.screenshot_command", "commands.display_on_command",
                "commands.display_off_command", "screen.capture_command"):
        _check_command(key, v[key])
    for key in ("server.ca_file", "network.client_cert", "network.client_key"):
        if v[key] is not None and not os.path.isfile(v[key]):
            raise ConfigError(f"{key}: no such file: {v[key]}")
    if v["server.ca_file"] is not None:
        ca_certificates(v["server.ca_file"])
    _check_client_key(v["network.client_cert"], v["network.client_key"])
    if v["identity.device_id"] is not None and not usable_device_id(v["identity.device_id"]):
        raise ConfigError(f"identity.device_id: {DEVICE_ID_RULE}")
    token = v["identity.token"]
    if token is not None and not usable_token(token):
        raise ConfigError(f"identity.token: {TOKEN_RULE}")
    if token is not None and v["identity.device_id"] is None:
        raise ConfigError("identity.token: a pre-provisioned token needs identity.device_id too")
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
    _check_hours(v)
    unknown = [c for c in v["commands.allow"] if c not in COMMAND_NAMES]
    if unknown:
        raise ConfigError(f"commands.allow: unknown command {unknown[0]!r} (one of "
                          f"{', '.join(sorted(COMMAND_NAMES))})")
    return _build(v, env, path, origins=origins, fleet_revision=revision, fleet_problem=problem,
                  adjusted=tuple(a for a in adjusted if origins.get(a[0]) != "fleet"))


def _check_hours(v: dict) -> None:
    try:
        Schedule.parse(v["hours.week"], v["hours.exceptions"])
    except ScheduleError as e:
        raise ConfigError(str(e)) from None
    zone = v["hours.timezone"]
    if zone is not None:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError   # only with a zone set
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigError(f"hours.timezone: no such time zone here: {zone!r}") from None
    if v["hours.exceptions"] and not v["hours.week"]:
        raise ConfigError("hours.exceptions: needs hours.week (without a week there are no "
                          "working hours to make exceptions to)")
    if v["hours.week"] and not (v["commands.display_on_command"]
                                and v["commands.display_off_command"]):
        raise ConfigError("hours.week: needs [commands] display_on_command and "
                          "display_off_command (recipes: docs/operate.md, \"Working hours\")")


def ca_certificates(path: str) -> int:
    """How many CA certificates ``server.ca_file`` holds, read as the agent reads it
    (PEM, by OpenSSL); anything else is this key's ConfigError. The file replaces the
    system's store for every TLS connection the agent makes (egress.Egress)."""
    import ssl   # here: only a configured CA file is read with it
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cafile=path)
    except PermissionError:
        raise ConfigError(f"server.ca_file: permission denied: {path}") from None
    except ssl.SSLError as e:
        raise ConfigError(f"server.ca_file: not PEM certificates: {path} "
                          f"({e.reason or 'a certificate OpenSSL cannot decode'})") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"server.ca_file: cannot be read: {path} "
                          f"({getattr(e, 'strerror', None) or e})") from None
    count = ctx.cert_store_stats()["x509"]
    if not count:
        raise ConfigError(f"server.ca_file: no certificate in {path}")
    return count


def _check_client_key(cert: str | None, key: str | None) -> None:
    if key is None:
        return
    if cert is None:
        raise ConfigError("network.client_key: needs network.client_cert")
    mode = os.stat(key).st_mode
    if mode & 0o007:
        raise ConfigError(f"network.client_key: readable by every user (mode {mode & 0o777:o}); "
                          f"a private key is 0600 or 0640")


def _egress(fields: dict, server_url: str, env: dict) -> Egress:
    """The way out: [network] first, the environment's proxy variables where unset."""
    proxy, no_proxy = fields.pop("proxy"), fields.pop("no_proxy")
    try:
        if no_proxy is not None:
            bypass = parse_no_proxy(no_proxy, "network.no_proxy")
        else:   # the list goes with the proxy: a configured one is not bent by the environment
            bypass = () if proxy is not None else no_proxy_from_env(env)
        egress = Egress(
            proxy=(parse_proxy(proxy, "network.proxy") if proxy is not None
                   else proxy_from_env(env, urlparse(server_url).scheme)),
            no_proxy=bypass, **fields)
    except EgressError as e:
        raise ConfigError(str(e)) from None
    if egress.client_cert:
        try:
            egress.ssl_context()
        except (OSError, ValueError) as e:    # ssl.SSLError is an OSError
            raise ConfigError(f"network.client_cert: cannot be loaded with its key "
                              f"({getattr(e, 'reason', None) or e})") from None
    return egress


def _build(v: dict, env: dict, path: str, **about) -> Config:
    """Config from the validated values, each where the schema's ``into`` says
    ("link.liveness.ack_timeout_s" is Config.link.liveness.ack_timeout_s)."""
    fields: dict[str, dict[str, Any]] = {name: {} for name in (*SECTIONS, *POLICIES,
                                                                "server.egress")}
    for section, keys in SCHEMA.items():
        for key, spec in keys.items():
            owner, _, attr = spec.into.rpartition(".")
            fields[owner][attr] = v[f"{section}.{key}"]
    server = fields["server"]
    server["url"] = server["url"].rstrip("/")
    server["egress"] = _egress(fields["server.egress"], server["url"], env)
    fields["runtime"]["dir"] = runtime_dir(fields["runtime"]["dir"], env)
    fields["commands"]["allow"] = frozenset(fields["commands"]["allow"])
    fields["hours"]["week"] = tuple(fields["hours"]["week"])
    fields["hours"]["exceptions"] = tuple(fields["hours"]["exceptions"])
    for name, cls in POLICIES.items():
        section, _, attr = name.partition(".")
        fields[section][attr] = cls(**fields[name])
    sections = {name: cls(**fields[name]) for name, cls in SECTIONS.items()}
    return Config(**sections, source=path, **about)
