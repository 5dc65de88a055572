"""Uploads over the link: deleted from the queue only on proof of delivery."""
import json
import threading
import time
from types import SimpleNamespace

import pytest

from agent.config import load as C
from agent.events.model import Event
from agent.events.outbox import Outbox
from agent.events.sender import EventSender
from agent.link.cargo import Cargo, Parcel
from agent.link.delivery import DELIVERED, LOST, DeliveryTracker
from agent.link.inbox import HeartbeatAcked, Registered
from agent.link.profiles import EdgeAgentProfile, ProfileContext, ScreenTinkerProfile, play_record
from agent.link.port import Confirmation, Message
from agent.link.runner import Keeps, LinkRunner, Seams, Settings
from agent.link.schedule_store import ScheduleStore
from agent.uploads.link_sender import LinkUploadSender
from agent.uploads.schedule import OK, PERMANENT, TRANSIENT
from agent.uploads.store import Item
from devtools.harness import wait_for


def test_a_later_heartbeat_ack_on_the_same_connection_proves_receipt():
    t = DeliveryTracker()
    t.sent("a", generation=1, last_heartbeat_seq=4)
    t.sent("b", generation=1, last_heartbeat_seq=5)
    assert t.heartbeat_acked(1, 4) == []          # sent before the upload: proves nothing
    assert t.heartbeat_acked(2, 9) == []          # another connection: proves nothing
    assert [s.key for s in t.heartbeat_acked(1, 5)] == ["a"]
    assert [(s.key, s.verdict) for s in t.heartbeat_acked(1, 6)] == [("b", DELIVERED)]
    assert len(t) == 0


def test_the_second_server_ping_after_it_proves_receipt_from_a_server_that_acks_nothing():
    t = DeliveryTracker()
    t.sent("a", 1, 0, server_pings=3)   # 3 pings counted once the message was queued
    assert t.server_pinged(1, 4) == []  # its pong left after the message: not yet known
    assert t.server_pinged(2, 9) == []  # another connection
    assert [(s.key, s.verdict) for s in t.server_pinged(1, 5)] == [("a", DELIVERED)]


def test_loss_and_forgetting_settle_once():
    t = DeliveryTracker()
    for key in "cd":
        t.sent(key, 1, 0)
    t.forget("c")
    assert [(s.key, s.verdict) for s in t.connection_ended()] == [("d", LOST)]
    assert t.heartbeat_acked(1, 99) == [] and t.server_pinged(1, 99) == [] and len(t) == 0


def test_the_cargo_loses_an_upload_whose_connection_ends_during_its_writes():
    finished = []
    request = Parcel("u", (), lambda verdict, detail: finished.append(verdict))
    cargo = Cargo()
    cargo.sending(request)   # the emit fails: the link ends before sent
    cargo.connection_ended()
    assert finished == [LOST] and not cargo.waiting
    cargo.sending(request)
    cargo.sent("u", 2, 5, 0)
    cargo.heartbeat_acked(2, 5)     # the heartbeat before it proves nothing
    cargo.heartbeat_acked(2, 6)
    assert finished == [LOST, DELIVERED] and not cargo.waiting


def item(kind="screenshot", payload=b"\xff\xd8\xff....", item_id="u1"):
    return Item(item_id, kind, payload, 0, 0.0, 1700000000.5)


def st_profile(token="t" * 20):
    return ScreenTinkerProfile(ProfileContext(device_id=lambda: "st-1", token=lambda: token))


