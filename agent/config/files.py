"""Where the configuration is and how its files are read: the paths, the environment's
names, the TOML reader and its errors, and where the running agent keeps its runtime
files. Light (os, tomllib and the status file's name): `edge-agent status`, run by every operator and every
monitoring script, finds the status file from here without the schema, the sections'
records or their validation (load.py), which it does not need to read a file."""
from __future__ import annotations

import os
import re
import tomllib

from ..base import status_file

DEFAULT_PATH = "/etc/edge-agent/agent.toml"
# the package's defaults, under whichever file the operator's is: the systemd layout
# (vendor files in /usr/lib, the administrator's of the same name in /etc over them)
VENDOR_PATH = "/usr/lib/edge-agent/agent.toml"
ENV_PREFIX = "EDGE_AGENT_"
RUNTIME_DEFAULT = "/run/edge-agent"


class ConfigError(Exception):
    """A one-line, user-facing description of what is wrong and where."""


class ConfigMissing(ConfigError):
    """A required key is not set anywhere: the device is not configured yet."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def env_name(section: str, key: str) -> str:
    return ENV_PREFIX + (section.replace(".", "_") + "_" + key).upper()


def read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
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


def runtime_dir(configured: str | None, env) -> str:
    """``[runtime] dir``, else the directory systemd made for the unit
    (``RUNTIME_DIRECTORY``, its first), else /run/edge-agent."""
    return (configured or env.get("RUNTIME_DIRECTORY") or RUNTIME_DEFAULT).split(":")[0]


# An absolute path: no control characters, no empty components (one reading of a
# segment each, so a long bad value cannot make the match backtrack). The schema's
# ABS_PATH is this rule; it lives here so that `status` has it without the schema.
ABS_PATH = re.compile(r"(?:/[^\x00-\x1f\x7f/]+)+/?|/")
ABS_PATH_MAX = 1024


def usable_dir(value) -> bool:
    """What the schema's ABS_PATH takes (the rule above), without loading the schema.
    Anything else the agent refuses to start with: status then reads where the agent's
    own default would be."""
    return (isinstance(value, str) and len(value) <= ABS_PATH_MAX
            and ABS_PATH.fullmatch(value) is not None)


def status_path(path: str | None = None, env=None, vendor: str | None = VENDOR_PATH) -> str:
    """The running agent's status file: ``[runtime] dir`` taken from the layers load()
    takes it from, in its order (the environment, the operator's file, the package's),
    and nothing else read or checked. A layer that cannot be read is passed over: an
    operator may not read the agent's file, and status must still answer. A value the
    agent refuses leaves it unstarted, and status then says so whichever file it reads.
    (tests/test_status_cli.py holds this to load()'s ``status_path``.)"""
    env = os.environ if env is None else env
    configured = env.get(env_name("runtime", "dir"))
    if configured is not None and not usable_dir(configured):
        configured = ""   # the environment's value wins and is refused: the default
    for layer in (path or DEFAULT_PATH, vendor):
        if configured is not None:
            break
        if layer is None or layer == "-":   # "-": no operator's file, as load() takes it
            continue
        try:
            table = read_toml(layer).get("runtime")
        except ConfigError:
            continue
        if isinstance(table, dict) and "dir" in table:
            configured = table["dir"] if usable_dir(table["dir"]) else ""
    return os.path.join(runtime_dir(configured, env), status_file.NAME)
