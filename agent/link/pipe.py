"""The link's port (port.py), as the runner implements it: what the other parts send,
the requests they serve, and who hears the link come up, go down and get registered.
Sends the server ACKs go out on the caller's thread, straight onto the connection of
the moment, and their ACK comes back on the library's; what rides under the link's
proof of delivery goes through the link thread, which keeps the proof (cargo.py)."""
from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Callable, Hashable, NamedTuple

from . import inbox
from .cargo import Parcel
from .delivery import DELIVERED
from .port import Confirm, Confirmation, Handler, Message

if TYPE_CHECKING:
    from .runner import LinkRunner

log = logging.getLogger("edge_agent.link")


class Subscribers(NamedTuple):
    up: list
    down: list
    registered: list


class Pipe:
    """The runner's port (a collaborator of it: it reads the runner's connection)."""

    def __init__(self, runner: LinkRunner):
        self.runner = runner
        self.subscribers = Subscribers([], [], [])
        self._served: dict[str, Handler] = {}
        self._keys = itertools.count(1)
        self._warned: set[str] = set()

    # -- the port, from any thread ------------------------------------------------------
    def send(self, message: Message) -> bool:
        connection = self.runner.connection
        return connection is not None and connection.emit(message.event, message.payload)

    def send_confirmed(self, messages: tuple[Message, ...], on_confirmed: Confirm) -> Hashable:
        key = next(self._keys)
        if len(messages) == 1 and messages[0].acked:
            connection = self.runner.connection
            if connection is not None:
                connection.send_acked(messages[0].event, messages[0].payload, on_confirmed)
            return key

        def finish(verdict: str, detail: str) -> None:
            on_confirmed(Confirmation(verdict == DELIVERED, (), detail))

        self.runner.sink(None, inbox.Deliver(Parcel(key, messages, finish)))
        return key

    def declare(self) -> None:
        """From any thread: what the screen can do changed; a profile that declares it at
        registration (ScreenTinker's capabilities) says it again on the live link."""
        message = self.runner.profile.declaration()
        if message is not None:
            self.runner.sink(None, inbox.Emit(*message))

    def forget(self, key: Hashable) -> None:
        self.runner.sink(None, inbox.Forget(key))

    def serve(self, name: str, handler: Handler) -> None:
        self._served[name] = handler

    def subscribe(self, *, up: Callable[[], None] | None = None,
                  down: Callable[[], None] | None = None,
                  registered: Callable[[], None] | None = None) -> None:
        for callbacks, callback in ((self.subscribers.up, up), (self.subscribers.down, down),
                                    (self.subscribers.registered, registered)):
            if callback is not None:
                callbacks.append(callback)

    def ready(self) -> bool:
        return self.runner.ready()

    def proof_window_s(self) -> float:
        """How long delivery proof may take on this link: a heartbeat ACK's round trip,
        or, from a server that ACKs nothing, two of its ping intervals."""
        r = self.runner
        live = r.link.liveness
        return max(live.heartbeat_interval_s + live.ack_timeout_s,
                   2 * r.core.watchdog.server_ping_interval_s + live.ack_timeout_s)

    # -- the runner's side -------------------------------------------------------------
    def serve_request(self, news: inbox.Request) -> None:
        """On the thread that posted it (a connection's events thread): to the part
        that serves it, or its receipt goes at once where none does."""
        handler = self._served.get(news.name)
        if handler is None:
            if news.name not in self._warned:
                self._warned.add(news.name)
                log.warning("server asked for a %s (%s) and this agent serves none",
                            news.name, news.via)
            news.recorded()
            return
        handler(news.raw, news.recorded)

    def tell(self, callbacks: list) -> None:
        """On the link thread: what happened to the link, to those who asked."""
        for callback in callbacks:
            callback()
