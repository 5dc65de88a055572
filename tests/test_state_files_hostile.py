"""Every state file the agent reads at start goes through one loader (base/fsutil.py:
``read_json``, ``loads``): a bounded size, numbers bounded before any arithmetic (a
400-digit integer, 1e999, NaN are refused as they are parsed), and any failure to parse
is "damaged": the file's safe default, said in one line, never an exception out of the
reader and never an agent that cannot start.

Before: a 400-digit ``wall`` in ``screen-reboots.json`` (the agent's user writes it, so
a fleet ``shell`` line can) raised OverflowError at every start: exit 70, for ever."""
from __future__ import annotations

import logging
import os

import pytest

from devtools.harness import agent_config, wait_for

HUGE = "9" * 400


def _started_on_damage(fleet, spawn_agent, agent_python, tmp_path) -> str:
    """A real agent started on the state directory as the test left it: alive, its link
    proven, the damaged reboot count said in one line. Its log."""
    server = fleet()
    cfg = agent_config(server, tmp_path, screen={"recovery": True},
                       commands={"allow": ["diagnostics", "logs", "reboot"]})
    agent = spawn_agent(agent_python, cfg)
    wait_for(lambda: agent.link().get("proven_live") or not agent.alive(), 15,
             what="the agent online or gone")
    assert agent.alive(), agent.log_text()[-3000:]
    log = agent.log_text()
    assert "Traceback" not in log and "crashed" not in log, log[-3000:]
    said = [line for line in log.splitlines() if "screen-reboots.json" in line]
    assert len(said) == 1 and "count as spent" in said[0], said
    return log


@pytest.mark.netns
def test_a_400_digit_reboot_count_is_a_damaged_file_at_a_real_start(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "screen-reboots.json").write_text(
        '{"reboots": [{"wall": %s, "synced": true, "boot": "b"}]}' % HUGE)
    _started_on_damage(fleet, spawn_agent, agent_python, tmp_path)


@pytest.mark.netns
@pytest.mark.parametrize("kind", ["400 digits", "a list", "invalid UTF-8", "fifo"])
def test_every_state_file_damaged_at_once_is_a_real_start_online(
        netns, fleet, spawn_agent, agent_python, tmp_path, kind):
    """The reboot count, the learnt idle limits, the fleet's overlay, the command ledger
    and the reconnect schedule all damaged: the agent starts, proves its link, and
    names each file it could not use in one line."""
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    run.mkdir()
    for path in (state / "screen-reboots.json", state / "idle-limits.json",
                 state / "fleet-settings.json", state / "commands.jsonl", run / "backoff.json"):
        _hostile(path, kind)
    (state / "commands.jsonl").rename(state / "commands.json")
    log = _started_on_damage(fleet, spawn_agent, agent_python, tmp_path)
    assert any("commands.json" in line for line in log.splitlines()), log[-3000:]


# -- each reader, in the process: every hostile content is its file's safe default ------

def _hostile(path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        target = path.parent / "elsewhere.json"
        target.write_text("{}")
        path.symlink_to(target)
    else:   # a line-wise file (the ledger) gets its line's end: a torn tail is dropped
        path.write_bytes(HOSTILE[kind] + (b"\n" if path.name.endswith(".jsonl") else b""))


# each number where the reboot count keeps its time, and beside it for the others
HOSTILE = {"400 digits": ('{"reboots": [{"wall": %s, "synced": true, "boot": "b"}], "a": %s}'
                          % (HUGE, HUGE)).encode(),
           "1e999": b'{"reboots": [{"wall": 1e999, "synced": true, "boot": "b"}], "a": 1e999}',
           "NaN": b'{"a": NaN}', "a list": b"[1, 2]", "10 MB": b"[" + b"0," * (5 << 20) + b"0]",
           "invalid UTF-8": b'{"a": "\xff\xfe"}', "fifo": None, "symlink": None}


def _reboots(state):
    from agent.screen import reboots
    book = reboots.RebootBook(str(state), 2, wall=lambda: 1.8e9, synced=lambda: True,
                              boot=lambda: "b")
    return book.left() == 0          # damaged: the day's budget spent, never a reboot loop


def _schedule(state):
    from agent.link.schedule_store import ScheduleStore
    store = ScheduleStore(str(state / "schedule.json"))
    return store.load() == (0, None) and store.outage_restarts() == 0


def _idle(state):
    from agent.link.idle_memory import IdleMemory
    return IdleMemory(str(state)).recall("wlan0") is None


def _overlay(state):
    from agent.config import overlay
    found, why = overlay.read(str(state))
    return found.current is None and why is not None


def _ledger(state):
    from agent.commands import ledger
    return ledger.load(str(state / "commands.jsonl"), 1.8e9).closed   # refuses what it held


def _credentials(state):
    from agent.identity.credentials import Credentials
    creds = Credentials(str(state))
    return creds.load("screen-1") is None and creds.server_device_id() is None


def _status(state):
    from agent.base import status_file
    try:
        status_file.read(str(state / "status.json"))
    except status_file.StatusFileError as e:
        return "\n" not in str(e)
    return False


def _history(state):
    from agent.update import records, rules
    return records.read_history(str(state)) == [] and rules.HISTORY_FILE


READERS = {"screen-reboots.json": _reboots, "schedule.json": _schedule,
           "idle-limits.json": _idle, "fleet-settings.json": _overlay,
           "commands.jsonl": _ledger, "credentials.json": _credentials,
           "status.json": _status, "history": _history}


SAY_IT = {"screen-reboots.json", "schedule.json", "idle-limits.json", "commands.jsonl",
          "credentials.json"}


def _file_of(name: str) -> str:
    from agent.config import overlay
    from agent.identity import credentials
    from agent.link import idle_memory
    from agent.update import rules
    return {"fleet-settings.json": overlay.FILE, "credentials.json": credentials.FILE,
            "idle-limits.json": idle_memory.FILE, "history": rules.HISTORY_FILE}.get(name, name)


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_state_file_reader_takes_its_safe_default(tmp_path, reader, kind, caplog):
    state = tmp_path / "state"
    state.mkdir()
    _hostile(state / _file_of(reader), kind)
    caplog.set_level(logging.INFO)
    assert READERS[reader](state)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # said once by the readers that say it; the others hand their reason to their caller
    assert len(said) == (1 if reader in SAY_IT else 0), said
