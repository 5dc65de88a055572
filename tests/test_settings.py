"""Settings from the fleet: a revision's shape, the same rules as the file, the overlay
on disk, the trial on a fake clock; then the real agent and the reference server."""
import errno
import json
import os
import subprocess
import sys
import time

import pytest

from agent.config import load as cfgmod
from agent.base.boot import boot_id
from agent.base.clock import FakeClock
from agent.settings import rules
from agent.config import revision as revision_rules
from agent.config import overlay as overlay_file
from agent.settings.service import FleetSettings
from agent.app.status import render
from devtools.harness import REPO, agent_config, wait_for
from tests.test_commands_e2e import ask, result_of


def base_file(tmp_path, extra=""):
    path = tmp_path / "agent.toml"
    path.write_text(f'[server]\nurl = "http://127.0.0.1:9"\n[identity]\nstate_dir = '
                    f'"{tmp_path / "state"}"\n[link]\nheartbeat_interval_s = 20\n{extra}')
    (tmp_path / "state").mkdir(exist_ok=True)
    return str(path)


def test_a_revision_malformed_in_any_field_is_refused_naming_it():
    ok = revision_rules.revision_args({"revision": 3, "settings": {
        "log.level": "debug", "link.heartbeat_interval_s": {"value": 10, "expires_in_s": 60}}})
    assert ok == {"revision": 3, "values": {"log.level": "debug", "link.heartbeat_interval_s": 10},
                  "expires_in_s": {"link.heartbeat_interval_s": 60.0}}
    for args, why in (({"revision": 0, "settings": {}}, "revision"),
                      ({"revision": True, "settings": {}}, "revision"),
                      ({"revision": 1, "settings": []}, "settings"),
                      ({"revision": 1, "settings": {"Log Level": 1}}, "not a key"),
                      ({"revision": 1, "settings": {"log.level": {"v": 1}}}, "settings.log.level"),
                      ({"revision": 1, "settings": {"log.level": {"value": "debug",
                                                                   "expires_in_s": -1}}},
                       "expires_in_s"),
                      ({"revision": 1, "settings": {"log.level": {"a": [1]}}}, "log.level"),
                      ({"revision": 1, "settings": {"log.level": None}}, "log.level"),
                      ({"revision": 1, "settings": {f"a.k{i}": 1 for i in range(65)}}, "at most"),
                      ({"revision": 1, "settings": {}, "sudo": 1}, "unknown argument")):
        with pytest.raises(ValueError, match=why):
            revision_rules.revision_args(args)


