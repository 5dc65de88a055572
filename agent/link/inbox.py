"""What the link thread is told, from any thread: one immutable type per kind of news.

Two families. News about a connection (CONNECTION_NEWS) comes from the library's
threads, through the transport or a profile's handlers, and is dropped unread once
that connection is gone: the runner tags it with the connection's generation when it
is put. Everything else comes from the agent's other parts and holds whatever the
connection.

NamedTuples, not dataclasses: a frozen dataclass costs a millisecond to define here
(several on a Pi), and `edge-agent status` imports this through the profile list.
The runner dispatches on the type, never on equality.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, NamedTuple


# -- from the agent's other parts --------------------------------------------------

class Stop(NamedTuple):
    """SIGTERM, or the server asked for a restart."""


class Pause(NamedTuple):
    """No usable credentials: drop the link and stop connecting."""


class Resume(NamedTuple):
    """Credentials again: connect."""


class NetworkUp(NamedTuple):
    """The device's own network is back: connect now rather than wait out the backoff."""


class CredentialsDropped(NamedTuple):
    """This side dropped the credentials: register anew on a fresh connection."""
    why: str


class Deliver(NamedTuple):
    """Messages to carry under one proof of delivery (cargo.Parcel); see
    LinkRunner.send_confirmed."""
    parcel: Any


class Forget(NamedTuple):
    """The sender stopped waiting for this parcel's proof."""
    key: Hashable


# -- from the library's threads, about one connection ------------------------------

class HeartbeatAcked(NamedTuple):
    seq: int
    at: float   # monotonic


class BadAck(NamedTuple):
    why: str


class Malformed(NamedTuple):
    """A server message the profile could not read: ignored, said once."""
    what: str


class UnknownEvent(NamedTuple):
    name: Any


class Throttled(NamedTuple):
    """The server asked for no new connection for this long."""
    seconds: float


class ReconnectWindow(NamedTuple):
    """The server's span to spread reconnects over after it is lost."""
    seconds: float


class Drain(NamedTuple):
    """The server is about to stop: move to a new connection within this long."""
    seconds: float


class Registered(NamedTuple):
    """The server confirmed this device on this connection: what waits for it may go."""


class Unpaired(NamedTuple):
    """The server dropped this device's pairing: one fresh registration after its settle
    window, never sooner than the backoff says."""
    settle_s: float
    why: str


class Emit(NamedTuple):
    """A message the profile answers the server with: decided on the library's thread,
    sent by the link thread."""
    event: str
    payload: Any


class Request(NamedTuple):
    """A request of the server's, served by name (LinkRunner.serve): handed to its
    handler on the thread that posts it, never queued for the link thread."""
    name: str
    raw: Any
    via: str   # the server's event name
    # called once the part that serves it has it for good: the library's thread waits
    # for it before the server's receipt goes out
    recorded: Callable[[], None] = lambda: None


class ReportAcked(NamedTuple):
    upto_n: int
    answer: tuple


class Closed(NamedTuple):
    reason: str
    detail: str


# about the connection whose generation they are put with; stale once that one ends
CONNECTION_NEWS = frozenset({HeartbeatAcked, BadAck, Malformed, UnknownEvent, Throttled,
                             ReconnectWindow, Drain,
                             Registered, Unpaired, Emit, ReportAcked, Closed})