def test_screentinker_messages_are_the_shapes_its_server_reads():
    p = st_profile()
    event, body = p.upload_message(item())
    assert event == "device:screenshot"
    assert body == {"device_id": "st-1", "image_b64": "/9j/Li4uLg=="}
    start = {"event": "play_start", "content_id": "c-1", "content_name": "Welcome", "extra": 1}
    event, body = p.upload_message(item("proof-of-play", json.dumps(start).encode(), "p1"))
    assert (event, body) == ("device:play-event", {"device_id": "st-1", "event": "play_start",
                                                   "content_id": "c-1", "content_name": "Welcome"})
    assert "carries no log" in p.upload_message(item("log"))
    assert "JPEG or PNG" in p.upload_message(item(payload=b"GIF89a...."))
    big = item(payload=b"\xff\xd8" + b"x" * (3 * 2 ** 20 // 2))
    assert "over the 2097152" in p.upload_message(big)


@pytest.mark.parametrize("record, problem", [
    ({"events": [{"event": "play_start"}]}, "event: must be play_start or play_end"),
    ({"event": "play_start", "content_id": 7}, "content_id: wrong type"),
    ({"event": "play_end", "completed": True}, "content_id: play_end needs"),
    ({"event": "play_end", "content_id": "c", "completed": "yes"}, "completed: wrong type"),
    ({"event": "play_start", "content_name": "x" * 257}, "longer than 256"),
])
def test_play_records_the_server_would_drop_are_named(record, problem):
    assert problem in play_record(json.dumps(record).encode())[1]
    assert play_record(b"[1, 2]")[1] == "not a JSON object"


# -- the runner and the sender, without sockets ---------------------------------------
class FakeTransport:
    server_ping_interval_s = None
    last_inbound = 0.0
    server_pings = 0
    last_server_ping = None
    dialed = None

    def __init__(self):
        self.emitted = []
        self.aborted = False

    def open(self):
        pass

    def local_addr(self):
        return "127.0.0.1:40000"

    def clock_skew_s(self):
        return None

    def emit(self, event, data, callback=None):
        self.emitted.append((event, data, callback))

    def ending(self):
        return False

    def abort(self):
        self.aborted = True

    close = abort


def make_runner(tmp_path, link: str = "", profile: str = "screentinker", outbox=None,
                **keeps):
    path = tmp_path / "agent.toml"
    path.write_text(f'[server]\nurl = "http://127.0.0.1:9"\nprofile = "{profile}"\n'
                    f'[identity]\nstate_dir = "{tmp_path}"\n[runtime]\ndir = "{tmp_path}"\n'
                    f'[link]\n{link}\n')
    cfg = C.load(str(path), env={})
    transports = []

    def factory(generation, sink):
        transports.append(FakeTransport())
        return transports[-1]

    identity = lambda: ("st-1", "t" * 20)   # noqa: E731
    r = LinkRunner(Settings(cfg.link, cfg.server), seams=Seams(transport_factory=factory),
                   profile=st_profile() if profile == "screentinker" else EdgeAgentProfile(
                       ProfileContext(device_id=lambda: identity()[0],
                                      token=lambda: identity()[1])),
                   identity=identity, keeps=Keeps(**keeps))
    r.core.start(0.0)
    r.transports = transports
    if outbox is not None:
        r.events = EventSender(outbox, r.pipe)
    return r


@pytest.fixture
def runner(tmp_path):
    return make_runner(tmp_path)


def connect(runner):
    for action in runner.core.poll(runner.clock.monotonic()):
        runner.execute(action)
    assert runner.transport is not None


def drain(runner):
    runner.wakeup.wait(0)   # as the loop does: the wait, then what came
    runner.take_in_events()


def heartbeat(runner) -> int:
    runner.core._next_heartbeat_at = runner.clock.monotonic()
    for action in runner.core.poll(runner.clock.monotonic()):
        runner.execute(action)
    return max(runner.core.watchdog._pending)


def slept(runner, at_most_s: float) -> float:
    """How long the link thread's wait lasts, given the deadlines the loop would set."""
    timeout = min(max(runner.next_wakeup() - runner.clock.monotonic(), 0.0), at_most_s)
    t0 = time.monotonic()
    runner.wakeup.wait(timeout)
    return time.monotonic() - t0


def test_an_ack_waits_for_the_link_threads_next_turn_instead_of_waking_it(tmp_path):
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2")
    connect(runner)
    runner.sink(runner.generation, HeartbeatAcked(heartbeat(runner), runner.clock.monotonic()))
    assert slept(runner, 5.0) < 1.0, "the first ACK of a connection proves it at once"
    drain(runner)
    first = runner.core.watchdog.last_ack_at
    assert first is not None and runner.connection.acks_may_wait

    seq = heartbeat(runner)
    runner.sink(runner.generation, HeartbeatAcked(seq, runner.clock.monotonic()))
    assert slept(runner, 0.6) >= 0.6, "a later ACK, or its deadline, woke the link thread"
    assert runner.core.watchdog.last_ack_at == first
    drain(runner)   # what the loop does on its next turn
    assert runner.core.watchdog.last_ack_at > first


def test_a_late_ack_wakes_the_link_thread_at_its_deadline(tmp_path):
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2")
    connect(runner)
    runner.sink(runner.generation, HeartbeatAcked(heartbeat(runner), runner.clock.monotonic()))
    assert slept(runner, 5.0) < 1.0
    drain(runner)
    heartbeat(runner)
    # the ACK deadline, not the next heartbeat 5 s away
    assert 0.1 < slept(runner, 3.0) < 1.0
    assert runner.core.poll(runner.clock.monotonic())[0].reason == "ack-timeout"


def proven(runner):
    """Connected, and the first ACK taken in (what the loop does as it wakes for it)."""
    connect(runner)
    runner.sink(runner.generation, HeartbeatAcked(heartbeat(runner), runner.clock.monotonic()))
    drain(runner)
    assert runner.connection.acks_may_wait


def test_an_event_ack_is_taken_in_on_the_librarys_thread_without_waking_the_link_thread(tmp_path):
    box = Outbox()
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2",
                         profile="edge-agent", outbox=box)
    proven(runner)
    runner._say_up()          # the link up: the sender flushes what waits
    box.put(Event("display.connected", 1.0, {"connector": "HDMI-A-1"}))
    runner.events.flush()
    event, _, on_ack = runner.transports[0].emitted[-1]
    assert event == "device:event" and len(box) == 1
    reader = threading.Thread(target=on_ack, args=({"ok": False},))
    reader.start(), reader.join()
    assert len(box) == 1, "a refusal is not a delivery"
    reader = threading.Thread(target=on_ack, args=({"ok": True},))
    reader.start(), reader.join()
    assert len(box) == 0 and box.delivered == 1
    assert slept(runner, 0.5) >= 0.5, "an event's ACK woke the link thread"


def test_an_event_goes_out_from_the_thread_that_queued_it_and_wakes_no_link_thread(tmp_path):
    box = Outbox()
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2",
                         profile="edge-agent", outbox=box)
    proven(runner)
    runner._say_up()
    other = threading.Thread(target=lambda: (box.put(Event("display.connected", 1.0, {})),
                                             runner.events.flush()))
    other.start(), other.join()
    assert runner.transports[0].emitted[-1][0] == "device:event"
    assert slept(runner, 0.5) >= 0.5, "an event from the events thread woke the link"


