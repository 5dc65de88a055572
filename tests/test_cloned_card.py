"""A card imaged from another screen's (machine id and state directory copied) becomes
a screen of its own: the identity on the card is bound to the board's serial
(identity/board.py), a second board keeps the copied identity aside, says so once and
pairs as a new screen; a board with no readable serial keeps today's behaviour and
says the check is unavailable. The board's facts come from fixture trees (the sysfs
root the agent is given, [debug] sysfs_root); end to end against the reference fleet
server and the real ScreenTinker 1.9."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess

import pytest

from agent.app import doctor as D
from agent.app import status
from agent.base import hardware
from agent.base.journal_fields import MessageId
from agent.config.load import load
from agent.identity import board
from agent.identity.credentials import Credentials
from agent.identity.part import DeviceIdentity
from agent.link.profiles import EdgeAgentProfile, ScreenTinkerProfile
from devtools import screentinker_peer as peer
from devtools.harness import REPO, AgentProcess, agent_config, wait_for

SERIAL_A, SERIAL_B = "10000000aaaaaaaa", "10000000bbbbbbbb"


def a_board(root, serial=None, cpuinfo=None, dmi=None):
    """A board's sysfs and /proc, as fixture trees: (sysfs, proc)."""
    sysfs, proc = root / "sys", root / "proc"
    proc.mkdir(parents=True, exist_ok=True)
    sysfs.mkdir(parents=True, exist_ok=True)
    if serial is not None:
        dt = sysfs / "firmware/devicetree/base"
        dt.mkdir(parents=True, exist_ok=True)
        (dt / "serial-number").write_bytes(serial.encode() + b"\0")
    if cpuinfo is not None:
        (proc / "cpuinfo").write_text(f"processor\t: 0\nHardware\t: BCM2835\nSerial\t\t: {cpuinfo}\n")
    if dmi is not None:
        d = sysfs / "class/dmi/id"
        d.mkdir(parents=True, exist_ok=True)
        (d / "product_uuid").write_text(dmi + "\n")
    return str(sysfs), str(proc)


def test_the_board_says_its_serial_from_the_device_tree_cpuinfo_or_dmi_hashed(tmp_path):
    dt = hardware.board_fingerprint(*a_board(tmp_path / "dt", serial=SERIAL_A))
    cpu = hardware.board_fingerprint(*a_board(tmp_path / "cpu", cpuinfo=SERIAL_A))
    dmi = hardware.board_fingerprint(*a_board(tmp_path / "dmi", dmi="4c4c4544-0042-3510-8052-b4c04f564433"))
    assert dt[0] == cpu[0] == "board serial" and dt[1] == cpu[1], "one serial, two places"
    assert dmi[0] == "DMI product_uuid" and dmi[1] != dt[1]
    assert SERIAL_A not in dt[1], "hashed, never the serial itself"
    assert hardware.board_fingerprint(*a_board(tmp_path / "b", serial=SERIAL_B))[1] != dt[1]
    for nothing in (a_board(tmp_path / "none"), a_board(tmp_path / "zero", serial="0" * 16),
                    a_board(tmp_path / "oem", dmi="03000200-0400-0500-0006-000700080009")):
        assert hardware.board_fingerprint(*nothing) is None


def identity(state, sysfs, profile=ScreenTinkerProfile, **section):
    """The identity part as the daemon builds it, from a loaded configuration."""
    cfg = state.parent / "agent.toml"
    lines = [f'[server]\nurl = "http://192.0.2.1"\nprofile = "{profile.name}"\n',
             f'[identity]\nstate_dir = "{state}"\n']
    lines += [f'{k} = "{v}"\n' for k, v in section.items()]
    cfg.write_text("".join(lines) + f'[runtime]\ndir = "{state.parent / "run"}"\n')
    config = load(str(cfg), {})

    class Reports:
        def unavailable(self, *a):
            raise AssertionError(a)

        def credentials(self, *a):
            raise AssertionError(a)

    return DeviceIdentity(config.identity, config.server, config.runtime.dir, profile=profile,
                          storage=Reports(), on_change=lambda: None, sysfs=sysfs)


