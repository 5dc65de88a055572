"""A read error is not an answer: EIO on the credentials, the command ledger or the
settings overlay is a failing card (read again, said as such), never "unpaired",
"nothing ran" or "no settings" acted upon. The error is injected at the read (the
card's I/O error as the kernel returns it), a given number of times or for good.
(A real EIO from a device-mapper error target needs dm-mod, which this kernel lacks.)"""
from __future__ import annotations

import errno
import json
import os

import pytest

from agent.base import fsutil
from agent.commands import ledger
from agent.identity.credentials import Credentials, CredentialsUnreadable
from agent.identity.service import IdentityService
from agent.settings import rules
from agent.config import revision as revision_rules
from agent.config import overlay as overlay_file
from agent.settings.service import FleetSettings

TOKEN = "a" * 40


def failing_reads(monkeypatch, module, name: str, times: int | None):
    """The reader ``module.read_bounded`` fails with EIO on files named ``name``:
    ``times`` times, or always (None)."""
    real = module.read_bounded
    left = [times]

    def read(path, *a, **kw):
        if os.path.basename(path) == name and (left[0] is None or left[0] > 0):
            if left[0] is not None:
                left[0] -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(path, *a, **kw)
    monkeypatch.setattr(module, "read_bounded", read)
    monkeypatch.setattr(fsutil.time, "sleep", lambda s: None)


def stored(tmp_path) -> Credentials:
    c = Credentials(str(tmp_path))
    c.save("dev-1", TOKEN)
    return c


def test_credentials_the_card_will_not_give_are_not_an_unpaired_screen(tmp_path, monkeypatch):
    """Before: load() logged the error and returned None: the screen enrolled again and
    showed a new pairing code."""
    c = stored(tmp_path)
    failing_reads(monkeypatch, fsutil, "credentials.json", None)
    with pytest.raises(CredentialsUnreadable) as e:
        IdentityService.load("dev-1", c, None, False, False)
    assert "Input/output error" in e.value.strerror
    assert os.path.exists(c.path)          # not set aside as corrupt, not cleared


def test_a_read_that_fails_once_is_read_again(tmp_path, monkeypatch):
    c = stored(tmp_path)
    failing_reads(monkeypatch, fsutil, "credentials.json", 2)
    ids = IdentityService.load("dev-1", c, None, False, False)
    assert ids.token() == TOKEN


def test_the_agent_stops_degraded_and_says_why_instead_of_pairing_again(tmp_path, monkeypatch,
                                                                         caplog):
    from agent import cli
    conf = tmp_path / "agent.toml"
    state = tmp_path / "state"
    state.mkdir()
    Credentials(str(state)).save("dev-1", TOKEN)
    conf.write_text(f'[server]\nurl = "http://127.0.0.1:9"\n[identity]\nstate_dir = "{state}"\n'
                    f'device_id = "dev-1"\n[runtime]\ndir = "{tmp_path / "run"}"\n')
    failing_reads(monkeypatch, fsutil, "credentials.json", None)
    from agent.base import logs   # imported by the command that runs (cli imports it lazily)
    monkeypatch.setattr(logs, "setup", lambda level: None)
    rc = cli.main(["run", "--config", str(conf)])
    assert rc == cli.EXIT_DEGRADED
    assert "the card is failing; not pairing again" in caplog.text
    assert not (tmp_path / "run" / "pairing-code").exists()


def test_a_ledger_the_card_will_not_give_is_not_an_empty_one(tmp_path, monkeypatch):
    path = str(tmp_path / "commands.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"v": 2}) + "\n")
        f.write(json.dumps({"e": {"id": "c1", "name": "diagnostics", "state": "done",
                                  "received_at": 1.0, "expires_at": 9e9}}) + "\n")
    failing_reads(monkeypatch, ledger, "commands.jsonl", 1)
    once = ledger.load(path, 100.0)
    assert once.floor is None and not once.closed and "c1" in once.entries   # read again
    failing_reads(monkeypatch, ledger, "commands.jsonl", None)
    lost = ledger.load(path, 100.0)
    assert lost.closed and lost.floor >= 100.0 + ledger.LOST_HOLD_S   # held, not "nothing ran"
    kept = [n for n in os.listdir(tmp_path) if n.startswith("commands.jsonl.unreadable-")]
    assert kept, "the unreadable ledger is kept aside, not written over"


def test_an_overlay_the_card_will_not_give_is_not_written_over(tmp_path, monkeypatch):
    """Before: the read error gave an empty overlay, and the next revision wrote over the
    file (its revisions and the highest seen gone)."""
    s = FleetSettings(str(tmp_path), 30.0)
    s.propose(revision_rules.revision_args({"revision": 40, "settings": {"log.level": "debug"}}),
              lambda v: None)
    before = (tmp_path / overlay_file.FILE).read_bytes()
    failing_reads(monkeypatch, fsutil, overlay_file.FILE, 2)
    assert overlay_file.read(str(tmp_path))[0].current.revision == 40     # read again
    failing_reads(monkeypatch, fsutil, overlay_file.FILE, None)
    s = FleetSettings(str(tmp_path), 30.0)
    assert s.overlay.current is None and "Input/output error" in s.problem
    with pytest.raises(ValueError) as e:
        s.propose(revision_rules.revision_args({"revision": 3, "settings": {"log.level": "info"}}),
                  lambda v: None)
    assert "cannot be read" in str(e.value)
    assert (tmp_path / overlay_file.FILE).read_bytes() == before


def test_a_ledger_line_with_a_number_no_float_holds_is_a_damaged_line(tmp_path):
    """Before: a 400-digit received_at raised OverflowError out of the ledger's load, at
    every start."""
    path = str(tmp_path / "commands.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"v": 2}) + "\n")
        f.write('{"e": {"id": "c1", "name": "diagnostics", "state": "done", "received_at": '
                + "9" * 400 + "}}\n")
    loaded = ledger.load(path, 100.0)
    assert loaded.closed and loaded.entries == {}
