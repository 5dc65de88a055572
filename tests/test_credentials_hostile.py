"""Credentials on hostile ground: a token no header can carry, at every door it could
come in by, and a state partition that cannot take the token when the pairing answer
arrives (a real loop-mounted ext4, filled to its last block, and the reference server)."""
import errno
import http.server
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

from agent.identity import core as C
from agent.identity.credentials import Credentials
from agent.identity.enroller import BadAnswer, Enroller
from agent.base.identifiers import TOKEN_RULE, token_problem, usable_device_id, usable_token
from agent.identity.service import IdentityService
from agent.link.inbox import Malformed
from agent.link.profiles import ProfileContext, ScreenTinkerProfile
from agent.uploads.link_sender import LinkUploadSender
from agent.uploads.schedule import AUTH, OK, PERMANENT, Outcome
from agent.config.policies import UploadPolicy
from agent.uploads.sender import UploadSender
from agent.uploads.store import Item, QueueStore
from agent.uploads.worker import UploadWorker
from devtools.card import SdCard
from devtools.harness import REPO, AgentProcess, agent_config, terminate, wait_for
from tests.test_enrollment import Hostile, code, hostile  # noqa: F401 (a fixture)
from tests.test_link_inputs import HostilePeer

BAD = "tök€n"
NESTED = b'{"event": "play_start", "content_id": ' + b"[" * 995 + b"]" * 995 + b"}"


def test_the_token_rule_is_rfc_6750s_b64token_whole_and_bounded():
    for good in ("s3cret-token", "a" * 4096, "abc+/~._-XYZ09==", "x="):
        assert usable_token(good), good
    for bad in (BAD, "tök", "a b", "a\n", "abc\n", "=abc", "a=b", "", "a" * 4097, "a\x00b",
                None, 42, b"bytes"):
        assert not usable_token(bad), repr(bad)
    assert token_problem("identity.token", BAD) == f"identity.token: {TOKEN_RULE}"
    assert BAD not in token_problem("token", BAD), "the error never quotes the value"
    assert not usable_device_id("screen-1\n"), "a trailing newline is not part of an id"


@pytest.mark.parametrize("how", ["file", "environment"])
def test_check_config_refuses_a_non_ascii_token_in_one_line_naming_the_key(tmp_path, how):
    token_line = f'token = "{BAD}"\n' if how == "file" else ""
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[server]\nurl = "http://192.0.2.1"\n[identity]\ndevice_id = "screen-1"\n'
                   f'{token_line}state_dir = "{tmp_path / "state"}"\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if how == "environment":
        env["EDGE_AGENT_IDENTITY_TOKEN"] = BAD
    r = subprocess.run([sys.executable, "-m", "agent", "check-config", "--config", str(cfg)],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"edge-agent: config error: identity.token: {TOKEN_RULE}"]


def test_a_credentials_file_with_a_non_ascii_token_is_set_aside_not_used(tmp_path, caplog):
    """Written by a build whose rule was looser: at the next start it is kept aside with
    one line saying why, and the device enrolls again instead of crash-looping."""
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"device_id": "dev", "token": BAD}), encoding="utf-8")
    with caplog.at_level(logging.INFO, "edge_agent.identity"):
        ids = IdentityService.load("dev", Credentials(str(tmp_path)), None, False, pairs_in_link=False)
    assert ids.current.token is None and not path.exists()
    aside = [n for n in os.listdir(tmp_path) if n.startswith("credentials.json.corrupt-")]
    assert len(aside) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"credentials file {path} is unusable (token: {TOKEN_RULE}); kept aside "
                      f"as {tmp_path / aside[0]}, enrolling again"]
    assert BAD not in caplog.text


@pytest.mark.parametrize("answer, error", [
    ({"status": "paired", "token": BAD}, f"paired answer: token: {TOKEN_RULE}"),
    ({"status": "paired", "token": "s3cret\r\nX-Evil: 1"}, "paired answer: token: "),
])
def test_a_pairing_answer_with_a_token_no_header_can_carry_is_refused(
        netns, hostile, tmp_path, answer, error):  # noqa: F811
    Hostile.answer = (200, json.dumps(answer).encode(), {})
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    e.core.code = code(0.0)
    with pytest.raises(BadAnswer) as info:
        e._poll()
    assert str(info.value).startswith(error) and "\n" not in str(info.value)