class CountingStore(ScheduleStore):
    def __init__(self, path):
        super().__init__(path)
        self.calls = 0

    def save(self, attempts, next_attempt_mono):
        self.calls += 1
        super().save(attempts, next_attempt_mono)


def test_the_reconnect_schedule_is_stored_when_it_changes_not_on_every_turn(tmp_path):
    store = CountingStore(str(tmp_path / "backoff.json"))
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2",
                         schedule_store=store)
    proven(runner)
    runner.publish()
    before = store.calls
    for _ in range(20):     # turns of an idle, healthy link
        heartbeat(runner)
        runner.publish()
    assert store.calls == before
    runner.connector.closed("transport-error", "")
    runner.publish()
    assert store.calls == before + 1
    assert store.load()[1] == pytest.approx(runner.core.attempt_at(), abs=0.01)


def upload(runner, key):
    req = SimpleNamespace(settled=None)

    def confirmed(c: Confirmation):
        req.settled = (DELIVERED if c.ok else LOST, c.detail)

    runner.pipe.send_confirmed((Message("device:screenshot", {"image_b64": ""}, acked=False),),
                               confirmed)
    drain(runner)
    return req


def test_nothing_goes_before_device_registered_on_this_connection(runner):
    connect(runner)
    req = upload(runner, 1)
    assert req.settled[0] == LOST and "registered" in req.settled[1]
    assert [e for e, *_ in runner.transports[0].emitted] == ["device:register"]
    runner.sink(runner.generation, Registered())
    drain(runner)
    assert upload(runner, 2).settled is None
    assert runner.transports[0].emitted[-1][0] == "device:screenshot"