def test_a_state_directory_copied_to_another_board_starts_a_fresh_identity_said_once(
        tmp_path, caplog):
    sysfs_a, _ = a_board(tmp_path / "a", serial=SERIAL_A)
    sysfs_b, _ = a_board(tmp_path / "b", serial=SERIAL_B)
    state_a, state_b = tmp_path / "a" / "state", tmp_path / "b" / "state"
    first = identity(state_a, sysfs_a)
    assert first.board == {"clone_check": "bound", "read_from": "board serial"}
    first.ids.handle(__import__("agent.identity.core", fromlist=["C"]).Registered(
        "t" * 32, "st-original", "123456"))
    original = first.device_id()
    assert original == "st-original"
    (state_a / "commands.json").write_text("{}")          # the first screen's ledger
    (state_a / "queue").mkdir()                            # and its queued uploads
    (state_a / "queue" / "00000001.seg").write_bytes(b"its screenshot")
    shutil.copytree(state_a, state_b)        # the card imaged
    with caplog.at_level(logging.INFO, logger="edge_agent"):
        clone = identity(state_b, sysfs_b)
    said = [r for r in caplog.records if getattr(r, "journal", {}).get("MESSAGE_ID")
            == MessageId.CARD_CLONED]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    text = said[0].getMessage()
    assert "made from another screen's card" in text and "device id ea-" in text, text
    assert "t" * 32 not in caplog.text, "never the token"
    assert clone.token() is None and clone.device_id() != original
    (tmp_path / "fresh").mkdir()
    assert clone.device_id() != identity(tmp_path / "fresh" / "state", sysfs_a).device_id()
    assert clone.ids.pairing_code() is None, "not the copied code: a code of its own"
    aside = sorted(n for n in os.listdir(state_b) if ".cloned-" in n)
    assert [n.split(".cloned-")[0] for n in aside] == [
        "commands.json", "credentials.json", "device_id", "queue"]
    assert not (state_b / "queue").exists() and not (state_b / "commands.json").exists()
    queue_aside = state_b / next(n for n in aside if n.startswith("queue."))
    assert (queue_aside / "00000001.seg").read_bytes() == b"its screenshot", "kept"
    assert json.loads((state_b / aside[1]).read_text())["token"] == "t" * 32, "kept, not deleted"
    assert clone.board["cloned_from"].startswith("ea-") and sorted(clone.board["kept_aside"]) == aside
    # the next start of the clone: a screen of its own, said in status, not in the journal
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="edge_agent"):
        again = identity(state_b, sysfs_b)
    assert again.device_id() == clone.device_id() and again.board["cloned_from"]
    assert not [r for r in caplog.records if getattr(r, "journal", {}).get("MESSAGE_ID")]
    # the original keeps its identity
    back = identity(state_a, sysfs_a)
    assert back.device_id() == original and back.token() == "t" * 32
    assert "cloned_from" not in back.board
    assert (state_a / "queue" / "00000001.seg").exists() and (state_a / "commands.json").exists()


def test_a_native_profiles_card_copied_keeps_the_token_aside_and_enrolls_anew(tmp_path):
    sysfs_a, _ = a_board(tmp_path / "a", serial=SERIAL_A)
    sysfs_b, _ = a_board(tmp_path / "b", serial=SERIAL_B)
    state_a, state_b = tmp_path / "a" / "state", tmp_path / "b" / "state"
    first = identity(state_a, sysfs_a, EdgeAgentProfile)
    Credentials(str(state_a)).save(first.device_id(), "s3cret-token")
    shutil.copytree(state_a, state_b)
    clone = identity(state_b, sysfs_b, EdgeAgentProfile)
    assert clone.token() is None and clone.device_id() != first.device_id()
    assert identity(state_a, sysfs_a, EdgeAgentProfile).token() == "s3cret-token"


