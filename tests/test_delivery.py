"""Uploads over the link: deleted from the queue only on proof of delivery."""
import json
from types import SimpleNamespace

import pytest

from agent import config as C
from agent.link.delivery import DELIVERED, LOST, REFUSED, DeliveryTracker
from agent.link.profiles import ProfileContext, ScreenTinkerProfile
from agent.link.runner import LinkRunner
from agent.uploads.link_sender import LinkUploadSender
from agent.uploads.schedule import OK, PERMANENT, TRANSIENT
from agent.uploads.store import Item


def test_a_later_heartbeat_ack_on_the_same_connection_proves_receipt():
    t = DeliveryTracker()
    t.sent("a", generation=1, last_heartbeat_seq=4)
    t.sent("b", generation=1, last_heartbeat_seq=5)
    assert t.heartbeat_acked(1, 4) == []          # sent before the upload: proves nothing
    assert t.heartbeat_acked(2, 9) == []          # another connection: proves nothing
    assert [s.key for s in t.heartbeat_acked(1, 5)] == ["a"]
    assert [(s.key, s.verdict) for s in t.heartbeat_acked(1, 6)] == [("b", DELIVERED)]
    assert len(t) == 0


def test_answers_refusals_loss_and_forgetting_settle_once():
    t = DeliveryTracker()
    for key in "abcd":
        t.sent(key, 1, 0)
    assert [s.verdict for s in t.answered("a")] == [DELIVERED]
    assert t.answered("a") == []                  # a duplicate answer settles nothing
    assert [(s.verdict, s.detail) for s in t.answered("b", "too big")] == [(REFUSED, "too big")]
    t.forget("c")
    assert [(s.key, s.verdict) for s in t.connection_ended(1)] == [("d", LOST)]
    assert t.heartbeat_acked(1, 99) == [] and len(t) == 0


def item(kind="screenshot", payload=b"\x89PNG....", item_id="u1"):
    return Item(item_id, kind, payload, 0, 0.0, 1700000000.5)


def st_profile(token="t" * 20):
    return ScreenTinkerProfile(ProfileContext(device_id=lambda: "st-1", token=lambda: token))


def test_screentinker_messages_for_screenshots_and_proof_of_play():
    p = st_profile()
    event, body = p.upload_message("screenshot", [item()])
    assert event == "device:screenshot"
    assert body["image"] == b"\x89PNG...." and body["mime"] == "image/png"   # binary, not base64
    assert body["upload_id"] == "u1" and body["taken_ms"] == 1700000000500
    event, body = p.upload_message("proof-of-play", [
        item("proof-of-play", json.dumps({"media": "a.mp4", "ms": 5000}).encode(), "p1"),
        item("proof-of-play", b"not json", "p2")])
    assert event == "device:play-event"
    assert body["events"] == [{"media": "a.mp4", "ms": 5000, "upload_id": "p1"},
                              {"record": "not json", "upload_id": "p2"}]
    assert "carries no log" in p.upload_message("log", [item("log")])
    big = item(payload=b"x" * (p.MAX_MESSAGE_BYTES + 1))
    assert "over the" in p.upload_message("screenshot", [big])


@pytest.mark.parametrize("args, expected", [
    ((), (None, None)),                                   # a bare ack() is an ACK
    (({"ok": True},), (None, None)),
    (({"acked": ["p1", 7]},), ({"p1"}, None)),
    (({"ok": False, "error": "quota"},), (None, "quota")),
    (({"error": "not registered"},), (None, "not registered")),
])
def test_screentinker_upload_answers(args, expected):
    assert ScreenTinkerProfile.upload_answer(args) == expected


# -- the runner and the sender, without sockets ---------------------------------------
class FakeTransport:
    server_ping_interval_s = None
    last_inbound = 0.0

    def __init__(self):
        self.emitted = []
        self.aborted = False

    def open(self):
        pass

    def local_addr(self):
        return "127.0.0.1:40000"

    def emit(self, event, data, callback=None):
        self.emitted.append((event, data, callback))

    def abort(self):
        self.aborted = True

    close = abort


