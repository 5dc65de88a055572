"""Enrollment rules with a fake clock, credentials on a real disk, hostile HTTP answers."""
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agent.base.clock import FakeClock
from agent.identity import device
from agent.identity.credentials import Credentials
from agent.identity.enroller import BadAnswer, CodeGone, Enroller
from agent.identity.enrollment import (NEED_CODE, PAIRED, WAITING, CodeUnknown, EnrollmentCore,
                                       Failed, GotCode, GotToken, NoEnrollment, PairingCode,
                                       PollPairing, RequestCode, Retry, Started, StillPending,
                                       Tick, TokenRefused)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def code(now, ttl=600.0):
    return PairingCode("483112", "483-112", now + ttl, "s" * 32)


def test_a_screen_with_nothing_to_enroll_loads_no_enrollment_at_its_start(tmp_path):
    """A token in the configuration: `edge-agent run`'s imports and the identity part
    load neither the enroller nor its core (#51: the start's imports); without one, the
    identity part builds the enroller as before."""
    script = """if True:
        import sys
        import agent.cli, agent.app.daemon, agent.uploads.store
        from agent.config.load import load
        from agent.identity.part import DeviceIdentity
        from agent.link.profiles import EdgeAgentProfile
        from types import SimpleNamespace
        config = load(sys.argv[1], {})
        storage = SimpleNamespace(unavailable=print, credentials=print)
        part = DeviceIdentity(config.identity, config.server, config.runtime.dir,
                              profile=EdgeAgentProfile, storage=storage,
                              on_change=lambda: None, sysfs=sys.argv[2])
        print(type(part.enroller).__name__, sorted(m for m in sys.modules
                                                   if m.startswith("agent.identity.enroll")))
    """
    for name, token in (("preprovisioned", 'token = "' + "t" * 32 + '"\n'), ("enrolls", "")):
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(f'[server]\nurl = "http://192.0.2.1"\nprofile = "edge-agent"\n'
                       f'[identity]\nstate_dir = "{tmp_path / name}"\n'
                       f'device_id = "screen-1"\n{token}'
                       f'[runtime]\ndir = "{tmp_path / name / "run"}"\n')
        (tmp_path / "sys").mkdir(exist_ok=True)
        out = subprocess.run([sys.executable, "-c", script, str(cfg), str(tmp_path / "sys")],
                             capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        said = out.stdout.strip()
        if name == "preprovisioned":
            assert said == "NoneType []", out.stdout + out.stderr
        else:
            assert said.startswith("Enroller ") and "agent.identity.enrollment" in said, \
                out.stdout + out.stderr


def test_the_same_code_is_shown_until_it_expires_then_a_new_one_is_requested():
    clock = FakeClock()
    core = EnrollmentCore()
    core.handle(Started(clock.now))
    assert core.handle(Tick(clock.now)) == [RequestCode()]
    assert core.handle(Tick(clock.now)) == []  # one request in flight at a time
    core.handle(GotCode(clock.now, code(clock.now, ttl=60)))
    requests_seen = []
    while clock.now < 1000 + 59:
        clock.advance(0.5)
        for action in core.handle(Tick(clock.now)):
            requests_seen.append(action)
            core.handle(StillPending(clock.now))
    assert set(requests_seen) == {PollPairing()}
    assert 9 <= len(requests_seen) <= 15  # every ~5 s, jittered: no hammering
    assert core.code.display == "483-112"
    clock.advance(1.5)
    assert core.handle(Tick(clock.now)) == [RequestCode()]
    assert core.state == NEED_CODE


def test_errors_back_off_and_a_refused_token_waits_before_enrolling_again():
    clock = FakeClock()
    core = EnrollmentCore()
    core.handle(Started(clock.now))
    delays = []
    for _ in range(8):
        clock.advance(core.deadline() - clock.now)
        assert core.handle(Tick(clock.now)) == [RequestCode()]
        [retry] = core.handle(Failed(clock.now, "HTTP 500"))
        assert isinstance(retry, Retry) and core.deadline() == clock.now + retry.delay_s
        delays.append(retry.delay_s)
    assert max(delays) <= 120 and sum(delays) > 30
    core.handle(GotCode(clock.now, code(clock.now)))
    core.handle(GotToken("t" * 32))
    assert core.state == PAIRED and core.handle(Tick(clock.now + 1e6)) == []
    core.handle(TokenRefused(clock.now, hold_s=20))
    assert core.handle(Tick(clock.now + 19)) == []
    assert core.handle(Tick(clock.now + 20)) == [RequestCode()]


def test_a_saved_code_survives_a_restart_while_valid():
    core = EnrollmentCore()
    core.handle(Started(100.0, code(100.0, ttl=30)))
    assert core.state == WAITING and core.handle(Tick(100.0)) == [PollPairing()]
    stale = EnrollmentCore()
    stale.handle(Started(200.0, code(100.0, ttl=30)))
    assert stale.handle(Tick(200.0)) == [RequestCode()]


def test_credentials_are_private_and_a_corrupt_file_is_kept_aside(tmp_path, caplog):
    creds = Credentials(str(tmp_path))
    assert creds.load("dev") is None
    creds.save("dev", "t" * 40)
    assert oct(os.stat(creds.path).st_mode & 0o777) == "0o600"
    assert creds.load("dev") == "t" * 40
    assert creds.load("other-device") is None
    with open(creds.path, "wb") as f:
        f.write(b'{"device_id": "dev", "tok')
    assert creds.load("dev") is None
    assert any(n.startswith("credentials.json.corrupt-") for n in os.listdir(tmp_path))
    assert "t" * 40 not in caplog.text


def test_device_id_is_stable_and_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "machine_id", lambda: "abc123")
    monkeypatch.setattr(device, "board_serial", lambda: "10000000deadbeef")
    first = device.load_or_create(str(tmp_path))
    assert first.startswith("ea-") and len(first) == 19
    monkeypatch.setattr(device, "machine_id", lambda: "changed")
    assert device.load_or_create(str(tmp_path)) == first  # the file wins
    os.unlink(tmp_path / "device_id")
    monkeypatch.setattr(device, "machine_id", lambda: "abc123")
    assert device.load_or_create(str(tmp_path)) == first  # and derivation is stable