def test_no_readable_serial_keeps_todays_behaviour_and_says_the_check_is_unavailable(tmp_path):
    sysfs, _ = a_board(tmp_path / "a")
    state = tmp_path / "a" / "state"
    first = identity(state, sysfs, EdgeAgentProfile)
    Credentials(str(state)).save(first.device_id(), "s3cret-token")
    copy = tmp_path / "b" / "state"
    shutil.copytree(state, copy)
    clone = identity(copy, sysfs, EdgeAgentProfile)
    assert clone.board == {"clone_check": "unavailable"} and not (copy / board.FILE).exists()
    assert clone.device_id() == first.device_id() and clone.token() == "s3cret-token"
    said = status._board_lines(clone.board)
    assert said and "clone       check unavailable" in said[0]
    assert D.judge_card({"verdict": "unavailable"}).verdict == D.INFO


def test_an_identity_configured_in_agent_toml_is_never_moved(tmp_path, caplog):
    sysfs_a, _ = a_board(tmp_path / "a", serial=SERIAL_A)
    sysfs_b, _ = a_board(tmp_path / "b", serial=SERIAL_B)
    state_a, state_b = tmp_path / "a" / "state", tmp_path / "b" / "state"
    identity(state_a, sysfs_a, EdgeAgentProfile, device_id="screen-1", token="s3cret-token")
    shutil.copytree(state_a, state_b)
    with caplog.at_level(logging.WARNING, logger="edge_agent"):
        clone = identity(state_b, sysfs_b, EdgeAgentProfile, device_id="screen-1",
                         token="s3cret-token")
    assert clone.board["clone_check"] == "cloned" and clone.board["configured"]
    assert "give this screen its own [identity] device_id and token" in caplog.text
    assert clone.token() == "s3cret-token"


def test_status_and_the_doctor_say_what_happened_and_what_to_do(tmp_path):
    doc = {"clone_check": "bound", "read_from": "board serial", "cloned_from": "ea-0123456789abcdef",
           "cloned_at": 1.8e9, "kept_aside": ["credentials.json.cloned-20270115-080000"],
           "todo": board.TODO}
    line, = status._board_lines(doc)
    assert line.startswith("clone       made from screen ea-0123456789abcdef's card")
    assert "credentials.json.cloned-20270115-080000" in line and "pairs as a new screen" in line
    assert status._board_lines({"clone_check": "bound", "read_from": "board serial"}) == []
    assert status._board_lines({**doc, "kept_aside": ["\x1b[2Jx"]})[0].count("\x1b") == 0
    step = D.judge_card({"verdict": "bound", **doc})
    assert step.verdict == D.INFO and "ea-0123456789abcdef" in step.said and step.todo
    cloned = D.judge_card({"verdict": "cloned", "read_from": "board serial"})
    assert cloned.verdict == D.WARN and "systemctl restart edge-agent" in cloned.todo
    assert D.judge_card({"verdict": "bound", "read_from": "board serial"}).verdict == D.OK


def test_the_doctor_judges_a_copied_card_before_the_agent_starts(tmp_path):
    from agent.app import doctor_probes
    sysfs_a, _ = a_board(tmp_path / "a", serial=SERIAL_A)
    sysfs_b, _ = a_board(tmp_path / "b", serial=SERIAL_B)
    state = tmp_path / "state"
    board.check(str(state), hardware.board_fingerprint(sysfs_a))

    class Cfg:
        class identity:
            state_dir = str(state)

        class debug:
            sysfs = sysfs_b
    assert doctor_probes.card(Cfg)["verdict"] == "cloned"
    Cfg.debug.sysfs = sysfs_a
    assert doctor_probes.card(Cfg)["verdict"] == "bound"


