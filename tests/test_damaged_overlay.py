"""A damaged settings overlay (a card that lied, a hand that edited it, a build that wrote
something else) is set aside with its reason: the local file alone runs, and nothing that
reads it crashes: not the agent's configuration, not its settings service, and not the
root entry points that read it before the agent starts (the grants' ExecStartPre, the
update installer), run here as root runs them.

Before: a 400-digit integer in ``received_at`` (and many other shapes) raised
OverflowError, TypeError or KeyError out of config loading, so ``check-config`` printed a
traceback and the agent and the installer stopped."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.config import load as config_mod
from agent.config import overlay as overlay_file
from agent.settings.service import FleetSettings
from devtools.harness import REPO

HUGE = 10 ** 400
DEEP = "__deep__"
BAD_VALUES = [HUGE, -HUGE, float("inf"), float("-inf"), float("nan"), "x", [], {}, None, True,
              -1, 1.5, DEEP, [HUGE], {"a": {"b": [1, None]}}]


def _good() -> dict:
    rev = {"revision": 3, "values": {"log.level": "debug"}, "received_at": 1.0,
           "until": {"log.level": {"boot": "b", "at": 5.0}}}
    return {"current": rev, "good": {**rev, "revision": 2, "until": {}}, "trial_starts": 1,
            "outcome": {"revision": 1, "result": "kept", "why": "", "keys": [], "at": 1.0}}


FIELDS = [("current",), ("current", "revision"), ("current", "values"),
          ("current", "values", "log.level"), ("current", "received_at"), ("current", "until"),
          ("current", "until", "log.level"), ("current", "until", "log.level", "at"),
          ("current", "until", "log.level", "boot"), ("good",), ("good", "revision"),
          ("good", "received_at"), ("trial_starts",), ("outcome",), ("outcome", "revision"),
          ("outcome", "keys"), ("outcome", "why"), ("outcome", "result"), ("outcome", "at"),
          ("highest",)]


def _text(doc) -> str:
    text = json.dumps(doc)   # NaN and Infinity as Python writes them, which json.loads takes
    return text.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)


def damaged() -> list[tuple[str, str]]:
    cases = [("not an object", "[1, 2]"), ("deep", "[" * 100_000 + "]" * 100_000),
             ("a number", str(HUGE)), ("torn", json.dumps(_good())[:40])]
    for path in FIELDS:
        for value in BAD_VALUES:
            doc = _good()
            node = doc
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            cases.append((".".join(path) + "=" + repr(value)[:20], _text(doc)))
        doc = _good()
        node = doc
        for key in path[:-1]:
            node = node[key]
        if isinstance(node, dict) and path[-1] in node and len(path) > 1:
            del node[path[-1]]
            cases.append((".".join(path) + " missing", _text(doc)))
    return cases


CASES = damaged()


def _setup(tmp_path, text: str):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / overlay_file.FILE).write_text(text)
    conf = tmp_path / "agent.toml"
    conf.write_text(f'[server]\nurl = "http://127.0.0.1:9"\n[identity]\nstate_dir = "{state}"\n'
                    f'[commands]\nallow = ["diagnostics"]\n'
                    f'[fleet]\nmanage_commands_allow = true\n')
    return state, conf


def test_every_damage_is_a_reason_never_an_exception(tmp_path):
    for name, text in CASES:
        state, conf = _setup(tmp_path, text)
        overlay, problem = overlay_file.read(str(state))
        if overlay.current is None and overlay.good is None and problem is None:
            pytest.fail(f"{name}: read as nothing, without a reason")
        cfg = config_mod.load(str(conf), env={}, vendor=None)   # never raises for the overlay
        assert cfg.server.url, name
        s = FleetSettings(str(state), 30.0, boot=lambda: "b")
        s.snapshot({})
        s.unannounced()
        s.next_expiry()
        s.expired()
        try:
            s.propose({"revision": None, "values": {"log.level": "info"}, "expires_in_s": {}},
                      check=lambda values: None)
        except ValueError:
            pass
        s.begin()


ROOT_CASES = [c for c in CASES if c[0].startswith(("current.received_at=10", "current.until.log.level.at=inf",
                                                   "outcome.revision='x'", "current.values={'a'",
                                                   "deep", "trial_starts='x'"))]


@pytest.mark.parametrize("name,text", ROOT_CASES, ids=[c[0][:40] for c in ROOT_CASES])
def test_the_root_entry_points_run_on_a_damaged_overlay(tmp_path, name, text):
    """As root's units run them: ``python3 -I -m agent.programs.grants`` and the installer,
    against a temporary grants directory and root directory; one line, no traceback."""
    state, conf = _setup(tmp_path, text)
    env = {"PATH": os.environ["PATH"]}
    runs = {
        "grants": [sys.executable, "-I", "-m", "agent.programs.grants", "--config", str(conf),
                   "--dir", str(tmp_path / "grants"),
                   "--watchdog-dir", str(tmp_path / "system.conf.d")],
        "installer": [sys.executable, "-I", "-m", "agent.programs.installer", "--config", str(conf),
                      "--root-dir", str(tmp_path / "root"), "--keys-dir", str(tmp_path / "keys")],
        "check-config": [sys.executable, "-I", "-m", "agent", "check-config", "--config",
                         str(conf)],
    }
    for what, argv in runs.items():
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
        out = r.stdout + r.stderr
        assert "Traceback" not in out, f"{what} on {name}:\n{out[-3000:]}"
        assert r.returncode == 0, f"{what} on {name} exited {r.returncode}:\n{out[-3000:]}"
        if what == "check-config":
            assert "fleet settings not applied" in r.stdout, out


# -- revisions only go up ------------------------------------------------------------------
def test_revisions_only_go_up_across_a_rollback_to_the_file_alone_and_an_expiry(tmp_path):
    """Before: after revision 50 was rolled back to the file alone, revision 3 was staged
    (only the revision in force was compared, and there was none)."""
    from agent.base.clock import FakeClock
    from agent.settings import rules
    from agent.config import revision as revision_rules
    clock = FakeClock()

    def settings():
        return FleetSettings(str(tmp_path), 30.0, monotonic=lambda: clock.now,
                             wall=clock.wall, boot=lambda: "boot-1")

    def args(revision, expires=None, **values):
        settings_ = {k: ({"value": v, "expires_in_s": expires} if expires else v)
                     for k, v in values.items()}
        return revision_rules.revision_args({"revision": revision, "settings": settings_})

    settings().propose(args(50, **{"log.level": "debug"}), lambda v: None)
    for _ in range(rules.MAX_TRIAL_STARTS):
        settings().begin()
    assert settings().begin().result == rules.ROLLED_BACK
    s = settings()
    assert s.overlay.current is None                     # the file alone
    with pytest.raises(ValueError) as e:
        s.propose(args(3, **{"log.level": "info"}), lambda v: None)
    assert "not newer than revision 50" in str(e.value)
    # the next one without a number is 51; an expiry that empties it keeps the memory
    staged = settings().propose(revision_rules.revision_args({"settings": {"log.level": {
        "value": "info", "expires_in_s": 10}}}), lambda v: None)
    assert staged.revision == 51
    s = settings()
    s.begin()
    assert s.proven().result == rules.KEPT
    clock.advance(11)
    assert settings().expired().result == rules.EXPIRED
    with pytest.raises(ValueError):
        settings().propose(args(7, **{"log.level": "info"}), lambda v: None)
    assert overlay_file.read(str(tmp_path))[0].seen() == 51


def test_a_revision_sent_in_the_fleets_name_at_the_last_number_locks_nothing_for_good(tmp_path):
    """A review found one revision of 2**53 refused every later one of the real fleet,
    and a push without a number then staged 2**53 + 1, which the next start read as
    damage. The next number is refused in words, and unpairing the screen forgets the
    fleet's revisions with its settings."""
    from agent.settings import rules
    from agent.config import revision as revision_rules
    conf = tmp_path / "agent.toml"
    conf.write_text(f'[server]\nurl = "http://127.0.0.1:1"\n[identity]\nstate_dir = '
                    f'"{tmp_path}"\n')
    FleetSettings(str(tmp_path), 30.0).propose(revision_rules.revision_args(
        {"revision": revision_rules.MAX_REVISION, "settings": {"log.level": "debug"}}), lambda v: None)
    with pytest.raises(ValueError, match="the last there is; `edge-agent unpair` forgets"):
        FleetSettings(str(tmp_path), 30.0).propose(
            revision_rules.revision_args({"settings": {"log.level": "info"}}), lambda v: None)
    r = subprocess.run([sys.executable, "-m", "agent", "unpair", "--config", str(conf)],
                       capture_output=True, text=True, timeout=30,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    staged = FleetSettings(str(tmp_path), 30.0).propose(
        revision_rules.revision_args({"revision": 2, "settings": {"log.level": "info"}}), lambda v: None)
    assert staged.revision == 2
