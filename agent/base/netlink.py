"""The kernel's rtnetlink tables, read: one dump request on a socket of its own, bounded in
time (the socket's timeout, an overall deadline) and in bytes, and the attributes of its
messages. The one reader of rtnetlink in the agent: the network healer's reads
(device/netlink.py), the inventory's interfaces and routes, the events' links.

A netlink socket is what iproute2's ``ip`` would have opened (the unit's
``RestrictAddressFamilies=`` allows AF_NETLINK); ``ip`` itself is stopped by the unit's
sandbox, and a minimal image has none.
"""
from __future__ import annotations

import socket
import struct
import time

NETLINK_ROUTE = 0
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
HEADER = struct.Struct("=IHHII")
TIMEOUT_S = 5.0
MAX_BYTES = 4 << 20        # a dump, at most (a router's neighbour table is larger)


class NetlinkError(OSError):
    """The kernel did not answer the dump (no netlink here, refused, too large, too slow,
    a message cut short). An OSError: what a caller does without netlink, it does here."""


def messages(data: bytes):
    """(type, payload) of each netlink message in one datagram; NetlinkError for a message
    cut short."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < HEADER.size or offset + length > len(data):
            raise NetlinkError("a message cut short")
        yield kind, data[offset + HEADER.size:offset + length]
        offset += (length + 3) & ~3


def attributes(payload: bytes, offset: int) -> dict[int, bytes]:
    """The attributes of one message from ``offset`` (past its family's header), by type
    without the NLA_F_ bits; the first of a type repeated, up to the first cut short."""
    out: dict[int, bytes] = {}
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4 or offset + length > len(payload):
            break
        out.setdefault(kind & 0x3FFF, payload[offset + 4:offset + length])
        offset += (length + 3) & ~3
    return out


def u32(raw: bytes | None, default: int) -> int:
    """An attribute's native 32-bit unsigned value, or ``default`` if absent or not 4 bytes."""
    return struct.unpack("=I", raw)[0] if raw is not None and len(raw) == 4 else default


def dump(kind: int, body: bytes, timeout_s: float = TIMEOUT_S,
         max_bytes: int = MAX_BYTES) -> list[tuple[int, bytes]]:
    """(type, payload) of each message of one dump request of this thread's network
    namespace; NetlinkError past ``max_bytes`` or ``timeout_s``, or when refused."""
    deadline = time.monotonic() + timeout_s
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                           NETLINK_ROUTE) as s:
            s.bind((0, 0))
            s.sendall(HEADER.pack(HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP,
                                  1, 0) + body)
            found, seen = [], 0
            while True:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                data = s.recv(1 << 16)
                seen += len(data)
                if seen > max_bytes or time.monotonic() > deadline:
                    raise NetlinkError(f"a dump past {max_bytes} bytes or {timeout_s:g} s")
                for mtype, payload in messages(data):
                    if mtype == NLMSG_DONE:
                        return found
                    if mtype == NLMSG_ERROR:
                        error = struct.unpack_from("=i", payload)[0] if len(payload) >= 4 \
                            else 0
                        if error:
                            raise NetlinkError(f"refused: errno {-error}")
                        return found
                    found.append((mtype, payload))
    except NetlinkError:
        raise
    except OSError as e:   # no netlink (a sandbox without it), the timeout
        raise NetlinkError(e.strerror or type(e).__name__) from None