@pytest.fixture
def runner(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[server]\nurl = "http://127.0.0.1:9"\nprofile = "screentinker"\n'
                    f'[identity]\nstate_dir = "{tmp_path}"\n[runtime]\ndir = "{tmp_path}"\n')
    cfg = C.load(str(path), env={})
    transports = []

    def factory(generation, sink):
        transports.append(FakeTransport())
        return transports[-1]

    r = LinkRunner(cfg, transport_factory=factory, profile=st_profile(),
                   identity=lambda: ("st-1", "t" * 20))
    r.core.start(0.0)
    r.transports = transports
    return r


def connect(runner):
    for action in runner.core.poll(runner.clock.monotonic()):
        runner._execute(action)
    assert runner.transport is not None


def drain(runner):
    while not runner.events.empty():
        runner._handle(*runner.events.get_nowait())


class Request(SimpleNamespace):
    def finish(self, verdict, detail, answer):
        self.settled = (verdict, detail, answer)


def upload(runner, key):
    req = Request(key=key, event="device:screenshot", payload={"image": b""}, settled=None)
    runner.deliver(req)
    drain(runner)
    return req


def test_nothing_goes_before_device_registered_on_this_connection(runner):
    connect(runner)
    req = upload(runner, 1)
    assert req.settled[0] == LOST and "registered" in req.settled[1]
    assert [e for e, *_ in runner.transports[0].emitted] == ["device:register"]
    runner.sink(runner.generation, "registered")
    drain(runner)
    assert upload(runner, 2).settled is None
    assert runner.transports[0].emitted[-1][0] == "device:screenshot"


def test_the_runner_settles_on_a_later_heartbeat_ack_an_answer_or_the_loss(runner):
    connect(runner)
    runner.sink(runner.generation, "registered")
    drain(runner)
    seq_before = runner.core.seq
    by_heartbeat, answered, lost = upload(runner, 1), upload(runner, 2), upload(runner, 3)
    runner.sink(runner.generation, "ack", seq_before, runner.clock.monotonic())
    drain(runner)
    assert by_heartbeat.settled is None, "an ACK of an earlier heartbeat proves nothing"
    callback = runner.transports[0].emitted[-2][2]
    callback({"error": "quota"})  # the library calls it on its own thread
    drain(runner)
    assert answered.settled == (REFUSED, "quota", None)
    runner.sink(runner.generation, "ack", seq_before + 1, runner.clock.monotonic())
    drain(runner)
    assert by_heartbeat.settled[0] == DELIVERED and lost.settled[0] == DELIVERED
    last = upload(runner, 4)
    runner._abort("ack-timeout")
    assert last.settled[0] == LOST
    assert not runner.uploads_ready(), "a new connection must be registered again"


def test_the_sender_maps_verdicts_to_queue_outcomes_and_never_oks_without_proof():
    class FakeRunner:
        def __init__(self, verdict, answer=None):
            self.verdict, self.answer, self.forgotten = verdict, answer, []

        def uploads_ready(self):
            return True

        def deliver(self, request):
            if self.verdict:
                request.finish(self.verdict, "why", self.answer)

        def forget(self, key):
            self.forgotten.append(key)

    pops = [item("proof-of-play", b"{}", "p1"), item("proof-of-play", b"{}", "p2")]
    kinds = lambda runner, items: {k: o.kind for k, o in
                                   LinkUploadSender(runner, st_profile(), 0.05).send_batch(items).items()}
    assert kinds(FakeRunner(DELIVERED), pops) == {"p1": OK, "p2": OK}
    assert kinds(FakeRunner(DELIVERED, {"p2"}), pops) == {"p1": TRANSIENT, "p2": OK}
    assert kinds(FakeRunner(REFUSED), pops) == {"p1": PERMANENT, "p2": PERMANENT}
    assert kinds(FakeRunner(LOST), pops) == {"p1": TRANSIENT, "p2": TRANSIENT}
    silent = FakeRunner(None)
    assert kinds(silent, pops) == {"p1": TRANSIENT, "p2": TRANSIENT} and silent.forgotten
    assert kinds(FakeRunner(DELIVERED), [item("log", b"x", "l1")]) == {"l1": PERMANENT}
