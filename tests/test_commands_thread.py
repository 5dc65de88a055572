"""The commands part on its own thread (issue #51): the command core and its ledger run
on the commands thread only, so a card slow to sync delays commands, never the link.

Before: the link thread wrote and fsynced the ledger for each command received, finished
and confirmed; a write that took 2 s held every heartbeat due meanwhile (its send, and
the ACK's reading) for those 2 s.
"""
import threading
import time

import pytest

from devtools.harness import REPO, AgentProcess, agent_config, wait_for

pytestmark = pytest.mark.netns

# the agent, with every write of the command ledger taking 2 s (a card slow to sync)
SLOW_LEDGER = (
    "import sys, time\n"
    "from agent.commands import ledger\n"
    "write = ledger.Ledger.write\n"
    "def slow(*args, **kwargs):\n"
    "    time.sleep(2.0)\n"
    "    return write(*args, **kwargs)\n"
    "ledger.Ledger.write = slow\n"
    "from agent.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")


def test_a_ledger_write_that_blocks_2s_delays_no_heartbeat(netns, fleet, agent_python, tmp_path):
    server = fleet()
    config = agent_config(server, tmp_path, link={"heartbeat_interval_s": 1.0,
                                                  "ack_timeout_s": 0.8},
                          commands={"allow": ["diagnostics"]})
    agent = AgentProcess(agent_python, config, tmp_path, env={"PYTHONPATH": str(REPO)},
                         command=[agent_python, "-c", SLOW_LEDGER]).start()
    try:
        agent.wait_live(20)
        t0 = time.time()
        ids = []
        for _ in range(3):   # each one: 3 ledger writes (received, finished, confirmed)
            ids.append(server.admin("/api/v1/commands", {"device_id": "screen-1",
                                                        "name": "diagnostics", "args": {}})["id"])
            time.sleep(1.0)
        for cid in ids:
            wait_for(lambda: server.admin("/api/v1/devices/screen-1/commands")[cid]["result"],
                     30, interval=0.1, what=f"the result of {cid}")
        time.sleep(2.0)
        beats = [t0] + [t for t in server.device()["heartbeat_times"] if t >= t0] + [time.time()]
        gaps = [b - a for a, b in zip(beats, beats[1:])]
        print(f"\nheartbeat gaps while the ledger took 2 s a write: max {max(gaps):.2f}s")
        assert max(gaps) < 1.8, f"a heartbeat waited for the ledger: gaps {gaps}"
        log = agent.log_text()
        assert "no heartbeat ack" not in log and "link lost" not in log, log[-3000:]
        assert server.device()["connects"] == 1
    finally:
        agent.stop()


def test_the_core_and_the_ledger_are_touched_from_the_commands_thread_only(tmp_path):
    """Received, finished and confirmed, each from another thread: the core and the
    ledger see one thread, the commands thread."""
    from agent.commands.actions import Actions
    from agent.commands.core import Outcome, ResultAcked
    from agent.commands.service import CommandService
    from agent.link.port import Confirmation

    seen: dict[str, set] = {"core": set(), "ledger": set()}
    sent, confirmed = [], []

    class Port:
        """The link's port as the commands part uses it."""
        def send_confirmed(self, messages, on_confirmed):
            sent.append(messages)
            threading.Thread(target=on_confirmed, args=(Confirmation(True, ({"ok": True},)),)
                             ).start()

    def spy(kind, method):
        def call(*args, **kwargs):
            seen[kind].add(threading.current_thread().name)
            if args and isinstance(args[0], ResultAcked):
                confirmed.append((args[0].id,))
            return method(*args, **kwargs)
        return call

    actions = Actions.__new__(Actions)
    actions.updater = None
    actions.run = lambda name, args, cid=None: Outcome(True, "ran")
    actions.stop = lambda: None
    port = Port()
    port.serve = lambda name, handler: None
    port.subscribe = lambda **kwargs: None
    service = CommandService(str(tmp_path / "commands.json"), frozenset({"diagnostics"}),
                             actions, str(tmp_path), link=port,
                             result_message=lambda result: ("device:command-result", result,
                                                            True))
    real_start = service._on_start

    def spied_start():   # the core and the ledger are the commands thread's from its start
        real_start()
        service.core.handle = spy("core", service.core.handle)   # its one way in
        service._ledger.write = spy("ledger", service._ledger.write)
        seen["core"].add(threading.current_thread().name)
    service._on_start = spied_start
    service.start()
    try:
        recorded = threading.Event()
        threading.Thread(target=service.serve, args=(
            {"id": "c-1", "name": "diagnostics", "args": {}}, recorded.set)).start()
        assert recorded.wait(5)
        wait_for(lambda: service.recent() and service.recent()[-1]["ok"] and confirmed, 5,
                 what="the result confirmed")
        threading.Thread(target=service.link_up).start()
        time.sleep(0.2)
    finally:
        service.stop()
        service.loop.join(5)
    assert seen["core"] == {"commands"} and seen["ledger"] == {"commands"}, seen
    # sent once, confirmed: not again on link up
    assert [m.payload["id"] for (m,) in sent] == ["c-1"] and confirmed == [("c-1",)]