def test_the_runner_settles_on_a_later_heartbeat_ack_a_second_ping_or_the_loss(runner):
    connect(runner)
    runner.sink(runner.generation, Registered())
    drain(runner)
    seq_before = runner.core.seq
    transport = runner.transports[0]
    transport.server_pings = 7
    by_heartbeat = upload(runner, 1)
    runner.sink(runner.generation, HeartbeatAcked(seq_before, runner.clock.monotonic()))
    drain(runner)
    assert by_heartbeat.settled is None, "an ACK of an earlier heartbeat proves nothing"
    runner.sink(runner.generation, HeartbeatAcked(seq_before + 1, runner.clock.monotonic()))
    drain(runner)
    assert by_heartbeat.settled[0] == DELIVERED
    by_ping = upload(runner, 2)
    transport.server_pings = 8           # the library's thread counts them...
    runner.read_transport()              # ...and the link loop reads them when it looks
    assert by_ping.settled is None, "the pong to this ping may be all the server has read"
    transport.server_pings = 9
    runner.read_transport()
    assert by_ping.settled == (DELIVERED, "received before the pong to a later ping")
    last = upload(runner, 3)
    runner.connector.abort("ack-timeout")
    assert last.settled[0] == LOST
    assert not runner.ready(), "a new connection must be registered again"


def test_an_ack_wakes_the_link_thread_while_an_upload_waits_for_its_proof(tmp_path):
    """Taken in only with the next heartbeat's turn, the proof would come after the
    sender's proof window (one heartbeat plus the ACK timeout) had run out."""
    runner = make_runner(tmp_path, "heartbeat_interval_s = 5.0\nack_timeout_s = 0.2")
    connect(runner)
    runner.sink(runner.generation, Registered())
    runner.sink(runner.generation, HeartbeatAcked(heartbeat(runner), runner.clock.monotonic()))
    assert slept(runner, 5.0) < 1.0
    drain(runner)
    assert runner.connection.acks_may_wait
    waiting = upload(runner, 1)
    runner.sink(runner.generation, HeartbeatAcked(heartbeat(runner), runner.clock.monotonic()))
    assert slept(runner, 5.0) < 0.1
    drain(runner)
    assert waiting.settled[0] == DELIVERED


def test_the_sender_maps_verdicts_to_queue_outcomes_and_never_oks_without_proof(monkeypatch):
    from agent.link.profiles import ScreenTinkerProfile
    monkeypatch.setattr(ScreenTinkerProfile, "PLAY_START_GAP_S", 0.01)   # paced, but briefly

    class FakeRunner:
        def __init__(self, verdict):
            self.verdict, self.forgotten, self.sent = verdict, [], []

        def ready(self):
            return True

        def proof_window_s(self):
            return 0.05

        def send_confirmed(self, messages, on_confirmed):
            self.sent.append([m.event for m in messages])
            if self.verdict:
                on_confirmed(Confirmation(self.verdict == DELIVERED, (), "why"))
            return len(self.sent)

        def forget(self, key):
            self.forgotten.append(key)

    start = json.dumps({"event": "play_start", "content_name": "a"}).encode()
    pops = [item("proof-of-play", start, "p1"), item("proof-of-play", b"{}", "p2"),
            item("proof-of-play", start, "p3")]

    def kinds(runner, items):
        with_margin = LinkUploadSender(runner, st_profile())
        return {k: o.kind for k, o in with_margin.send_batch(items).items()}

    delivered = FakeRunner(DELIVERED)
    # the bad record is dead-lettered on its own; the good ones go, one message each, and
    # each play_start in a request of its own (the server keeps one per 2 s: paced)
    assert kinds(delivered, pops) == {"p1": OK, "p2": PERMANENT, "p3": OK}
    assert delivered.sent == [["device:play-event"], ["device:play-event"]]
    assert kinds(FakeRunner(LOST), pops) == {"p1": TRANSIENT, "p2": PERMANENT, "p3": TRANSIENT}
    silent = FakeRunner(None)
    import agent.uploads.link_sender as ls
    margin, ls.MARGIN_S = ls.MARGIN_S, 0.0
    try:
        assert kinds(silent, pops[:1]) == {"p1": TRANSIENT} and silent.forgotten
    finally:
        ls.MARGIN_S = margin
    assert kinds(FakeRunner(DELIVERED), [item("log", b"x", "l1")]) == {"l1": PERMANENT}