def test_a_device_id_file_with_bytes_that_are_not_text_is_derived_again(tmp_path, monkeypatch):
    """A bit a worn card flipped must cost a warning, not a crash loop at every start."""
    monkeypatch.setattr(device, "machine_id", lambda: "abc123")
    monkeypatch.setattr(device, "board_serial", lambda: "10000000deadbeef")
    (tmp_path / "device_id").write_bytes(b"ea-\xff\xfe1234\n")
    value = device.load_or_create(str(tmp_path))
    assert value.startswith("ea-") and len(value) == 19
    assert (tmp_path / "device_id").read_text() == value + "\n"


WRITER = """
import sys
from agent.identity.credentials import Credentials
c = Credentials(sys.argv[1])
i = 0
while True:
    c.save("dev", ("%08d" % i) * 8)
    i += 1
"""


def test_kill_9_during_the_credential_write_leaves_old_or_new_never_broken(tmp_path):
    creds = Credentials(str(tmp_path))
    creds.save("dev", "0" * 64)
    for n in range(50):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO})
        time.sleep(0.05 + (n % 7) * 0.03)
        p.send_signal(signal.SIGKILL)
        p.wait()
        token = creds.load("dev")
        assert token is not None and len(token) == 64, f"broken after kill {n}"
    assert not [n for n in os.listdir(tmp_path) if "corrupt" in n]


