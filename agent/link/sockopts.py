"""Kernel-level liveness on the link's real TCP socket.

TCP keepalive keeps NAT and firewall state warm and lets the kernel notice a dead
peer on an idle socket; TCP_USER_TIMEOUT bounds how long sent data may stay
unacknowledged before the kernel errors the socket. They are set on the live socket
after every connect (not through a library hook), so they apply on bookworm's
python3-engineio 4.3.4, which has no ``websocket_extra_options``, and on current
releases alike.
"""
from __future__ import annotations

import socket
import struct

from ..config.policies import KeepalivePolicy

# Linux constant; Python exposes it as socket.TCP_USER_TIMEOUT on 3.11 only on some builds.
TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)


def apply_keepalive(sock: socket.socket, policy: KeepalivePolicy) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, policy.idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, policy.interval_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, policy.count)
    sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, int(policy.user_timeout_s * 1000))


def read_keepalive(sock: socket.socket) -> dict:
    """What the kernel holds for this socket; used by status and the tests."""
    return {
        "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        "idle_s": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        "interval_s": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        "user_timeout_ms": sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT),
    }


def abort(sock: socket.socket) -> None:
    """Abortive close: wake every thread blocked on the socket and free it with an RST.

    A half-open socket must not linger: the FIN of a graceful close would be
    retransmitted into the void for minutes, and a reader blocked in recv() is only
    woken by shutdown(), not by close().
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
