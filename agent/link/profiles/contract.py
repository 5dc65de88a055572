"""What a server profile is: how the one link (watchdog, backoff, keepalive, journal)
speaks to a particular server. The core and the runner never change per server; a
profile only maps their actions onto a wire protocol and the server's messages back
onto inbox news (inbox.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

Post = Callable[[tuple], None]   # news for the runner about this connection (inbox.py)


@dataclass
class ProfileContext:
    """What a profile may know and do about the device's identity."""
    device_id: Callable[[], str]
    token: Callable[[], str | None]
    # a server handed a token (and its own id for us); screentinker: at registration
    on_token: Callable[..., None] = lambda token, device_id=None, pairing_code=None: None
    on_unpaired: Callable[[], None] = lambda: None  # the server dropped us
    facts: Callable[[], dict] = lambda: {}
    # screentinker: the code this device registered with, and whether an operator
    # has claimed it since, both kept with the credentials across restarts
    pairing_code: Callable[[], str | None] = lambda: None
    claimed: Callable[[], bool] = lambda: False
    on_claimed: Callable[[str], None] = lambda name: None
    telemetry: Callable[[], dict] = lambda: {}
    # what [commands] allow lets run here, and whether this process is the first of its boot
    allowed_commands: frozenset = frozenset()
    cold_start: bool = False
    # the screen's commands (brightness, volume, restart-player, poweroff) this screen
    # has the means for (agent/screen/controls.py); None (or None from it: no screen
    # has said yet): not asked, every allowed one
    means: Callable[[], frozenset | None] | None = None


def uncarried(profile, kind: str) -> str | None:
    """Why ``profile`` (a ServerProfile class or instance) cannot deliver an upload of
    ``kind``, or None: a profile that carries uploads over its link carries only its
    own kinds, and nothing of another kind is queued (or made) for it."""
    carried = profile.link_upload_kinds
    if carried and kind not in carried:
        return (f"the {profile.name} profile carries no {kind} uploads (it carries "
                f"{', '.join(sorted(carried))})")
    return None


class ServerProfile(Protocol):
    name: str
    # pairing happens inside the link (the server hands the token at registration),
    # not over HTTP before it: such a profile connects without a token
    pairs_in_link: bool
    supports_events: bool          # device:event with ACKs
    registers: bool                # uploads wait for the server's registration
    link_upload_kinds: frozenset   # upload kinds carried over the link, not HTTP
    namespace: str
    transports: list[str]

    def __init__(self, ctx: ProfileContext) -> None: ...

    @property
    def pairing_code(self) -> str | None:
        """The code this screen shows until claimed (pairs_in_link only)."""

    def auth(self) -> dict | None: ...

    def handlers(self, post: Post) -> dict: ...

    def on_connected(self, transport, post: Post) -> None: ...

    def send_heartbeat(self, transport, seq: int, wall: float, uptime_s: float, post: Post,
                       now: Callable[[], float]) -> None: ...

    def send_report(self, transport, connections: list[dict], offline_s: float | None,
                    wall: float, on_ack: Callable) -> None: ...

    def command_result(self, result: dict) -> tuple[str, dict, bool]:
        """(event, payload, whether the server confirms it)."""

    def declaration(self) -> tuple[str, dict] | None:
        """The message that tells the server again what this screen can do, where the
        profile declares it (at registration), or None."""

    def incident(self, event: dict) -> tuple[str, dict] | None:
        """Where the server has no events (supports_events false): the message that
        tells it this one (an Event.payload()), sent once, or None: no place for it."""

    @staticmethod
    def enqueue_problem(kind: str, payload: bytes) -> str | None:
        """Why the server would drop this upload unread, checked before it is queued."""

    def upload_message(self, item) -> tuple[str, dict] | str:
        """The message carrying a queued item over the link, or why it cannot go."""

    def upload_gap_s(self, event: str, payload: dict) -> float: ...

    def forget_pairing(self) -> None:
        """Credentials dropped: the next registration shows a new code."""

    def network_returned(self) -> None:
        """The device's own network came back after being down (any thread)."""