# -- end to end: a second board made from the first one's card ---------------------------
def _status_text(agent_python, cfg, workdir) -> str:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "RUNTIME_DIRECTORY": str(workdir / "run")}
    return subprocess.run([agent_python, "-m", "agent", "status", "--config", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=30).stdout


def _code(agent) -> str | None:
    return (agent.status().get("pairing") or {}).get("code")


@pytest.fixture
def boards(tmp_path, agent_python):
    """start(fleet, name, serial, **sections): an agent on a board of its own (its
    serial in a fixture tree) in tmp_path/name, unpaired; every one stopped at the end."""
    started = []

    def start(fleet, name, serial, **sections):
        workdir = tmp_path / name
        cfg = agent_config(fleet, workdir, identity={"device_id": None, "token": None},
                           debug={"sysfs_root": a_board(workdir, serial=serial)[0]}, **sections)
        started.append(AgentProcess(agent_python, cfg, workdir).start())
        return started[-1], cfg

    yield start
    for agent in started:
        agent.stop()


def _said_once(agent) -> None:
    text = agent.log_text()
    assert text.count("this card was made from another screen's card") == 1, text[-3000:]
    assert "Traceback" not in text


@pytest.mark.netns
def test_a_card_copied_to_another_board_pairs_as_a_new_screen_with_the_reference_server(
        fleet, boards, agent_python, tmp_path):
    """Before: the second board came online as the first (same device id, same token),
    and the two took each other's place on the server."""
    server = fleet(devices={})
    first, _ = boards(server, "a", SERIAL_A)
    code = wait_for(lambda: _code(first), 15, what="a pairing code")
    assert server.pair(code).returncode == 0
    first.wait_live(15)
    original = first.status()["device_id"]
    first.stop()
    # a log queued on the first screen while its agent is stopped: that screen's to send
    r = subprocess.run([agent_python, "-m", "agent", "enqueue", "--kind", "log", "-",
                        "--config", str(first.config)], input=b"the first screen's log\n",
                       capture_output=True, timeout=60, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    shutil.copytree(tmp_path / "a" / "state", tmp_path / "b" / "state")   # the card imaged
    second, cfg_b = boards(server, "b", SERIAL_B)
    code_b = wait_for(lambda: _code(second), 15, what="the second board's own code")
    assert second.status()["device_id"] != original
    assert server.pair(code_b).returncode == 0, "a code the server can claim"
    second.wait_live(15)
    _said_once(second)
    said = _status_text(agent_python, cfg_b, tmp_path / "b")
    assert f"clone       made from screen {original}'s card" in said, said
    # the original keeps its identity, and both are screens of the server's
    again, _ = boards(server, "a", SERIAL_A)
    again.wait_live(15)
    assert again.status()["device_id"] == original and _code(again) is None
    assert server.device(original) and server.device(second.status()["device_id"])
    assert "made from another screen" not in again.log_text()
    # the log queued on the first screen reached the server as the first screen's only
    wait_for(lambda: server.device(original).get("uploads") == 1, 15, what="its log delivered")
    assert server.device(second.status()["device_id"]).get("uploads", 0) == 0, \
        "the first screen's upload was sent as the clone's"


@pytest.fixture
def st19(netns, tmp_path):
    why = peer.unavailable("1.9")
    if why:
        pytest.fail(f"the real ScreenTinker 1.9 server cannot run here: {why}", pytrace=False)
    st = peer.ScreenTinkerServer(tmp_path, "1.9", ping_interval_s=2.0, ping_timeout_s=2.0)
    st.start()

    class Url:   # what agent_config asks of a server
        url = st.url
        devices: dict = {}
    st.Url = Url
    yield st
    st.stop()


def _paired(st, agent) -> str:
    wait_for(lambda: (agent.status().get("pairing") or {}).get("state") == "paired", 15,
             what="paired")
    return agent.status()["device_id"]


@pytest.mark.netns
def test_a_card_copied_to_another_board_pairs_as_a_new_screen_with_screentinker_1_9(
        st19, boards, agent_python, tmp_path):
    """Before: the second board came online with the first's identity (registered with
    its token), or showed its spent code, 404 when claimed."""
    st = st19
    first, _ = boards(st.Url, "a", SERIAL_A, server={"profile": "screentinker"})
    code = wait_for(lambda: _code(first), 15, what="a pairing code")
    row = st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", code.replace("-", ""))[0]
    st.pair(code)
    assert _paired(st, first) == row["id"]
    first.stop()
    shutil.copytree(tmp_path / "a" / "state", tmp_path / "b" / "state")
    second, cfg_b = boards(st.Url, "b", SERIAL_B, server={"profile": "screentinker"})
    code_b = wait_for(lambda: _code(second), 15, what="the second board's own code")
    assert code_b != code
    row_b = st.wait_row("SELECT * FROM devices WHERE pairing_code = ?", code_b.replace("-", ""))[0]
    assert row_b["id"] != row["id"]
    st.pair(code_b, name="Second screen")      # a code the server knows: claimed
    assert _paired(st, second) == row_b["id"]
    _said_once(second)
    assert "made from screen" in _status_text(agent_python, cfg_b, tmp_path / "b")
    again, _ = boards(st.Url, "a", SERIAL_A, server={"profile": "screentinker"})
    assert _paired(st, again) == row["id"], "the original keeps its identity"
    assert st.device(row["id"])["user_id"] and st.device(row_b["id"])["user_id"]


@pytest.mark.parametrize("cloned", [{"kept_aside": 5}, {"kept_aside": True},
                                    {"kept_aside": "abc"}, {"at": 1e18}, {"at": True}])
def test_a_board_json_of_any_shape_never_stops_the_start_or_status(tmp_path, cloned):
    """board.json is the agent user's to write: an odd cloned_from is said as unknown, never
    a TypeError at every start (check runs before the identity) nor in `status`."""
    cloned = {"device_id": "screen-1", **cloned}
    (tmp_path / board.FILE).write_text(json.dumps({"board": "f" * 32, "cloned_from": cloned}))
    for found in (None, ("board serial", "f" * 32)):
        said = board.check(str(tmp_path), found)
        assert said["kept_aside"] == [] or said["kept_aside"] == ["abc"]
        assert "made from screen screen-1's card" in status._board_lines(said)[0]
    # the status file is the agent user's too: the same fields, as they come
    line = status._board_lines({"cloned_from": "x", "cloned_at": cloned.get("at"),
                                "kept_aside": cloned.get("kept_aside")})[0]
    assert "(found ?)" in line or "(found 20" in line


@pytest.mark.parametrize("text", ['["not", "a", "board"]', "{not json", "1" * 500])
def test_a_damaged_board_file_is_read_by_the_one_loader_and_said(tmp_path, caplog, text):
    """board.json goes through fsutil.load_state as every state file does: any damage is
    None (the board bound again) and said once; a list was taken silently."""
    (tmp_path / board.FILE).write_text(text)
    with caplog.at_level(logging.WARNING):
        assert board.read(str(tmp_path)) is None
    assert "the board is bound again" in caplog.text, caplog.text


def test_a_part_built_after_the_identity_hears_its_changes_by_subscribing(tmp_path):
    """#51: no two-step bind. The link and the uploads subscribe; a re-registration
    forgets the profile's code before the link drops the credentials, and every
    subscriber hears what it asked for (none: nothing fails)."""
    sysfs, _ = a_board(tmp_path, serial=SERIAL_A)
    ident = identity(tmp_path / "state", sysfs)
    ident.ids.hooks.reregister("alone")   # nobody subscribed yet: nothing to tell
    assert ident.pairing() is None        # no profile holds a code yet
    heard = []

    class Profile:
        pairing_code, CODE_EXPIRY, CLAIM_WHERE = "123456", "10 min", "the dashboard"

        def forget_pairing(self):
            heard.append("forget")

    ident.subscribe(reregister=lambda why: heard.append(f"drop {why}"),
                    pause_link=lambda: heard.append("pause"), pairs=Profile(),
                    resume_uploads=lambda: heard.append("uploads 1"))
    ident.subscribe(resume_uploads=lambda: heard.append("uploads 2"))
    hooks = ident.ids.hooks
    hooks.reregister("refused")
    hooks.pause_link()
    hooks.resume_uploads()
    hooks.resume_link()   # no subscriber: nothing
    assert heard == ["forget", "drop refused", "pause", "uploads 1", "uploads 2"]
    assert ident.pairing()["code"] == "123-456"   # the profile the link subscribed with
