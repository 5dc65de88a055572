"""The command core's shell: the ledger on disk, the commands thread that owns both, and
one executor thread (each a Loop: supervised, on the watchdog gate while it has work,
idle while it waits).

Everything that touches the core and the ledger runs on the commands thread: a command
the link's port hands over (served by name, from the connection's events thread), one
finished (the executor posts it back), a result confirmed (the link posts the server's
ACK back), the link up (unconfirmed results go again). The ledger is written durably
by the core's effects in their order, a ``Persist`` (synced when it says so) before the
``Run`` it records, which is what makes "at most once" hold across a power cut; only
then does ``recorded()`` let the server's receipt go. A card slow to sync delays commands, never the link.

The commands run one at a time, in the order received. One that waits rather than works
(a display's turn: a program, then the display's settle) is a job the commands thread
drives itself, a look at a time between its news (base/steps.py): it starts after its
receipt, its end is finished where it is, and a flood is refused at once meanwhile. The
rest run whole on the executor.
"""
from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from typing import Callable, NamedTuple

from ..base.boot import boot_token
from ..base.journal_fields import journal
from ..base.steps import Stepper
from ..link.port import Confirmation, LinkPort, Message
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from . import ledger
from .actions import Actions
from ..link.protocol import REQUEST_COMMAND
from .core import (LATER, RESEND, CommandCore, Connected, Effect, Finished, Outcome, Persist,
                   Received, Recovered, Report, ResultAcked, Run)

log = logging.getLogger("edge_agent.commands")

# The longest command_timeout_s the configuration takes: the bound assumed for actions
# that do not say their own.
LONGEST_TIMEOUT_S = 3600.0
# The commands thread's longest turn: a ledger write on a card slow to sync.
CORE_SILENCE_S = 120.0
# Commands from the server waiting for the commands thread, at most: while it is held
# (a card slow to sync, a send on a connection that stopped reading) a server's flood
# must not grow the process to the unit's MemoryMax. One past it is dropped unrecorded:
# the server that waits for a receipt hears "not recorded yet" and sends it again.
RECEIVED_WAITING = 256

# the profile's words for a result: (event, payload, whether the server ACKs it)
ResultMessage = Callable[[dict], "tuple[str, dict, bool]"]


def max_silence_s(timeout_s: float) -> float:
    """What the watchdog gate allows the executor for one command. Each command's own
    bound is the configured timeout (a configured command, the journal gate's reply);
    the rest (a DNS lookup's 3 s, a bundle queued on the card) takes seconds. Twice the
    timeout and a minute past it is a wedge, not a slow command."""
    return 2 * timeout_s + 60.0