def test_the_fleets_values_obey_the_files_rules_and_the_environment_still_wins(tmp_path):
    path = base_file(tmp_path)
    c = cfgmod.load(path, {}, fleet={"log.level": "debug", "link.backoff.cap_s": 30})
    assert c.log.level == "debug" and c.link.backoff.cap_s == 30
    assert c.origins["log.level"] == "fleet" and c.origins["link.heartbeat_interval_s"] == "file"
    assert c.origins["link.ack_timeout_s"] == "default"
    for values, why in (({"log.level": "loud"}, r"log.level \(from the fleet\): must be one of"),
                        ({"link.heartbeat_interval_s": 0.01}, "heartbeat_interval_s .from the fleet.: must be"),
                        ({"link.ack_timeout_s": 30}, "must be less than link.heartbeat_interval_s"),
                        ({"identity.token": "x" * 40}, "identity.token: not set from the fleet"),
                        ({"uploads.max_items": 1}, "uploads.max_items: not set from the fleet"),
                        ({"commands.allow": ["reboot"]}, "manage_commands_allow is off"),
                        ({"link.bogus": 1}, "link.bogus: unknown key"),
                        ({"server.url": "http://10.0.0.1:8080"}, "manage_server_url is off")):
        with pytest.raises(cfgmod.ConfigError, match=why):
            cfgmod.load(path, {}, fleet=values)
    managed = base_file(tmp_path, "[fleet]\nmanage_commands_allow = true\nmanage_server_url = true\n")
    assert "reboot" in cfgmod.load(managed, {}, fleet={"commands.allow": ["reboot"]}).commands.allow
    # the shell is the operator's own to allow: the fleet may keep or drop it, never add it
    with pytest.raises(cfgmod.ConfigError, match=r"commands.allow \(from the fleet\): shell is "
                                                 "allowed only by the screen's own file"):
        cfgmod.load(managed, {}, fleet={"commands.allow": ["logs", "shell"]})
    (tmp_path / "shell").mkdir()
    shell_file = base_file(tmp_path / "shell", '[fleet]\nmanage_commands_allow = true\n[commands]\n'
                                     'allow = ["logs", "shell"]\n')
    assert cfgmod.load(shell_file, {}, fleet={"commands.allow": ["shell", "reboot"]}
                       ).commands.allow == {"shell", "reboot"}
    assert cfgmod.load(shell_file, {}, fleet={"commands.allow": ["logs"]}).commands.allow == {"logs"}
    with pytest.raises(cfgmod.ConfigError, match="server.url: must be an http"):
        cfgmod.load(managed, {}, fleet={"server.url": "file:///etc/shadow"})
    env = cfgmod.load(path, {"EDGE_AGENT_LOG_LEVEL": "warning"}, fleet={"log.level": "debug"})
    assert env.log.level == "warning" and env.origins["log.level"] == "env"
    with pytest.raises(cfgmod.ConfigError, match="log.level \\(from the fleet\\): must be one of"):
        cfgmod.load(path, {"EDGE_AGENT_LOG_LEVEL": "warning"}, fleet={"log.level": "☃" * 9})


def stage(tmp_path, values, until=None, revision=4):
    overlay_file.write(str(tmp_path / "state"), overlay_file.Overlay(
        overlay_file.Revision(revision, values, until or {}), None, None))


def test_the_overlay_on_disk_applies_and_a_damaged_one_leaves_the_file_alone(tmp_path):
    path = base_file(tmp_path)
    stage(tmp_path, {"log.level": "debug", "link.stable_after_s": 5},
          {"log.level": revision_rules.Expiry(boot_id(), time.monotonic() + 600),
           "link.stable_after_s": revision_rules.Expiry(boot_id(), time.monotonic() - 1)})
    c = cfgmod.load(path, {})
    assert c.fleet_revision == 4 and c.log.level == "debug" and c.origins["log.level"] == "fleet"
    assert c.link.stable_after_s == 60.0   # its time is over
    stage(tmp_path, {"log.level": "debug"}, {"log.level": revision_rules.Expiry("another-boot", 1e12)})
    assert cfgmod.load(path, {}).log.level == "info"   # a reboot ends what expires
    stage(tmp_path, {"link.ack_timeout_s": 50})   # the file changed under it, or tampering
    c = cfgmod.load(path, {})
    assert c.fleet_revision is None and "revision 4 not applied: link.ack_timeout_s" in c.fleet_problem
    overlay = tmp_path / "state" / overlay_file.FILE
    for damage in (b"{", b"[]", json.dumps({"current": {"revision": "x", "values": {}}}).encode(),
                   b"x" * (overlay_file.MAX_BYTES + 1)):
        overlay.write_bytes(damage)
        c = cfgmod.load(path, {})
        assert c.fleet_revision is None and c.fleet_problem and c.log.level == "info"
    overlay.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(overlay_file.Overlay(
        overlay_file.Revision(9, {"log.level": "debug"}), None, None).to_dict()))
    overlay.symlink_to(tmp_path / "elsewhere.json")   # never followed, root reads this too
    c = cfgmod.load(path, {})
    assert c.log.level == "info" and "Too many levels of symbolic links" in c.fleet_problem


