"""The server's events on one connection, on one thread of their own."""
from __future__ import annotations

import logging
import queue
from typing import Any, Callable

from ..runtime.threads import start_worker

log = logging.getLogger("edge_agent.link")


class EventHandlers:
    """The server's events on one connection, one after another, on one thread: never
    a thread per message, never a handler on the read loop. Its queue is bounded: a
    server that sends faster than the handlers take them in waits on its own TCP
    window, as it would for a slow reader."""

    QUEUE = 256

    def __init__(self, name: str):
        self.name = name
        self._queue: queue.Queue = queue.Queue(self.QUEUE)
        self._stopped = False

    def start(self) -> None:
        start_worker(self.name, self.run, reason="a connection's event handlers, one after "
                     "another; ended by stop() when the connection is released")

    def put(self, handle: Callable[[], Any]) -> None:
        if not self._stopped:
            self._queue.put(handle)

    def stop(self) -> None:
        """After the connection: what is queued is dropped, as its news would be."""
        self._stopped = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    def run(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None or self._stopped:
                return
            try:
                handle()
            except Exception:   # the library logs a handler's error itself; this is a bug
                log.exception("a server event's handler failed")