class CommandService:
    def __init__(self, path: str, allow: frozenset, actions: Actions, runtime_dir: str, *,
                 link: LinkPort | None = None, result_message: ResultMessage | None = None,
                 clock: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic, ids_ours: bool = False,
                 on_storage_error: Callable[[str, OSError], None] | None = None,
                 on_change: Callable[[], None] | None = None,
                 gate: WatchdogGate | None = None,
                 server_now: Callable[[float], float | None] = lambda mono: None):
        """``link``: the link's port, over which the results go in the profile's words
        (``result_message``), until the server confirms each. ``ids_ours``: the server's
        protocol has no command ids (ScreenTinker), the profile mints a random one per
        message, which nothing can send again, so forgetting one needs no horizon
        (core.py). ``on_storage_error(path, error)``: the ledger could not be written.
        ``on_change()``: a result was recorded or confirmed. ``gate``: both threads are
        on the watchdog gate while they have work. ``server_now(mono)``: the server's
        clock as the link measured it (base/server_clock.py), None before a measure: a
        command's expiry is judged by it, never by this device's clock."""
        self.path = path
        # loaded here, before the commands thread starts; from then on, only it has them
        loaded = ledger.load(path, clock())
        self._ledger = ledger.Ledger(path, loaded)
        self.core = CommandCore(allow, loaded.entries, loaded.floor, loaded.closed, ids_ours)
        self._started = False
        self._on_storage_error = on_storage_error
        self._on_change = on_change
        self.actions = actions
        self._link = link
        self._result_message = result_message
        self._server_now = server_now
        self._clock = clock
        self._mono = mono
        self._boot, self._pid = boot_token(runtime_dir), os.getpid()
        self._news: queue.Queue = queue.Queue()   # for the commands thread
        self._room = threading.BoundedSemaphore(RECEIVED_WAITING)   # for served commands
        self._jobs: queue.Queue = queue.Queue()   # for the executor
        # the commands recorded, run one at a time in the order received: those waiting
        # their turn, and the one running (driven here when it has a Stepper, else on
        # the executor)
        self._order: collections.deque[Run] = collections.deque()
        self._current: _Running | None = None
        self._stopping = threading.Event()
        # results said since start, by the metrics' words: ok, error (it ran and
        # failed), refused (it never ran); a resend's stored result is not a new one
        self.results = {"ok": 0, "error": 0, "refused": 0}
        # what the other threads read, published by the commands thread
        self._recent: list[dict] = []
        self._running: tuple[tuple[str, str], ...] = ()
        self.loop = Loop("commands", self._serve_news, gate=gate, max_silence_s=CORE_SILENCE_S,
                         pause=self._stopping.wait, stopping=self._stopping.is_set)
        self.executor = Loop("command-runs", self._work, gate=gate,
                             max_silence_s=max_silence_s(getattr(actions, "timeout_s",
                                                                 LONGEST_TIMEOUT_S))
                             + getattr(actions, "read_back_s", 0.0),
                             pause=self._stopping.wait, stopping=self._stopping.is_set)
        if link is not None:
            link.serve(REQUEST_COMMAND, self.serve)
            link.subscribe(up=self.link_up)

    # -- from any thread -------------------------------------------------------------
    def start(self) -> None:
        """The ledger loaded and the commands found running recovered, on the commands
        thread, before anything the server sends."""
        self._news.put(("start",))
        self.loop.start()
        self.executor.start()

    def serve(self, raw, recorded: Callable[[], None] = lambda: None) -> None:
        """A command from the server (the link's port, on the connection's events
        thread): ``recorded()`` once the ledger holds it, or its refusal; never, when
        RECEIVED_WAITING commands wait already."""
        if not self._room.acquire(blocking=False):
            # one line a minute (logs.RepeatFilter keys on the first argument)
            log.warning("server command dropped unrecorded: %d commands wait for the "
                        "ledger already", RECEIVED_WAITING)
            return
        self._news.put(("received", raw, recorded))

    def finished(self, cid: str, outcome, started: float) -> None:
        """A command's outcome (the executor; an update settled after a restart)."""
        self._news.put(("finished", cid, outcome, started))

    def link_up(self) -> None:
        """The link is up: the results the server has not confirmed go again."""
        self._news.put(("up",))

    def recent(self, n: int = 10) -> list[dict]:
        """The latest results, for `edge-agent status`."""
        return self._recent[-n:]

    def running(self, name: str) -> list[str]:
        """The ids of the commands called ``name`` still running (the device part asks
        at a stop whether a reboot was the fleet's)."""
        return [cid for cid, running in self._running if running == name]

    def stop(self) -> None:
        """From the daemon on its way out: nothing more starts, and a command's
        processes are killed (the ledger says it was interrupted; never run again)."""
        self._stopping.set()
        self.actions.stop()
        self._jobs.put(None)
        self._news.put(None)

    # -- on the commands thread ----------------------------------------------------------
    def _serve_news(self) -> None:
        """The commands thread's body: one piece of news at a time, then, once the queue
        is empty, what the other threads read; between them, a look at the command it
        drives itself (a display's turn), until its next look is due."""
        try:
            while True:
                self._run_in_order()
                try:
                    item = self._news.get_nowait()
                except queue.Empty:
                    self._publish()   # once the queue is empty: a flood refreshes it once
                    stepper = self._current.stepper if self._current is not None else None
                    if stepper is None:
                        self.loop.idle()   # nothing to do until the link or the executor says
                        item = self._news.get()
                    else:
                        try:
                            item = self._news.get(timeout=stepper.wait_s())
                        except queue.Empty:
                            self.loop.turn()
                            continue
                if item is None or self._stopping.is_set():
                    return   # what is queued is dropped: a receipt not given is sent again
                self.loop.turn()
                getattr(self, "_on_" + item[0])(*item[1:])
        finally:
            if self._stopping.is_set() and self._current is not None:
                # a command driven here is not finished (the ledger keeps it running:
                # reported as interrupted, never run again), its program killed; a
                # restart of this thread after a bug goes on with it
                if self._current.stepper is not None:
                    self._current.stepper.close()
                self._current = None

    def _run_in_order(self) -> None:
        """The commands recorded, one at a time in their order, as the executor alone ran
        them (a display on, then a screenshot, shows the display on): the next starts
        once the one running has finished. One that waits rather than works
        (``Actions.steps``: a display's turn) is driven here, a look at a time, and
        finished here: no executor, no hand-back; it starts after its receipt has gone."""
        while True:
            if self._current is None:
                if not self._order:
                    return
                self._current = self._begin(self._order.popleft())
                continue
            run, started, stepper = self._current
            if stepper is None:
                return   # the executor's: its Finished comes as news
            try:
                if not stepper.advance():
                    return
                outcome = stepper.result
            except Exception as e:
                stepper.close()
                outcome = _internal_error(run.name, e)
            self._current = None
            self._on_finished(run.id, outcome, started)

    def _begin(self, run: Run) -> "_Running":
        log.info("server command %s: running %r %s", run.id, run.name, run.args or "",
                 extra=journal(COMMAND_ID=run.id))
        started = self._clock()
        try:
            job = self.actions.steps(run.name, run.args)
            stepper = Stepper(job) if job is not None else None
        except Exception as e:
            self.finished(run.id, _internal_error(run.name, e), started)
            return _Running(run, started, None)   # done when its Finished is taken in
        if stepper is None:
            self._jobs.put(run)
        return _Running(run, started, stepper)

    def _on_start(self) -> None:
        if self._started:
            return
        self._started = True
        updater = self.actions.updater
        updates = updater.recover(self.core.running("update")) if updater else None
        reports = self._do(self.core.handle(Recovered(self._boot, self._pid, self._clock(),
                                                      updates)))
        for r in reports:
            log.info("command %s (%s) from before this start: %s", r.result["id"],
                     r.result["name"], r.result.get("output") or r.result.get("error"))

    def _on_received(self, raw, recorded: Callable[[], None]) -> None:
        self._room.release()
        reports = self._received(raw)   # the ledger written, durably
        recorded()      # now the receipt may go out: never for one the ledger lacks
        for report in reports:
            self._send(report)

    def _received(self, raw) -> list[Report]:
        now, mono = self._clock(), self._mono()
        reports = self._do(self.core.handle(Received(raw, now, mono, self._server_now(mono),
                                                     self._boot, self._pid)))
        for r in reports:
            self._log_result(r.result, r.why)
        return reports

    def _on_finished(self, cid: str, outcome, started: float) -> None:
        if self._current is not None and self._current.run.id == cid:
            self._current = None   # the executor's is done: the next may start
        if outcome is LATER:
            return  # its result is known after the restart it causes
        reports = self._do(self.core.handle(Finished(cid, outcome.ok, outcome.output,
                                                     outcome.error, started, self._clock(),
                                                     outcome.extra)))
        for r in reports:
            self._log_result(r.result)
            self._send(r)

    def _on_confirmed(self, cid: str, confirmation: Confirmation) -> None:
        if confirmation.ok:
            self._do(self.core.handle(ResultAcked(cid)))

    def _on_up(self) -> None:
        for report in self._do(self.core.handle(Connected())):  # until the server confirms each
            self._send(report)

    def _send(self, report: Report) -> None:
        """A command's result to the server, until it confirms (it stays in the ledger
        unconfirmed, and goes again on the next link up). A refusal the ledger does not
        keep (a flood's rate-limited, busy, too old) goes once, unconfirmed: a flood
        costs one emit per command."""
        if self._link is None or self._result_message is None:
            return
        event, payload, acked = self._result_message(report.result)
        if not report.kept:
            self._link.send(Message(event, payload, acked=False))
            return
        cid = report.result["id"]
        self._link.send_confirmed((Message(event, payload, acked),),
                                  lambda confirmation: self._news.put(
                                      ("confirmed", cid, confirmation)))

    def _publish(self) -> None:
        """What the other threads read of the core: the latest results, what runs; and
        ``on_change()`` when that changed."""
        entries = list(self.core.entries.values())
        done = sorted((e for e in entries if e.result), key=lambda e: e.received_at)[-10:]
        recent = []
        for e in done:
            r = e.result
            state = "done" if r["ok"] else ("failed" if "started_at" in r else "refused")
            recent.append({"id": e.id, "command": e.name, "ok": r["ok"], "at": r["finished_at"],
                           "result": f"{state}: {r.get('output') or r.get('error') or ''}"[:300]})
        running = tuple((e.id, e.name) for e in entries if e.state == "running")
        if (recent, running) == (self._recent, self._running):
            return
        self._recent, self._running = recent, running
        if self._on_change is not None:
            self._on_change()

    # -- internals -------------------------------------------------------------------
    def _do(self, effects: list[Effect]) -> list[Report]:
        """The core's effects, in their order (the order is the rule: a Run after the
        Persist that records it); returns the Reports, to send."""
        problem = None
        reports: list[Report] = []
        for effect in effects:
            if isinstance(effect, Persist):
                problem = self._persist(effect)
            elif isinstance(effect, Run):
                if problem is not None or self._stopping.is_set():
                    # not durable means not at-most-once: nothing runs on it
                    why = (f"not run: the command ledger could not be written ({problem})"
                           if problem is not None else "not run: the agent is stopping")
                    reports += self._do(self.core.handle(
                        Finished(effect.id, False, None, why, None, self._clock())))
                    continue
                self._order.append(effect)   # started in its turn (_run_in_order)
            else:
                reports.append(effect)
        return reports

    def _persist(self, effect: Persist) -> str | None:
        """A Persist to the ledger; what went wrong, if anything."""
        try:
            self._ledger.write(list(effect.changes), effect.horizon, effect.durable,
                               lambda: list(self.core.entries.values()))
        except OSError as e:
            if self._on_storage_error is not None:
                self._on_storage_error(self.path, e)
            else:
                log.error("cannot write the command ledger %s: %s", self.path, e.strerror)
            return e.strerror or type(e).__name__
        return None

    def _log_result(self, result: dict, quiet_why: str = "") -> None:
        if quiet_why != RESEND:
            kind = "ok" if result["ok"] else "error" if "started_at" in result else "refused"
            self.results[kind] += 1
        if quiet_why:
            # a flood: one line a minute per kind (logs.RepeatFilter keys on the first
            # argument), not a line per command on the SD card
            log.warning("server command not run (%s): %s (%s)", quiet_why, result["id"],
                        result["name"], extra=journal(COMMAND_ID=result["id"]))
            return
        level = logging.INFO if result["ok"] else logging.WARNING
        log.log(level, "server command %s (%s): %s %s", result["id"], result["name"],
                "ok" if result["ok"] else "error:",
                ((result.get("output") if result["ok"] else result.get("error")) or "")[:300],
                extra=journal(COMMAND_ID=result["id"]))

    def _work(self) -> None:
        """The executor's body: a bug here (outside a command's own run) restarts it,
        seen, and what is queued runs after the restart."""
        while True:
            self.executor.idle()   # waiting for a command: nothing to be stuck on
            job = self._jobs.get()
            if job is None or self._stopping.is_set():
                return  # queued ones stay "running" in the ledger: reported, never run
            self.executor.turn()
            started = self._clock()
            try:
                outcome = self.actions.run(job.name, job.args, job.id)
            except Exception as e:
                outcome = _internal_error(job.name, e)
            self.finished(job.id, outcome, started)


def _internal_error(name: str, e: Exception) -> Outcome:
    """A bug in one command, seen, and its result: it must not end the others."""
    log.error("command %s failed: %s: %s", name, type(e).__name__, e, exc_info=True)
    return Outcome(False, error=f"internal error: {type(e).__name__}")


class _Running(NamedTuple):
    """The command running: driven by the commands thread (its ``stepper``) or by the
    executor (None)."""
    run: Run
    started: float
    stepper: Stepper | None
