"""What the kernel knows about the link's TCP connection: TCP_INFO on the live socket.

A server that ACKs no heartbeat (ScreenTinker before 1.9) still has a TCP stack that
acknowledges every byte it receives. After a heartbeat is written, the socket saying
"everything sent has been acknowledged, and more than before" proves the heartbeat
reached the server's host; a silently dropped flow leaves the bytes unacknowledged.
The server's pings stay the slower proof that the application, not only its host,
is alive (liveness.py).
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

# struct tcp_info (include/uapi/linux/tcp.h): the fields read here, by offset. All of
# them exist since Linux 4.6 (tcpi_notsent_bytes is the newest); an older kernel
# returns a shorter struct and no proof is taken from it.
_TCP_INFO = getattr(socket, "TCP_INFO", 11)
_STATE, _RETRANSMITS = 0, 2
_UNACKED = struct.Struct("=I"), 24
_RTT_US = struct.Struct("=I"), 68
_BYTES_ACKED = struct.Struct("=Q"), 120
_NOTSENT = struct.Struct("=I"), 144
_NEEDED = 148
_ESTABLISHED = 1


@dataclass(frozen=True)
class TcpProgress:
    established: bool
    bytes_acked: int      # by the peer's TCP, over the connection's life
    unacked: int          # segments in flight, not yet acknowledged
    notsent: int          # bytes written but still in the socket's queue
    retransmits: int      # of the segment at the head, right now
    rtt_s: float          # the kernel's smoothed round-trip time


def read(sock: socket.socket | None) -> TcpProgress | None:
    """The socket's progress, or None where the kernel cannot say (no socket, not
    TCP, a kernel before 4.6)."""
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except OSError:
        return None
    if len(raw) < _NEEDED:
        return None

    def field(spec) -> int:
        fmt, offset = spec
        return fmt.unpack_from(raw, offset)[0]

    return TcpProgress(established=raw[_STATE] == _ESTABLISHED,
                       bytes_acked=field(_BYTES_ACKED), unacked=field(_UNACKED),
                       notsent=field(_NOTSENT), retransmits=raw[_RETRANSMITS],
                       rtt_s=field(_RTT_US) / 1e6)


def delivered(before: TcpProgress | None, after: TcpProgress | None) -> bool | None:
    """Whether what was written between ``before`` and ``after`` has reached the peer:
    True when the peer acknowledged more bytes than before and nothing is left in
    flight or queued; False when something is; None when the kernel cannot tell."""
    if before is None or after is None:
        return None
    if not after.established:
        return False
    return (after.bytes_acked > before.bytes_acked and after.unacked == 0
            and after.notsent == 0 and after.retransmits == 0)