class QuietPort:
    """The link's port as the commands part uses it, saying nothing back."""
    def serve(self, name, handler):
        self.handler = handler

    def subscribe(self, **kwargs):
        pass

    def send_confirmed(self, messages, on_confirmed):
        pass

    def send(self, message):
        pass


def display_service(tmp_path, power, port=None, allow=("display",), run=None):
    """The commands part, whose display turns on ``power`` and whose executor runs the
    rest with ``run`` (none expected unless given)."""
    from agent.commands.actions import Actions
    from agent.commands.service import CommandService
    actions = Actions.__new__(Actions)
    actions.updater = None
    actions.power = power
    actions.stop = lambda: None
    actions.run = run or (lambda name, args, cid=None: pytest.fail("ran on the executor"))
    return CommandService(
        str(tmp_path / "commands.json"), frozenset(allow), actions, str(tmp_path), link=port,
        result_message=lambda result: ("device:command-result", result, True))


def test_a_display_command_changes_thread_four_times_and_crosses_twice(tmp_path):
    """The walk in docs/LAYERS.md, counted: the thread of each step of one command, from
    the connection's events thread to the server's confirmation of its result. The
    display's turn (a real program, through the screen's own runner, then a settle) is
    driven by the commands thread a look at a time: no executor, no hand-back."""
    from agent.base.steps import Program, Until
    from agent.commands.core import ResultAcked
    from agent.link.port import Confirmation
    from agent.screen.core import Turned
    from agent.screen.sources import Runner

    steps: list[tuple[str, str]] = []   # (part, thread)

    def step(part):
        steps.append((part, threading.current_thread().name))

    class Port(QuietPort):
        def send_confirmed(self, messages, on_confirmed):
            step("commands")   # the emit, on the caller's thread
            # the server's ACK, taken in on the library's read loop
            reader = threading.Thread(target=lambda: (step("link"), on_confirmed(
                Confirmation(True, ({"ok": True},)))), name="read-loop")
            reader.start()

    class Power:
        """The screen's owner as the commands part sees it: its turn as a job."""
        bound_s = 5.0
        runner = Runner(2.0)

        def turning(self, state, *, scheduled=False):
            step("screen")
            out, why = yield Program(self.runner, ["sh", "-c", "sleep 0.2; echo off"])
            assert (out, why) == (b"off\n", "")
            settled = time.monotonic() + 0.2
            yield Until(settled, time.monotonic)
            step("screen")
            return Turned(state)

    port = Port()
    service = display_service(tmp_path, Power(), port)
    handle = service.core.handle

    def handled(event):
        if isinstance(event, ResultAcked):
            step("commands")
        return handle(event)
    service.core.handle = handled
    service.start()
    try:
        recorded = threading.Event()

        def events_thread():   # the profile's handler, on the connection's events thread
            step("link")
            port.handler({"id": "c-7", "name": "display", "args": {"state": "off"}},
                         lambda: (step("commands"), recorded.set()))
        threading.Thread(target=events_thread, name="link-events-1").start()
        assert recorded.wait(5)
        wait_for(lambda: any(part == "commands" and thread == "commands"
                             for part, thread in steps[-1:]) and len(steps) >= 7, 5,
                 what="the result confirmed")
    finally:
        service.stop()
        service.loop.join(5)
    threads = [thread for _, thread in steps]
    changes = sum(a != b for a, b in zip(threads, threads[1:]))
    # a crossing hands the command from a thread of the link's to the commands part's:
    # the commands part sends by a call of the port, on its own thread
    crossings = sum(a[0] == "link" and b[0] == "commands" for a, b in zip(steps, steps[1:]))
    print(f"\n{steps}: {changes + 1} changes of thread (the read loop's first), "
          f"{crossings} crossings")
    assert threads == ["link-events-1", "commands", "commands", "commands", "commands",
                       "read-loop", "commands"], steps
    assert [part for part, _ in steps] == ["link", "commands", "screen", "screen", "commands",
                                           "link", "commands"], steps
    assert changes + 1 == 4 and crossings == 2
    result = service.core.entries["c-7"].result
    assert result["ok"] and result["output"] == Turned("off").said(), result


