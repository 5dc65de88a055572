"""The command core's shell: the ledger on disk, and one executor thread (a Loop:
supervised, and on the watchdog gate while a command runs, idle while none is queued).

Everything that touches the core runs on the link thread (the runner calls in): a
command received, one finished (the executor posts it back), a result confirmed. Each
is an event for the core's ``handle``, and its effects are done in the order given: a
``Persist`` (the ledger, synced when it says so) before the ``Run`` it records, which is
what makes "at most once" hold across a power cut.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable

from ..base.boot import boot_token
from ..base.journal_fields import journal
from ..runtime.loop import Loop
from ..runtime.watchdog_gate import WatchdogGate
from . import ledger
from .actions import Actions
from .core import (LATER, RESEND, CommandCore, Connected, Effect, Finished, Outcome, Persist,
                   Received, Recovered, Report, ResultAcked, Run)

log = logging.getLogger("edge_agent.commands")

# The longest command_timeout_s the configuration takes: the bound assumed for actions
# that do not say their own.
LONGEST_TIMEOUT_S = 3600.0


def max_silence_s(timeout_s: float) -> float:
    """What the watchdog gate allows the executor for one command. Each command's own
    bound is the configured timeout (a configured command, the journal gate's reply);
    the rest (a DNS lookup's 3 s, a bundle queued on the card) takes seconds. Twice the
    timeout and a minute past it is a wedge, not a slow command."""
    return 2 * timeout_s + 60.0


class CommandService:
    def __init__(self, path: str, allow: frozenset, actions: Actions,
                 on_finished: Callable[[str, Outcome, float], None], runtime_dir: str,
                 clock: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic, ids_ours: bool = False,
                 on_storage_error: Callable[[str, OSError], None] | None = None,
                 gate: WatchdogGate | None = None,
                 server_now: Callable[[float], float | None] = lambda mono: None):
        """``ids_ours``: the server's protocol has no command ids (ScreenTinker), the
        profile mints a random one per message, which nothing can send again, so
        forgetting one needs no horizon (core.py). ``on_finished(id, outcome, started)``
        hands a finished command to the link thread, whose finished() records it.
        ``on_storage_error(path, error)``: the ledger could not be written. ``gate``: the
        executor is on the watchdog gate while a command runs. ``server_now(mono)``: the
        server's clock as the link measured it (base/server_clock.py), None before a
        measure: a command's expiry is judged by it, never by this device's clock."""
        self.path = path
        loaded = ledger.load(path, clock())
        self._ledger = ledger.Ledger(path, loaded)
        self._on_storage_error = on_storage_error
        self.core = CommandCore(allow, loaded.entries, loaded.floor, loaded.closed, ids_ours)
        self.actions = actions
        self._on_finished = on_finished
        self._server_now = server_now
        self._clock = clock
        self._mono = mono
        self._boot, self._pid = boot_token(runtime_dir), os.getpid()
        self._jobs: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        # results said since start, by the metrics' words: ok, error (it ran and
        # failed), refused (it never ran); a resend's stored result is not a new one
        self.results = {"ok": 0, "error": 0, "refused": 0}
        self.loop = Loop("commands", self._work, gate=gate,
                         max_silence_s=max_silence_s(getattr(actions, "timeout_s",
                                                             LONGEST_TIMEOUT_S))
                         + getattr(actions, "read_back_s", 0.0),
                         pause=self._stopping.wait, stopping=self._stopping.is_set)

    # -- on the link thread --------------------------------------------------------
    def start(self) -> list[Report]:
        updater = self.actions.updater
        updates = updater.recover(self.core.running("update")) if updater else None
        reports = self._do(self.core.handle(Recovered(self._boot, self._pid, self._clock(),
                                                      updates)))
        for r in reports:
            log.info("command %s (%s) from before this start: %s", r.result["id"],
                     r.result["name"], r.result.get("output") or r.result.get("error"))
        self.loop.start()
        return reports

    def received(self, raw) -> list[Report]:
        now, mono = self._clock(), self._mono()
        reports = self._do(self.core.handle(Received(raw, now, mono, self._server_now(mono),
                                                     self._boot, self._pid)))
        for r in reports:
            self._log_result(r.result, r.why)
        return reports

    def finished(self, cid: str, outcome, started: float) -> list[Report]:
        if outcome is LATER:
            return []  # its result is known after the restart it causes
        reports = self._do(self.core.handle(Finished(cid, outcome.ok, outcome.output,
                                                     outcome.error, started, self._clock(),
                                                     outcome.extra)))
        for r in reports:
            self._log_result(r.result)
        return reports

    def acked(self, cid: str) -> None:
        self._do(self.core.handle(ResultAcked(cid)))

    def unacked(self) -> list[Report]:
        return self._do(self.core.handle(Connected()))

    def recent(self, n: int = 10) -> list[dict]:
        """The latest results, for `edge-agent status`."""
        done = sorted((e for e in self.core.entries.values() if e.result),
                      key=lambda e: e.received_at)[-n:]
        out = []
        for e in done:
            r = e.result
            state = "done" if r["ok"] else ("failed" if "started_at" in r else "refused")
            out.append({"id": e.id, "command": e.name, "ok": r["ok"], "at": r["finished_at"],
                        "result": f"{state}: {r.get('output') or r.get('error') or ''}"[:300]})
        return out

    def stop(self) -> None:
        """From the daemon on its way out: nothing more starts, and a command's
        processes are killed (the ledger says it was interrupted; never run again)."""
        self._stopping.set()
        self.actions.stop()
        self._jobs.put(None)

    # -- internals -------------------------------------------------------------------
    def _do(self, effects: list[Effect]) -> list[Report]:
        """The core's effects, in their order (the order is the rule: a Run after the
        Persist that records it); returns the Reports, for the link to send."""
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
                log.info("server command %s: running %r %s", effect.id, effect.name,
                         effect.args or "", extra=journal(COMMAND_ID=effect.id))
                self._jobs.put(effect)
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
            self.loop.idle()   # waiting for a command: nothing to be stuck on
            job = self._jobs.get()
            if job is None or self._stopping.is_set():
                return  # queued ones stay "running" in the ledger: reported, never run
            self.loop.turn()
            started = self._clock()
            try:
                outcome = self.actions.run(job.name, job.args, job.id)
            except Exception as e:  # a bug in one command must not end the others
                log.error("command %s failed: %s: %s", job.name, type(e).__name__, e,
                          exc_info=True)
                outcome = Outcome(False, error=f"internal error: {type(e).__name__}")
            self._on_finished(job.id, outcome, started)