class Clocked:
    def __init__(self):
        self.clock = FakeClock()
        self.boot = "boot-1"

    def settings(self, state_dir, proof=30.0):
        return FleetSettings(state_dir, proof, monotonic=lambda: self.clock.now,
                             wall=self.clock.wall, boot=lambda: self.boot)

    def on_trial(self, state_dir, revision, settings):
        """A revision staged by one process, on trial in the next."""
        self.settings(state_dir).propose(
            revision_rules.revision_args({"revision": revision, "settings": settings}), lambda v: None)
        started = self.settings(state_dir)
        started.begin()
        return started


def args(revision, **values):
    return revision_rules.revision_args({"revision": revision, "settings": values})


def test_a_revision_is_on_trial_until_proven_and_rolled_back_to_the_last_good_one(tmp_path):
    t = Clocked()
    state = str(tmp_path)
    s = t.settings(state)
    checked = []
    assert "revision 1 staged" in s.propose(args(1, **{"log.level": "debug"}), checked.append).text
    assert checked == [{"log.level": "debug"}]
    assert s.proven() is None and s.snapshot({})["state"] == "staged"   # the next process's trial
    s.begin()   # a start that is not this one's: nothing counted for revision 1 by it
    s = t.settings(state)          # the restart that applies it
    assert s.begin() is None and s.on_trial
    assert s.due() is None
    ended = s.proven()
    assert ended.result == rules.KEPT and not s.on_trial
    s = t.settings(state)
    assert s.begin() is None and not s.on_trial and s.overlay.current.revision == 1
    with pytest.raises(ValueError, match="not newer"):
        s.propose(args(1, **{"log.level": "info"}), lambda v: None)
    with pytest.raises(ValueError, match="must be between"):
        def refuse(values):
            raise ValueError("link.heartbeat_interval_s: must be between 1 and 3600")
        s.propose(args(2, **{"link.heartbeat_interval_s": 0}), refuse)
    assert s.overlay.current.revision == 1   # a refused revision changes nothing
    s.propose(args(2, **{"server.url": "http://192.0.2.1"}), lambda v: None)
    s = t.settings(state)
    s.begin()
    s.propose(args(3, **{"log.level": "debug"}), lambda v: None)   # arrives during the trial
    assert s.proven() is None and s.due() is None   # revision 3 is the next start's trial
    assert s.overlay.good.revision == 1             # and 2 was never good
    s = t.settings(state)
    s.begin()
    t.clock.advance(29.9)
    assert s.due() is None
    t.clock.advance(0.1)
    ended = s.due()
    assert ended.result == rules.ROLLED_BACK and ended.revision == 3 and "not proven" in ended.why
    s = t.settings(state)
    assert s.overlay.current.revision == 1 and s.overlay.outcome["result"] == rules.ROLLED_BACK
    with pytest.raises(ValueError, match="was rolled back here"):
        s.propose(args(3, **{"log.level": "debug"}), lambda v: None)
    staged = s.propose(args(4, **{"log.level": "warning"}), lambda v: None)
    assert staged.restart and staged.revision == 4


def test_a_switch_flipped_to_where_it_is_changes_nothing_and_restarts_nothing(tmp_path):
    t = Clocked()
    s = t.settings(str(tmp_path))
    off = s.propose(revision_rules.revision_args({"settings": {}}), lambda v: None)
    assert not off.restart and "already in force" in off.text
    assert not (tmp_path / overlay_file.FILE).exists()
    s = t.on_trial(str(tmp_path), None, {"log.level": "debug"})
    s.proven()
    assert s.overlay.current.revision == 1   # no revision given: the next one
    again = s.propose(revision_rules.revision_args({"settings": {"log.level": "debug"}}), lambda v: None)
    assert not again.restart and s.overlay.current.revision == 1


