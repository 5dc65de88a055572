"""The upgrade's answer is bounded in time and bytes (found by review of #28): a server
or a box that answers 101 and then floods or trickles a header cost the agent 37 s and
1.4 GB for 10 MiB (websocket-client reads it a byte at a time with no bound)."""
import os
import socket
import subprocess
import threading
import time

from agent.base import reasons as J
from devtools.harness import REPO


def _peer(answer):
    """A listener that reads the upgrade request, then calls answer(conn); (port, sent)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sent = {"bytes": 0}

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                answer(conn, sent)
            except OSError:
                pass
        listener.close()
    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], sent


SCRIPT = """
import sys, time
from agent.base.egress import Egress
from agent.config.policies import KeepalivePolicy
from agent.link.transport import SocketIOTransport, TransportError
t = SocketIOTransport(url=sys.argv[1], auth=None, namespace="/", keepalive=KeepalivePolicy(),
                      connect_timeout_s=float(sys.argv[2]), egress=Egress(), generation=1,
                      sink=lambda *a: None)
start = time.monotonic()
try:
    t.open()
    print("connected")
except TransportError as e:
    print(e.reason, e.timed_out, round(time.monotonic() - start, 2), e.detail)
"""


def _open(agent_python, port, timeout=2.0):
    """The transport on the agent's own stack (websocket-client 1.2.3 on bookworm's)."""
    r = subprocess.run([agent_python, "-c", SCRIPT, f"http://127.0.0.1:{port}", str(timeout)],
                       capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    words = r.stdout.split(" ", 3)
    assert len(words) == 4, r.stdout + r.stderr[-2000:]
    return words[0], words[1] == "True", float(words[2]), words[3]


def test_a_flood_of_header_is_refused_after_16_KiB(agent_python):
    def flood(conn, sent):
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nX-Junk: ")
        chunk = b"a" * 65536
        for _ in range(160):             # 10 MiB
            conn.sendall(chunk)
            sent["bytes"] += len(chunk)
    port, sent = _peer(flood)
    reason, _, took, detail = _open(agent_python, port)
    assert reason == J.HTTP_ERROR and "larger than" in detail, detail
    assert took < 2.0 and sent["bytes"] < 10 * 1024 * 1024


def test_a_trickled_answer_is_abandoned_at_the_connect_bound(agent_python):
    def trickle(conn, sent):
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n")
        for _ in range(100):
            conn.sendall(b"X")
            time.sleep(0.3)
    port, _ = _peer(trickle)
    reason, timed_out, took, detail = _open(agent_python, port, timeout=1.5)
    assert reason == J.NO_ANSWER and timed_out, (reason, detail)
    assert took < 2.5