class Hostile(http.server.BaseHTTPRequestHandler):
    answer = (200, b"{}", {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    do_GET = do_POST

    def _answer(self):
        status, body, headers = Hostile.answer
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def hostile():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


@pytest.mark.parametrize("answer, error", [
    ((200, b"<html>not json</html>", {}), "not JSON"),
    ((200, b"[1, 2]", {}), "not a JSON object"),
    ((200, b'{"pairing_code": "12345"}', {}), "6-digit"),
    ((200, b'{"pairing_code": "123456", "poll_secret": "short", "expires_in_s": 600}', {}), "poll_secret"),
    ((200, b" " * (50 * 1024 * 1024), {}), "too large"),
    ((302, b"", {"Location": "http://203.0.113.9/steal"}), "redirect"),
    ((500, b"oops", {}), "HTTP 500"),
])
def test_hostile_enroll_answers_are_errors_not_crashes(hostile, tmp_path, answer, error):
    Hostile.answer = answer
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    with pytest.raises(BadAnswer, match=error):
        e._request_code()
    assert not os.path.exists(tmp_path / "credentials.json")


def test_expired_code_is_code_gone(hostile, tmp_path):
    Hostile.answer = (404, b"", {})
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    e.core.code = code(0.0)
    with pytest.raises(CodeGone):
        e._poll()


def test_an_unpair_while_the_pairing_answer_is_on_its_way_is_not_undone(tmp_path):
    """The answer that carries a token arrives just after the operator (or the server)
    unpaired the screen: the token must not be stored, nor the revoke undone."""
    import threading
    from agent.identity.core import Enrolled, Revoked
    from agent.identity.enrollment import PollPairing
    from agent.identity.service import Hooks, IdentityService
    creds = Credentials(str(tmp_path))
    creds.save("dev", "s" * 32)
    ids = IdentityService.load("dev", creds, None, False, pairs_in_link=False)
    e = Enroller("http://127.0.0.1:9", "dev", str(tmp_path / "run"),
                 on_paired=lambda token, generation: ids.handle(Enrolled(token, generation)))
    ids.hooks = Hooks(restart_enrollment=lambda generation: e.restart(0.0, generation))
    e.core.code = code(0.0)
    answering, go_on = threading.Event(), threading.Event()

    def slow_poll():
        answering.set()
        go_on.wait(5)        # the revoke lands while this answer is in flight
        return "t" * 32

    e._poll = slow_poll
    worker = threading.Thread(target=e._execute, args=(PollPairing(),))
    worker.start()
    answering.wait(5)
    ids.handle(Revoked())    # the operator unpairs (SIGUSR2) while the answer is in flight
    go_on.set()
    worker.join(5)
    assert ids.current.token is None and not os.path.exists(tmp_path / "credentials.json")
    e._take_restart()
    assert e.core.state != "paired" and e.core.token is None


def _requests_in(core, clock, seconds, answer):
    """Drives ``core`` for ``seconds`` of its fake clock, each request answered by
    ``answer(core, action)``; the requests it made."""
    made, end = [], clock.now + seconds
    while True:
        wake = core.deadline()
        if wake > end:
            return made
        clock.advance(max(wake - clock.now, 0.0))
        for action in core.handle(Tick(clock.now)):
            made.append(action)
            answer(core, action)


def test_a_404_to_the_code_request_is_a_server_that_does_not_enroll_so_not_at_once():
    """#49: a 404 (or 410, 405) to POST /api/v1/enroll is no "code gone": there was no
    code. It backs off like any answer the agent does not expect, and says what it means."""
    clock = FakeClock()
    core = EnrollmentCore()
    core.handle(Started(clock.now))

    def not_here(core, action):
        assert action == RequestCode()
        core.handle(NoEnrollment(clock.now, 404))
    made = _requests_in(core, clock, 3600.0, not_here)
    # the cap (120 s, full jitter) allows about 60 an hour; at once it would be millions
    assert 20 <= len(made) <= 120, len(made)
    assert core.state == NEED_CODE and core.code is None
    assert "404" in core.last_error and "ScreenTinker" in core.last_error
    assert "[server] profile" in core.last_error


def test_a_server_that_forgets_every_code_is_asked_less_and_less_often():
    """A code the server hands out and then does not know at the next poll: a new one,
    but on the backoff, not at once and not at the poll's pace for ever."""
    clock = FakeClock()
    core = EnrollmentCore()
    core.handle(Started(clock.now))

    def forgetful(core, action):
        if action == RequestCode():
            core.handle(GotCode(clock.now, code(clock.now)))
        else:
            core.handle(CodeUnknown(clock.now))
    made = _requests_in(core, clock, 3600.0, forgetful)
    assert len(made) <= 2 * 120, len(made)
    # a code that expired after it was polled as pending is replaced at once (a second)
    core = EnrollmentCore()
    core.handle(Started(clock.now))
    assert core.handle(Tick(clock.now)) == [RequestCode()]
    core.handle(GotCode(clock.now, code(clock.now)))
    clock.advance(core.deadline() - clock.now)
    assert core.handle(Tick(clock.now)) == [PollPairing()]
    core.handle(StillPending(clock.now))
    clock.advance(core.deadline() - clock.now)
    assert core.handle(Tick(clock.now)) == [PollPairing()]
    core.handle(CodeUnknown(clock.now))
    assert core.deadline() - clock.now <= 2.0


@pytest.mark.parametrize("status", [404, 410, 405])
def test_the_shell_tells_a_code_request_refused_from_a_poll_whose_code_is_gone(
        hostile, tmp_path, status):
    from agent.identity.enroller import NotEnrolling
    Hostile.answer = (status, b"", {})
    e = Enroller(f"http://127.0.0.1:{hostile.server_port}", "dev", str(tmp_path / "run"))
    with pytest.raises(NotEnrolling):
        e._request_code()
    e.core.handle(Started(0.0))
    e._execute(RequestCode())
    assert e.core.state == NEED_CODE and e.core.deadline() > e.clock.monotonic() - 1
    assert e.pairing()["error"].startswith(f"the server answered {status} to edge-agent's enrollment")