@pytest.mark.parametrize("secret", ["é" * 20, "s" * 20 + "\n"])
def test_an_enroll_answer_whose_poll_secret_no_header_can_carry_is_refused(
        netns, hostile, tmp_path, secret):  # noqa: F811
    """The poll secret goes back in the Authorization header of every poll: before, it
    was accepted and each poll died of UnicodeEncodeError, out of the enrollment loop."""
    Hostile.answer = (200, json.dumps({"pairing_code": "123456", "poll_secret": secret,
                                       "expires_in_s": 600}).encode(), {})
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    with pytest.raises(BadAnswer, match="poll_secret"):
        e._request_code()


def test_an_answer_nested_past_the_json_parsers_depth_is_a_bad_answer(
        netns, hostile, tmp_path):  # noqa: F811
    Hostile.answer = (200, b"[" * 8000 + b"]" * 8000, {})
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    with pytest.raises(BadAnswer, match="not JSON"):
        e._request_code()


def test_a_screentinker_registration_with_a_non_ascii_token_is_not_kept():
    kept, posted = [], []
    profile = ScreenTinkerProfile(ProfileContext(
        device_id=lambda: "local-1", token=lambda: None,
        on_token=lambda token, device_id=None, pairing_code=None: kept.append(token)))
    registered = profile.handlers(posted.append)["device:registered"]
    registered(None, {"device_id": "st-1", "device_token": BAD, "status": "provisioning"})
    assert kept == [] and posted == [Malformed("device:registered (device_token)")]
    registered(None, {"device_id": "st-1", "device_token": "ab" * 32, "status": "provisioning"})
    assert kept == ["ab" * 32]


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Recorder.seen.append((self.path, dict(self.headers), body))
        # as the contract says: the key echoed, the receipt of the server
        answer = json.dumps({"ok": True, "id": self.headers.get("Idempotency-Key")}).encode()
        if self.path.endswith("/proof-of-play"):
            answer = json.dumps({"acked": [r["id"] for r in json.loads(body)["records"]]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *a):
        pass


@pytest.fixture
def recorder(netns):
    Recorder.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_uploads_given_a_token_no_header_can_carry_hold_the_queue_and_never_raise(
        recorder, tmp_path, caplog):
    """The token bypassed the rule (memory, an old build's file): the uploads loop goes
    on, the queue is held as a credentials problem, nothing is sent, nothing is lost."""
    store = QueueStore(str(tmp_path / "queue"), UploadPolicy())
    store.enqueue("screenshot", b"\xff\xd8jpeg")
    store.enqueue("proof-of-play", b'{"event": "play_start", "content_id": "c1"}')
    identity = ["screen-1", BAD]
    sender = UploadSender(f"http://127.0.0.1:{recorder.server_port}", lambda: tuple(identity))
    worker = UploadWorker(store, sender, UploadPolicy())
    with caplog.at_level(logging.WARNING):
        worker._work_once()   # before: UnicodeEncodeError, the loop's death
    assert worker.scheduler.hold_reason == AUTH and Recorder.seen == []
    assert store.stats()["items"] == 2 and store.stats().get("dead_letter", 0) == 0
    held = [r.getMessage() for r in caplog.records if "uploads held" in r.getMessage()]
    assert len(held) == 1 and f"token: {TOKEN_RULE}; not sent" in held[0] and BAD not in caplog.text
    # new credentials end the hold, and everything goes
    identity[1] = "s3cret-token"
    worker.link_up()
    worker._work_once()
    assert store.stats()["items"] == 0 and len(Recorder.seen) == 2
    assert {h.get("Authorization") for _, h, _ in Recorder.seen} == {"Bearer s3cret-token"}


def test_an_item_whose_header_value_cannot_be_encoded_is_dead_lettered_with_its_reason(recorder):
    sender = UploadSender(f"http://127.0.0.1:{recorder.server_port}", ("screen-1", "s3cret-token"))
    assert sender.send_one(Item("ïd", "screenshot", b"x", 0, 0.0, 0.0)) == \
        Outcome(PERMANENT, "Idempotency-Key: not printable ASCII, cannot be sent in a header")
    outcomes = sender.send_batch([Item("a\r\nX-Evil: 1", "proof-of-play", b"{}", 0, 0.0, 0.0),
                                  Item("b1", "proof-of-play", b'{"event": "play_end"}', 0, 0.0, 0.0)])
    assert outcomes["a\r\nX-Evil: 1"].kind == PERMANENT and outcomes["b1"].kind == OK
    assert len(Recorder.seen) == 1 and b'"b1"' in Recorder.seen[0][2]


def test_a_proof_of_play_record_nested_past_the_json_depth_does_not_kill_the_uploads(recorder):
    """Nested so deep that the parser takes it and the encoder does not (before: a
    RecursionError out of the uploads loop, every round, until the loop stayed down)."""
    sender = UploadSender(f"http://127.0.0.1:{recorder.server_port}", ("screen-1", "s3cret-token"))
    deep = Item("d1", "proof-of-play", b"[" * 995 + b"]" * 995, 0, 0.0, 0.0)
    deeper = Item("d2", "proof-of-play", NESTED * 10, 0, 0.0, 0.0)
    outcomes = sender.send_batch([deep, deeper])
    assert {k: o.kind for k, o in outcomes.items()} == {"d1": OK, "d2": OK}
    records = json.loads(Recorder.seen[0][2])["records"]
    assert [r["id"] for r in records] == ["d1", "d2"] and isinstance(records[0]["record"], str)


def test_an_upload_the_link_cannot_encode_is_dead_lettered_not_a_dead_loop():
    class NoRunner:
        def deliver(self, request):
            raise AssertionError("nothing may be sent")

    profile = ScreenTinkerProfile(ProfileContext(device_id=lambda: "st-1", token=lambda: "t" * 20))
    sender = LinkUploadSender(NoRunner(), profile)
    outcome = sender.send_one(Item("n1", "proof-of-play", b'{"event": "play_start", "x": ' + b"[" * 5000,
                                   0, 0.0, 0.0))
    assert outcome.kind == PERMANENT and "RecursionError" in outcome.detail


# -- a state partition that cannot take the token ------------------------------------
def fill(directory) -> str:
    """Fills the file system under ``directory`` to its last block a file may have,
    root's reserve included (the tests run as root). Allocated, not written: delayed
    allocation cannot hand blocks back later, and it takes no time."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        end = 0
        for size in (1 << 20, 4096):
            while True:
                try:
                    os.posix_fallocate(fd, end, size)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
                end += size
        os.fsync(fd)
    finally:
        os.close(fd)
    probe = os.path.join(directory, "probe")
    with pytest.raises(OSError) as full:
        with open(probe, "wb") as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
    if os.path.exists(probe):
        os.unlink(probe)
    assert full.value.errno == errno.ENOSPC
    return path


@pytest.fixture
def card(tmp_path):
    with SdCard(tmp_path, size_mb=16) as c:
        yield c


def test_the_shell_on_a_full_card_keeps_the_token_and_writes_it_when_space_returns(card):
    state = card.mountpoint / "state"
    state.mkdir()
    creds = Credentials(str(state))
    ids = IdentityService.load("dev", creds, None, False, pairs_in_link=False)
    filler = fill(str(card.mountpoint))
    ids.handle(C.Enrolled("s3cret-token", generation=0))
    assert ids.current.token == "s3cret-token"
    storage = ids.storage()
    assert storage["stored"] is False and storage["error"] == os.strerror(errno.ENOSPC)
    assert not os.path.exists(creds.path)
    assert not [n for n in os.listdir(state) if n.startswith(".credentials")], "no temp file left"
    os.unlink(filler)
    wait_for(lambda: ids.storage() is None, 10, what="the credentials written")
    wait_for(lambda: ids._retry is None, 2, what="no retry left set once written")
    card.power_cut()   # durably: what a power cut keeps
    assert Credentials(str(state)).load("dev") == "s3cret-token"
    assert oct(os.stat(creds.path).st_mode & 0o777) == "0o600"


def test_a_revoke_on_a_read_only_card_does_not_raise_and_is_carried_out_later(card):
    state = card.mountpoint / "state"
    state.mkdir()
    creds = Credentials(str(state))
    creds.save("dev", "s3cret-token")
    ids = IdentityService.load("dev", creds, None, False, pairs_in_link=False)
    subprocess.run(["mount", "-o", "remount,ro", str(card.mountpoint)], check=True)
    try:
        ids.handle(C.Revoked())
        assert ids.current.token is None
        assert ids.storage()["pending"] == "remove"
        assert ids.storage()["error"] == os.strerror(errno.EROFS)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(card.mountpoint)], check=True)
    wait_for(lambda: ids.storage() is None, 10, what="the credentials removed")
    assert not os.path.exists(creds.path)


def _paired_onto_a_full_card(card, fleet, spawn_agent, agent_python, tmp_path):
    """An agent that enrolls on the card, which is filled to its last block before the
    operator pairs it: (server, state dir, config, agent, the file filling the card)."""
    server = fleet(devices={})
    state = card.mountpoint / "state"
    cfg = agent_config(server, tmp_path, identity={"device_id": None, "token": None,
                                                   "state_dir": str(state)})
    agent = spawn_agent(agent_python, cfg)
    code_shown = wait_for(lambda: (agent.status().get("pairing") or {}).get("code"), 15,
                          what="a pairing code")
    filler = fill(str(card.mountpoint))
    assert server.pair(code_shown).returncode == 0
    return server, state, cfg, agent, filler


@pytest.mark.netns
def test_pairing_onto_a_full_card_comes_online_and_stores_the_token_when_space_returns(
        card, netns, fleet, spawn_agent, agent_python, tmp_path):
    server, state, cfg, agent, filler = _paired_onto_a_full_card(card, fleet, spawn_agent,
                                                                 agent_python, tmp_path)
    agent.wait_live(15, connection=1)   # the token is in use although the card refused it
    creds = state / "credentials.json"
    assert not creds.exists()
    wait_for(lambda: (agent.status().get("credentials") or {}).get("stored") is False, 5,
             what="status saying the credentials are not stored")
    assert "credentials not stored yet (No space left on device)" in agent.log_text()
    os.unlink(filler)
    wait_for(creds.exists, 40, what="the credentials written once space returned")
    wait_for(lambda: agent.status().get("credentials") is None, 5, what="status clear again")
    assert oct(os.stat(creds).st_mode & 0o777) == "0o600"
    doc = json.loads(creds.read_text())
    assert doc["device_id"] == agent.status()["device_id"]
    assert doc["token"] not in agent.log_text(), "the token leaked"
    assert "Traceback" not in agent.log_text()
    # the right bytes, durably: after a power cut the card still has them, and a fresh
    # agent comes online with them, no pairing
    agent.stop()
    card.power_cut()
    assert json.loads(creds.read_text()) == doc
    again = spawn_agent(agent_python, cfg)
    again.wait_live(15, connection=1)
    assert (again.status().get("pairing") or {}).get("code") is None
    assert server.device(doc["device_id"])["refused"] == 0


@pytest.mark.netns
def test_a_restart_before_the_card_takes_the_token_does_not_cost_the_pairing(
        card, netns, fleet, spawn_agent, agent_python, tmp_path):
    """The token lives only in memory while the card is full. The pairing answer's
    poll secret stays in the runtime directory (tmpfs) until the token is stored, so an
    agent restarted meanwhile asks the server again instead of showing a new code."""
    server, state, cfg, agent, filler = _paired_onto_a_full_card(card, fleet, spawn_agent,
                                                                 agent_python, tmp_path)
    agent.wait_live(15, connection=1)
    assert agent.stop() == 0
    again = spawn_agent(agent_python, cfg)   # the card is still full
    again.wait_live(20)
    assert (again.status().get("pairing") or {}).get("state") == "paired"
    assert "requesting a new one" not in again.log_text()
    os.unlink(filler)
    creds = state / "credentials.json"
    wait_for(creds.exists, 40, what="the credentials written once space returned")
    wait_for(lambda: not (tmp_path / "run" / "pairing.json").exists(), 5,
             what="the poll secret gone once the token is on the card")


# -- a server that re-issues the token on every message: what reaches the card ----------
WINDOW_S = 30.0


def _io(pid: int) -> dict:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


@pytest.fixture
def tmpfs(tmp_path):
    """A directory on tmpfs, as a screen's runtime directory is (and here the agent's
    log too): what is written there never reaches a card."""
    path = tmp_path / "tmpfs"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(path)], check=True)
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.netns
def test_a_screentinker_that_reissues_the_token_2000_times_a_connection_costs_the_card_its_budget(
        card, tmpfs, netns, agent_python, tmp_path):
    """2,000 device:registered with alternating tokens answer each registration, each
    as a claimed screen's (``online``: before, a claim followed each token, written at
    once: 2,984 fsyncs in 30 s), and the connection is dropped after them, so every
    reconnection brings 2,000 more.
    Counted where the card is, not by sampling files: the real agent's fsyncs (strace,
    with the path of each) and its /proc/PID/io write_bytes, over the window; the state
    directory on a loop-mounted ext4, the runtime directory and the log on tmpfs. The
    budget (identity/core.py): WRITE_BURST writes at once, then one each WRITE_EVERY_S,
    each write a file and its directory synced."""
    server = HostilePeer(tmp_path, "--answers-per-register", "2000", "--answer-status", "online")
    state = card.mountpoint / "state"
    cfg = agent_config(server, tmpfs, server={"profile": "screentinker"},
                       identity={"device_id": None, "token": None, "state_dir": str(state)})
    agent = AgentProcess(agent_python, cfg, tmpfs).start()
    trace = tmpfs / "fsyncs.txt"
    strace = None
    try:
        wait_for(lambda: server.state()["answers"] >= 1, 20, what="a first registration answered")
        strace = subprocess.Popen(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync",
                                   "-o", str(trace), "-p", str(agent.pid)],
                                  stderr=subprocess.DEVNULL)
        wait_for(lambda: trace.exists() and trace.stat().st_size >= 0, 5, what="strace attached")
        os.sync()
        io_before, card_before = _io(agent.pid), card.bytes_written()
        answers_before = server.state()["answers"]
        threading.Event().wait(WINDOW_S)
        io_after, card_after = _io(agent.pid), card.bytes_written()
        answers = server.state()["answers"] - answers_before
        strace.send_signal(2)
        strace.wait(10)
    finally:
        if strace is not None and strace.poll() is None:
            strace.kill()
        assert agent.alive(), agent.log_text()[-3000:]
        terminate(agent.proc)
        terminate(server.proc)
        server.log.close()
    calls = [line for line in trace.read_text().splitlines() if "sync(" in line]
    on_card = [line for line in calls if str(card.mountpoint) in line]
    written = io_after["write_bytes"] - io_before["write_bytes"]
    writes_allowed = C.WRITE_BURST + WINDOW_S / C.WRITE_EVERY_S + 1
    print(f"{answers} registrations answered in {WINDOW_S:.0f} s: {len(calls)} fsyncs "
          f"({len(on_card)} on the card), write_bytes {written}, card {card_after - card_before}")
    assert answers >= 4000, "the flood reached the agent"
    assert len(calls) <= 2 * writes_allowed, "\n".join(calls[:20])
    assert written <= writes_allowed * 2 * 4096 + 64 * 1024, f"{written} bytes to the card"
    # ext4's journal commit included: a few blocks a sync
    assert card_after - card_before <= writes_allowed * 2 * 16384 + 64 * 1024
    assert "credentials held back" in agent.log_text()
    assert "Traceback" not in agent.log_text()
