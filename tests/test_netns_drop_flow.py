"""The test harness's own fault: ``NetNS.drop_flow`` drops one connection, and only that
one. A later connect that the kernel gave the dropped flow's local port (the test's own
request to the server, CI once: 'timed out' reading the server's table right after a
silent drop healed) was dropped with it."""
import socket
import struct

import pytest

from devtools.netns import NetNS

pytestmark = pytest.mark.netns


def _ports(drop: bool) -> list:
    with NetNS() as ns:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        port = server.getsockname()[1]
        low = 40000   # four ports to choose from: the dropped one would come up often
        with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
            f.write(f"{low} {low + 3}")
        if drop:
            ns.drop_flow(low, port)
        seen = []
        for _ in range(20):
            for end in ("client", "server"):
                if end == "client":
                    c = socket.socket()
                    c.settimeout(2)
                    c.connect(("127.0.0.1", port))
                    seen.append(c.getsockname()[1])
                else:
                    c, _ = server.accept()
                # closed with a reset: no TIME_WAIT holds a port
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.close()
        server.close()
        return seen


def test_a_dropped_flows_local_port_is_given_to_no_later_connect():
    assert 40000 in _ports(drop=False)   # the kernel would give it again
    assert 40000 not in _ports(drop=True)
