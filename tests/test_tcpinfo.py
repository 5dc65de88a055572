"""TCP_INFO on real sockets: what the kernel says about delivery, on loopback and
through a silent drop (nftables in the test's own network namespace)."""
import socket
import time

import pytest

from agent.link import tcpinfo


def _pair():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    server.close()
    return client, peer


def _settled(sock, timeout=2.0):
    deadline = time.monotonic() + timeout
    while True:
        info = tcpinfo.read(sock)
        if info.unacked == 0 or time.monotonic() > deadline:
            return info
        time.sleep(0.01)


def test_bytes_the_peer_acknowledged_are_delivered():
    client, peer = _pair()
    with client, peer:
        before = tcpinfo.read(client)
        assert before is not None and before.established
        client.sendall(b"42[\"device:heartbeat\",{\"seq\":1}]")
        after = _settled(client)
        assert tcpinfo.delivered(before, after) is True
        assert after.bytes_acked > before.bytes_acked and 0 < after.rtt_s < 1
        # nothing new written: no new proof
        assert tcpinfo.delivered(after, tcpinfo.read(client)) is False


def test_the_kernel_cannot_tell_about_what_is_not_a_tcp_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert tcpinfo.read(udp) is None
    assert tcpinfo.read(None) is None
    assert tcpinfo.delivered(None, None) is None


@pytest.mark.netns
def test_a_silently_dropped_flow_leaves_the_heartbeat_undelivered(netns):
    client, peer = _pair()
    with client, peer:
        netns.drop_flow(client.getsockname()[1], client.getpeername()[1])
        before = tcpinfo.read(client)
        client.sendall(b"42[\"device:heartbeat\",{\"seq\":2}]")
        time.sleep(0.5)
        after = tcpinfo.read(client)
        assert after.unacked > 0 and after.bytes_acked == before.bytes_acked
        assert tcpinfo.delivered(before, after) is False
        netns.restore()
        assert tcpinfo.delivered(before, _settled(client, timeout=5.0)) is True