def test_an_agent_that_keeps_dying_on_a_revision_goes_back_after_three_starts(tmp_path):
    t = Clocked()
    s = t.settings(str(tmp_path))
    s.propose(args(5, **{"log.level": "debug"}), lambda v: None)
    for _ in range(rules.MAX_TRIAL_STARTS):
        assert t.settings(str(tmp_path)).begin() is None   # each start killed before proof
    ended = t.settings(str(tmp_path)).begin()
    assert ended.result == rules.ROLLED_BACK and "restarted 3 times" in ended.why
    assert t.settings(str(tmp_path)).overlay.current is None   # back to the file alone


def test_an_expiring_setting_leaves_on_time_and_a_reboot_ends_it(tmp_path):
    t = Clocked()
    s = t.on_trial(str(tmp_path), 1, {"log.level": {"value": "debug", "expires_in_s": 3600},
                                      "link.missed_acks": 3})
    s.proven()
    assert s.next_expiry() == t.clock.now + 3600
    t.clock.advance(3599)
    assert s.expired() is None
    t.clock.advance(1)
    ended = t.settings(str(tmp_path)).expired()   # across a restart: the same boot's clock
    assert ended.result == rules.EXPIRED and ended.keys == ("log.level",)
    after = t.settings(str(tmp_path))
    assert after.overlay.current.values == {"link.missed_acks": 3} and after.next_expiry() is None
    s = t.settings(str(tmp_path))
    s.propose(revision_rules.revision_args({"revision": 2, "settings": {
        "log.level": {"value": "debug", "expires_in_s": 3600}}}), lambda v: None)
    t.boot = "boot-2"
    assert t.settings(str(tmp_path)).expired().keys == ("log.level",)


def test_status_says_the_revision_where_values_come_from_and_the_last_rollback(tmp_path):
    t = Clocked()
    s = t.on_trial(str(tmp_path), 7, {"log.level": {"value": "debug", "expires_in_s": 600},
                                      "link.missed_acks": 3})
    snap = s.snapshot({"log.level": "fleet", "link.missed_acks": "env"})
    assert snap["state"] == "trial" and snap["proof_due_in_s"] == 30.0
    assert snap["fleet"] == {"log.level": {"value": "debug", "expires_in_s": 600.0}}
    assert snap["origins"] == {"link.missed_acks": "env", "log.level": "fleet"}
    doc = {"settings": snap, "link": {"state": "online"}}
    text = render(doc, True)
    assert ("settings    fleet revision 7 trial (proof due in 30 s): log.level=debug for 10 min "
            "more; the environment overrides the fleet's link.missed_acks") in text


def _events(server, kind):
    devices = server.admin("/admin/devices")
    return [e for e in devices.get("screen-1", {}).get("events", []) if e.get("type") == kind]


def _respawn(spawn_agent, agent_python, config, old, timeout):
    """What systemd's Restart=always does when the agent stops to apply settings."""
    assert old.proc.wait(timeout) == 0
    return spawn_agent(agent_python, config)