def test_a_flood_is_refused_while_a_display_turns_on_the_commands_thread(tmp_path):
    """The display's turn waits on its program and its settle between the news: the
    commands received meanwhile are recorded (their receipts go) within a tenth of a
    second, not after the turn."""
    from agent.base.steps import Until
    from agent.screen.core import Turned

    class Power:
        bound_s = 10.0

        def turning(self, state, *, scheduled=False):
            yield Until(time.monotonic() + 3.0, time.monotonic)
            return Turned(state)

    port = QuietPort()
    service = display_service(tmp_path, Power(), port)
    service.start()
    try:
        first = threading.Event()
        port.handler({"id": "d-0", "name": "display", "args": {"state": "off"}}, first.set)
        assert first.wait(5)
        took = []
        for n in range(1, 6):
            done = threading.Event()
            t0 = time.monotonic()
            port.handler({"id": f"d-{n}", "name": "display", "args": {"state": "on"}},
                         done.set)
            assert done.wait(5)
            took.append(time.monotonic() - t0)
        print(f"\nreceipts while a display turned: {[round(t, 3) for t in took]} s")
        assert max(took) < 0.1, took
        assert not service.core.entries["d-0"].result, "the first turn is still going"
    finally:
        service.stop()
        service.loop.join(5)


def test_commands_run_one_at_a_time_in_the_order_received_wherever_they_run(tmp_path):
    """A display's turn (driven by the commands thread) and the executor's commands keep
    the order the server gave, one at a time, as the executor alone ran them: a
    screenshot after a display on sees the display on."""
    from agent.base.steps import Until
    from agent.commands.core import Outcome
    from agent.screen.core import Turned

    seen = []

    class Power:
        bound_s = 10.0

        def turning(self, state, *, scheduled=False):
            seen.append(f"start display {state}")
            yield Until(time.monotonic() + 0.3, time.monotonic)
            seen.append(f"end display {state}")
            return Turned(state)

    def run(name, args, cid=None):
        seen.append(f"start {name}")
        time.sleep(0.3)
        seen.append(f"end {name}")
        return Outcome(True, name)

    service = display_service(tmp_path, Power(), allow=("display", "diagnostics"), run=run)
    service.start()
    try:
        for n, (name, args) in enumerate([("display", {"state": "on"}), ("diagnostics", {}),
                                          ("display", {"state": "off"}), ("diagnostics", {})]):
            recorded = threading.Event()
            service.serve({"id": f"c-{n}", "name": name, "args": args}, recorded.set)
            assert recorded.wait(5)
        wait_for(lambda: all(service.core.entries[f"c-{n}"].result for n in range(4)), 10,
                 what="four results")
    finally:
        service.stop()
        service.loop.join(5)
    assert seen == ["start display on", "end display on", "start diagnostics",
                    "end diagnostics", "start display off", "end display off",
                    "start diagnostics", "end diagnostics"], seen
