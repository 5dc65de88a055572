"""The link as the other parts see it: a typed port, and the plain records it speaks.

A part sends over the link, with or without confirmation, serves a request the server
makes by name, and hears when the link comes up (proven, and registered where the
server registers the device), goes down, or is registered. It never sees a connection,
a transport or the link's thread: the runner (runner.py) is the one implementation.

NamedTuples, not dataclasses: defined at import, they cost nothing to load.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, NamedTuple, Protocol


class Message(NamedTuple):
    """One message to the server in the profile's words. ``acked``: the server answers
    it with a Socket.IO ACK, which confirms it; otherwise the link's proof of delivery
    does (a later heartbeat's ACK, or the server's second ping: delivery.py)."""
    event: str
    payload: Any
    acked: bool = True


class Confirmation(NamedTuple):
    """What became of a confirmed send: ``ok`` when the server took it (its ACK said
    ok, or delivery was proven); ``answer``: the ACK's arguments; ``detail``: why not."""
    ok: bool
    answer: tuple = ()
    detail: str = ""


Confirm = Callable[[Confirmation], None]
# a served request: the server's raw message, and recorded() to call once the part has
# it for good (the link holds the server's receipt until then)
Handler = Callable[[Any, Callable[[], None]], None]


class LinkPort(Protocol):
    def send(self, message: Message) -> bool:
        """From any thread: written to the live connection (True), or there is none.
        Nothing confirms it."""

    def send_confirmed(self, messages: tuple[Message, ...], on_confirmed: Confirm) -> Hashable:
        """From any thread: ``on_confirmed`` is called once, from a thread of the link's,
        when the server confirmed the messages or they are lost with their connection;
        never if the link was down (a part sends again on link up). One message the
        server ACKs, or several under one proof of delivery. The key forgets them."""

    def forget(self, key: Hashable) -> None:
        """The sender stopped waiting: its confirmation never comes."""

    def serve(self, name: str, handler: Handler) -> None:
        """``handler`` takes the server's requests called ``name`` (a profile's words,
        link/protocol.py), on the connection's events thread; it must not block."""

    def subscribe(self, *, up: Callable[[], None] | None = None,
                  down: Callable[[], None] | None = None,
                  registered: Callable[[], None] | None = None) -> None:
        """Called on the link's thread: ``up`` once a connection is proven live (and
        registered, where the server registers the device), ``down`` when it ends,
        ``registered`` when the server registers the device on it."""

    def ready(self) -> bool:
        """Online, and registered where the server registers the device."""

    def proof_window_s(self) -> float:
        """How long a proof of delivery may take on this link."""
