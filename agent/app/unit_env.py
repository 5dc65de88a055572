"""The environment systemd gives the agent, as `check-config` and `doctor` must see it
(operator #50.2): a proxy set as ``Environment=https_proxy=...`` in a drop-in, or in an
``EnvironmentFile=``, is in force for the agent and in no shell an operator runs these
from.

Read from the service manager itself: ``systemctl show UNIT -p Environment -p
EnvironmentFiles ...`` (works with the unit stopped; drop-ins already merged), then each
environment file parsed by systemd's own rules (systemd.exec(5): the files override
``Environment=``, later files the earlier; quotes, backslashes, ``#``/``;`` comments,
continued lines), over the manager's own environment (``systemctl
show-environment``). Only the variables the agent reads are kept: ``EDGE_AGENT_*``
(config/load.py), the proxy ones and the CA's (base/egress.py, OpenSSL's), the
display's. Outside systemd, or without systemctl, or without the unit, nothing is read
and ``problem`` says why: the callers then say the shell's environment stands in.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field

from ..base import children
from ..base.egress import NO_PROXY_ENV, PROXY_ENV
from ..base.fsutil import UnsafePath, read_bounded, read_following_roots_links
from ..config.load import ENV_PREFIX

UNIT = "edge-agent.service"
SHOW_TIMEOUT_S = 5.0
MAX_SHOW_BYTES = 256 * 1024
MAX_FILE_BYTES = 256 * 1024
PROPERTIES = ("LoadState", "Environment", "EnvironmentFiles", "FragmentPath", "DropInPaths")
# what the agent reads of its environment, beside EDGE_AGENT_*
READS = frozenset({*(n for names in PROXY_ENV.values() for n in names), *NO_PROXY_ENV,
                   "SSL_CERT_FILE", "SSL_CERT_DIR",             # OpenSSL's CA, no ca_file set
                   "DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR"})   # the screen's
MANAGER = "the service manager's environment (systemctl show-environment)"


def agent_reads(name: str) -> bool:
    return name.startswith(ENV_PREFIX) or name in READS


@dataclass
class UnitEnvironment:
    values: dict[str, str] = field(default_factory=dict)    # the agent's variables only
    origins: dict[str, str] = field(default_factory=dict)   # each one's file, in words
    problem: str | None = None      # why the unit was not read (then values is empty)
    notes: list[str] = field(default_factory=list)           # a file not read, and why

    def over(self, environ) -> dict:
        """``environ`` (this shell's) as the agent would have it: its own variables the
        unit's, not the shell's; unchanged when the unit could not be read."""
        if self.problem:
            return dict(environ)
        return {**{k: v for k, v in environ.items() if not agent_reads(k)}, **self.values}

    def origin(self, name: str) -> str:
        return self.origins.get(name) or ("this shell's environment" if self.problem
                                          else "the environment")

    def said(self) -> str:
        """One line for a person: where the agent's environment was read from."""
        if self.problem:
            return f"the unit's environment not read ({self.problem}): this shell's is used"
        if not self.values:
            return f"{UNIT} sets none of the variables the agent reads"
        return f"{UNIT}'s environment: " + ", ".join(
            f"{name} from {self.origins[name]}" for name in sorted(self.values))


# -- the pure parts ---------------------------------------------------------------------
def parse_show(text: str) -> dict:
    """``systemctl show``'s ``Name=value`` lines; EnvironmentFiles is one line a file,
    ``PATH (ignore_errors=yes)``, kept as a list of (path, ignore)."""
    props: dict = {"EnvironmentFiles": []}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if not eq:
            continue
        if name == "EnvironmentFiles":
            path, _, flag = value.rpartition(" (ignore_errors=")
            props[name].append((path or value, flag.startswith("yes")))
        elif name in PROPERTIES:
            props[name] = value
    return props


def parse_assignments(value: str) -> list[tuple[str, str]]:
    """``Environment=``'s value as systemctl shows it (each assignment shell-quoted when
    it needs to be), or as a unit file's line has it: [(name, value)]."""
    try:
        words = shlex.split(value, comments=False, posix=True)
    except ValueError:   # an unbalanced quote: nothing systemd would have kept
        return []
    return [(w.split("=", 1)[0], w.split("=", 1)[1]) for w in words if "=" in w[1:]]


def parse_env_file(text: str) -> list[tuple[str, str]]:
    """An EnvironmentFile's assignments, by systemd's rules (src/basic/env-file.c):
    leading blanks skipped; a line starting with # or ; a comment; KEY=VALUE, blanks
    around the key and an unquoted value's trailing ones dropped; '...' taken as it is;
    "..." with \\ escaping only \\ " ` $ (other backslashes kept); an unquoted \\ escapes
    the next character; a backslash before a newline continues the line."""
    pairs: list[tuple[str, str]] = []
    state, key, value, trail = "pre_key", "", "", None
    comments, blanks, newlines, escapable = "#;", " \t\n\r", "\n\r", "\"\\`$"

    def push():
        name = key.rstrip(" \t")
        kept = value[:trail] if state == "value" and trail is not None else value
        if name:
            pairs.append((name, kept))

    for c in text:
        if state == "pre_key":
            if c in comments:
                state = "comment"
            elif c not in blanks:
                state, key = "key", c
        elif state == "key":
            if c in newlines:
                state, key = "pre_key", ""
            elif c == "=":
                state, value, trail = "pre_value", "", None
            else:
                key += c
        elif state in ("pre_value", "value"):
            if c in newlines:
                push()
                state, key, value, trail = "pre_key", "", "", None
            elif state == "pre_value" and c == "'":
                state = "single"
            elif state == "pre_value" and c == '"':
                state = "double"
            elif c == "\\":
                state, trail = "escape", None
            elif state == "pre_value" and c in blanks:
                pass
            else:
                if c in " \t":
                    trail = len(value) if trail is None else trail
                else:
                    trail = None
                state, value = "value", value + c
        elif state == "escape":
            state = "value"
            if c not in newlines:
                value += c
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                value += c
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value += c
        elif state == "double_escape":
            state = "double"
            if c in escapable:
                value += c
            elif c != "\n":
                value += "\\" + c
        elif state == "comment":
            if c in newlines:
                state = "pre_key"
    if state in ("pre_value", "value", "escape", "single", "double", "double_escape"):
        push()
    return pairs


def setter(name: str, unit_files: list[tuple[str, str]]) -> str | None:
    """Which of the unit's files (its fragment, then its drop-ins, in systemd's order)
    sets ``name`` with ``Environment=`` last; None if none can be told."""
    found = None
    for path, text in unit_files:
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("Environment="):
                if any(k == name for k, _ in parse_assignments(line[len("Environment="):])):
                    found = path
    return found


# -- the shell: systemctl, the files ---------------------------------------------------
def _systemctl(args: list[str]) -> tuple[str | None, str]:
    argv = ["systemctl", *args]
    try:
        child = children.spawn(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                          "LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        out, err = children.finish(child, SHOW_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"systemctl did not answer in {SHOW_TIMEOUT_S:g} s"
    except OSError as e:
        return None, "no systemctl here" if isinstance(e, FileNotFoundError) else \
            children.failure(argv, error=e)
    if child.returncode != 0:
        first = err.decode("utf-8", "replace").strip().splitlines()[:1]
        return None, (first[0][:200] if first else f"systemctl exited {child.returncode}")
    return out[:MAX_SHOW_BYTES].decode("utf-8", "replace"), ""


def _read_text(path: str) -> tuple[str | None, str]:
    """A unit's file or an EnvironmentFile, as systemd reads it (links followed), except
    that as root a link the agent's user (or anyone else) could have planted is not:
    `doctor` runs as root and prints what it read."""
    try:
        if os.geteuid() == 0:
            raw = read_following_roots_links(path, MAX_FILE_BYTES)
        else:
            raw = read_bounded(path, MAX_FILE_BYTES, follow_links=True)
        return raw.decode("utf-8", "replace"), ""
    except UnsafePath as e:
        return None, str(e).partition(": ")[2] or str(e)
    except FileNotFoundError:
        return None, "no such file"
    except OSError as e:
        return None, e.strerror or type(e).__name__
    except ValueError:
        return None, f"over {MAX_FILE_BYTES} bytes"


def read(unit: str = UNIT) -> UnitEnvironment:
    """What ``unit`` passes the agent, and where each value comes from."""
    if not os.path.isdir("/run/systemd/system"):
        return UnitEnvironment(problem="not booted with systemd")
    shown, why = _systemctl(["show", unit, *(f"--property={p}" for p in PROPERTIES)])
    if shown is None:
        return UnitEnvironment(problem=why)
    props = parse_show(shown)
    if props.get("LoadState") != "loaded":
        return UnitEnvironment(problem=f"{unit} is {props.get('LoadState') or 'unknown'} "
                                       f"here")
    env = UnitEnvironment()
    manager, _ = _systemctl(["show-environment"])
    for line in (manager or "").splitlines():
        for name, value in parse_assignments(line):
            if agent_reads(name):
                env.values[name], env.origins[name] = value, MANAGER
    files = [p for p in (props.get("FragmentPath", ""), *props.get("DropInPaths", "").split())
             if p]
    unit_files = [(p, t) for p, t in ((p, _read_text(p)[0]) for p in files) if t is not None]
    for name, value in parse_assignments(props.get("Environment", "")):
        if agent_reads(name):
            where = setter(name, unit_files)
            env.values[name] = value
            env.origins[name] = f"Environment= in {where}" if where else "the unit's Environment="
    for path, ignore in props["EnvironmentFiles"]:
        text, why = _read_text(path)
        if text is None:
            if not ignore or why != "no such file":
                env.notes.append(f"EnvironmentFile {path}: not read ({why})")
            continue
        for name, value in parse_env_file(text):
            if agent_reads(name):
                env.values[name], env.origins[name] = value, f"EnvironmentFile {path}"
    return env
