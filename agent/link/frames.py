"""What the agent takes from the server's websocket: messages of at most
``MAX_MESSAGE_BYTES``, and text only.

A message from the server over ``MAX_MESSAGE_BYTES`` is refused from its frame header,
before its payload is read, and ends the connection (``message-too-large``): the
library would otherwise buffer it whole and copy it several times on its way up (a
40 MB message took the agent past the unit's MemoryMax). The agent's protocols are
JSON text only, so anything binary is refused as soon as it is seen and ends the
connection too (``message-refused``): a binary websocket frame, from its header, and a
Socket.IO packet that announces binary attachments (``5``/``6``), before the library
parses it. The library keeps every attachment of an event in memory until the event
is complete, so a bound per message would not bound an event of many (25 of 4 MiB
took the agent to 133 MB). The agent only ever uses the websocket transport (engineio
connects with the first of ``transports``, and never falls back to or upgrades from
polling), so the websocket is the one door to guard.
"""
from __future__ import annotations

from typing import Any

import websocket

from ..base import reasons as J
from . import sockopts

# The largest message taken from the server. What the agent uses is small (ACKs,
# commands: a few KB), but a server may push more that the agent only ignores (a
# ScreenTinker playlist is for the player, ~600 bytes an item), and a message refused
# on every connect would be a reconnect loop: so not tight. What bounds it is the
# parse: dense JSON is up to ~37 times its size in Python objects (24x for
# "[{},{},...]", 37x for nested '{"":{"":{}}}'), so 4 MiB of it took the agent to
# 140-165 MB, past the unit's MemoryMax=128M. At 1 MiB "[{},...]" peaks at 66-77 MB
# (idle 36-48 MB), the worst nesting ~10 MB more.
MAX_MESSAGE_BYTES = 1024 * 1024

# Engine.IO MESSAGE ("4") carrying a Socket.IO BINARY_EVENT ("5") or BINARY_ACK ("6"):
# the start of an event whose binary attachments follow.
_BINARY_PACKETS = (b"45", b"46")


class MessageRefused(websocket.WebSocketException):
    """A message from the server the agent does not take; ends the connection."""
    reason = J.MESSAGE_REFUSED


class MessageTooLarge(MessageRefused):
    reason = J.MESSAGE_TOO_LARGE

    def __init__(self, size: int, limit: int):
        super().__init__(f"the server sent a message of {size} bytes, over the bound of "
                         f"{limit}")
        self.size = size


class _BoundedFrames(websocket.frame_buffer):
    """websocket-client's frame reader, refusing a message once its frame headers
    announce more than ``limit`` bytes, before any of its payload is read. A message
    split into continuation frames counts as a whole. A binary message is refused from
    its first frame's header (its continuation frames are never read), and a text
    message that starts a Socket.IO packet with attachments once its first two bytes
    are in, however the server fragments it."""

    def __init__(self, recv_fn, skip_utf8_validation: bool, limit: int):
        super().__init__(recv_fn, skip_utf8_validation)
        self.limit = limit
        self._message = 0  # announced so far for the message being received
        self._head = b""   # its first bytes, up to the two that name its packet type

    def recv_length(self) -> None:
        super().recv_length()
        opcode = self.header[4]
        if opcode == websocket.ABNF.OPCODE_BINARY:
            raise MessageRefused("the server sent a binary websocket frame")
        if opcode == websocket.ABNF.OPCODE_CONT:
            self._message += self.length
            size = self._message
        elif opcode == websocket.ABNF.OPCODE_TEXT:
            self._message = size = self.length
            self._head = b""
        else:
            size = self.length  # a control frame, interleaved: not part of the message
        if size > self.limit:
            raise MessageTooLarge(size, self.limit)

    def recv_frame(self):
        frame = super().recv_frame()
        if frame.opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_CONT) \
                and len(self._head) < 2:
            self._head += frame.data[:2 - len(self._head)]
            if self._head in _BINARY_PACKETS:
                raise MessageRefused("the server sent a Socket.IO packet with binary "
                                     "attachments")
        return frame


class BoundedWebSocket(websocket.WebSocket):
    """The websocket every connection of the agent uses. A refused message ends the
    connection at once: the rest of it is not read, and the server gets an RST.

    websocket-client's own UTF-8 check is pure Python, about 0.8 s a MiB here and ten
    times that on a Raspberry Pi, on the thread that reads the server's pings and ACKs;
    ``recv()`` decodes a text message strictly anyway (in C), which refuses bad UTF-8
    all the same, so the check is skipped."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs["skip_utf8_validation"] = True
        super().__init__(*args, **kwargs)
        self.frame_buffer = _BoundedFrames(self._recv, True, MAX_MESSAGE_BYTES)
        self.refused: MessageRefused | None = None

    def recv_frame(self):
        try:
            return super().recv_frame()
        except MessageRefused as e:
            self.refused = e
            if self.sock is not None:
                sockopts.abort(self.sock)
            raise