@pytest.mark.netns
def test_the_fleet_applies_a_revision_it_expires_and_one_that_breaks_the_link_goes_back(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    config = agent_config(server, tmp_path, commands={"allow": ["diagnostics", "configure"]},
                          fleet={"proof_timeout_s": 10.0, "manage_server_url": True})
    agent = spawn_agent(agent_python, config)
    agent.wait_live(15)
    pushed = time.monotonic()
    # the operator's command line, as a fleet operator types it
    operator = subprocess.Popen(
        [str(REPO / "scripts" / "fleet-server"), "command", "screen-1", "configure",
         "--set", "link.missed_acks=3", "--set", "log.level=debug", "--expire", "log.level=6s",
         "--url", server.url, "--wait", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
    agent = _respawn(spawn_agent, agent_python, config, agent, 15)
    agent.wait_live(15)
    out, err = operator.communicate(timeout=30)
    assert operator.returncode == 0, err
    assert "revision 1 staged (2 settings)" in json.loads(out)["output"]
    kept = wait_for(lambda: _events(server, "config.kept"), 15, what="config.kept at the server")
    assert kept[0]["revision"] == 1
    settings = agent.status()["settings"]
    assert settings["revision"] == 1 and settings["state"] == "kept"
    assert settings["fleet"]["log.level"]["value"] == "debug"
    # the debug level leaves on time, across the restart that applied it
    agent = _respawn(spawn_agent, agent_python, config, agent, 20)
    expired_after = time.monotonic() - pushed
    assert 6 <= expired_after < 10, expired_after
    agent.wait_live(15)
    wait_for(lambda: _events(server, "config.expired"), 15, what="config.expired at the server")
    settings = agent.status()["settings"]
    assert "log.level" not in settings["fleet"] and settings["fleet"]["link.missed_acks"]["value"] == 3
    # a revision that takes the screen off its server comes back within the bound
    cid = ask(server, "configure", {"revision": 2, "settings": {
        "server.url": "http://127.0.0.1:1"}})["id"]
    agent = _respawn(spawn_agent, agent_python, config, agent, 15)
    started = time.monotonic()
    agent = _respawn(spawn_agent, agent_python, config, agent, 30)
    rolled_back_in = time.monotonic() - started
    assert 10 <= rolled_back_in < 14, rolled_back_in
    agent.wait_live(15)
    back = wait_for(lambda: _events(server, "config.rolled-back"), 15,
                    what="config.rolled-back at the server")
    assert back[0]["revision"] == 2 and "not proven" in back[0]["why"]
    assert result_of(server, cid, 10)["ok"]
    settings = agent.status()["settings"]
    assert settings["revision"] == 1 and settings["last"]["result"] == "rolled-back"
    again = result_of(server, ask(server, "configure", {"revision": 2, "settings": {
        "server.url": "http://127.0.0.1:1"}})["id"], 10)
    assert not again["ok"] and "was rolled back here" in again["error"]


def test_a_rollback_the_card_cannot_write_removes_the_overlay_instead(tmp_path, monkeypatch):
    t = Clocked()
    s = t.settings(str(tmp_path))
    s.propose(args(1, **{"log.level": "debug"}), lambda v: None)
    s = t.settings(str(tmp_path))
    s.begin()
    t.clock.advance(30)

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(overlay_file, "write", full)
    ended = s.due()
    assert ended.result == rules.ROLLED_BACK and "could not be written (No space left" in ended.why
    assert not (tmp_path / overlay_file.FILE).exists()
    assert overlay_file.read(str(tmp_path))[0].current is None   # the next start: the file alone


def test_root_and_the_agent_read_an_overlay_one_rule_rejects_alike(tmp_path):
    """Root's grants and installer load the configuration without any part; an overlay
    that a part's rule rejects (a working week that does not parse) must be the file alone
    for them as it is for the agent, or polkit would grant what the agent does not run."""
    path = base_file(tmp_path, '[fleet]\nmanage_commands_allow = true\n[commands]\n'
                               'display_on_command = "true"\ndisplay_off_command = "true"\n')
    stage(tmp_path, {"commands.allow": ["reboot", "update"], "hours.week": ["mon 9-5"]},
          revision=7)
    script = ("import json, sys; from agent.config import load; c = load.load(sys.argv[1], {}); "
              "print(json.dumps([sorted(c.commands.allow), c.fleet_revision, c.fleet_problem]))")
    out = subprocess.run([sys.executable, "-I", "-c", script, path], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    allow, revision, problem = json.loads(out)
    assert (allow, revision) == (["diagnostics", "logs"], None), out
    assert "fleet revision 7 not applied: hours.week[0]" in problem
    loaded = [m for m in subprocess.run(
        [sys.executable, "-I", "-c", "import sys; from agent.config import load; "
         "print(' '.join(sys.modules))"], cwd=REPO, capture_output=True, text=True,
        check=True).stdout.split() if m.startswith("agent.hours")]
    assert not loaded, "the configuration loads the working hours' part to check a week"