def test_paced_uploads_go_that_far_apart_and_a_round_stops_pacing_in_time(monkeypatch):
    """A server that keeps one play_start per 2 s (ScreenTinker 1.9): each paced message
    is its own request, at least the profile's gap after the one before; pacing stops at
    PACED_ROUND_S and what is left has no outcome (it goes in the next round)."""
    import time as _time
    from types import SimpleNamespace

    from agent.link.delivery import DELIVERED
    from agent.uploads import link_sender as ls
    from agent.uploads.schedule import OK

    monkeypatch.setattr(ls, "PACED_ROUND_S", 0.5)
    delivered = []

    class Runner:
        def proof_window_s(self):
            return 1.0

        def send_confirmed(self, messages, on_confirmed):
            delivered.append((_time.monotonic(), [m.payload["n"] for m in messages]))
            on_confirmed(Confirmation(True))

        def forget(self, key):
            pass

    class Profile:
        def upload_message(self, item):
            return "device:play-event", {"event": item.payload.decode(), "n": item.id}

        def upload_gap_s(self, event, payload):
            return 0.2 if payload["event"] == "play_start" else 0.0

    items = [SimpleNamespace(id=str(n), kind="proof-of-play",
                             payload=b"play_start" if n % 2 == 0 else b"play_end")
             for n in range(10)]
    outcomes = ls.LinkUploadSender(Runner(), Profile()).send_batch(items)
    # a play_start opens each request; its play_end rides along
    assert [ids for _, ids in delivered] == [["0", "1"], ["2", "3"], ["4", "5"]]
    gaps = [b[0] - a[0] for a, b in zip(delivered, delivered[1:])]
    assert all(g >= 0.19 for g in gaps), gaps
    assert sorted(outcomes) == ["0", "1", "2", "3", "4", "5"]
    assert all(o.kind == OK for o in outcomes.values())


def test_the_link_loop_is_supervised_a_bug_costs_a_restart_not_the_link(tmp_path, caplog):
    """A bug in the middle of a connect (not a TransportError) restarts the loop after its
    backoff: the core hears the connect failed, and the link comes up on the next try."""
    import threading
    runner = make_runner(tmp_path, link="[link.backoff]\nbase_s = 0.1\ncap_s = 0.2")
    runner._begun = True   # make_runner started the core
    opened, ended = [], threading.Event()
    real_factory = runner.factory

    def factory(generation, sink):
        transport = real_factory(generation, sink)
        opened.append(transport)
        if len(opened) == 1:
            def open_with_a_bug():
                raise KeyError("what a library may raise that nobody documented")
            transport.open = open_with_a_bug
        return transport

    runner.factory = factory
    runner.start(then=ended.set)
    try:
        wait_for(lambda: runner.transport is not None, 10, what="the link up after the restart")
        assert "link loop failed: KeyError" in caplog.text and not runner.loop.gave_up
        assert opened[0].aborted, "the half-opened client of the first try is left behind"
        assert runner.core.journal.records[-1].n >= 1
    finally:
        runner.request_stop()
        assert ended.wait(5), "the link loop did not end on the stop"
    assert runner.core.state.value == "stopped"
