"""What the server may send: a message over the bound is refused before it is read, so
is anything binary (the protocols are JSON text), and what the client libraries log
about bad input costs a bounded number of bytes.

The end-to-end tests run the agent against devtools/hostile_peer.py (a real
python-socketio server) in the tests' network namespace; the frame tests feed
websocket-client real frames over a real socket pair.
"""
import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from agent.link import frames as F
from devtools.harness import REPO, agent_config, terminate, wait_for

MiB = 1024 * 1024


class HostilePeer:
    def __init__(self, workdir, *args):
        port_file = workdir / "peer-port"
        self.log = open(workdir / "peer.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "devtools.hostile_peer",
                                      "--port-file", str(port_file), *args],
                                     cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(port_file.exists, 15, what="the hostile peer to listen")
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"
        self.devices = {"screen-1": "any-token"}

    def state(self) -> dict:
        with urllib.request.urlopen(self.url + "/state", timeout=5) as r:
            return json.loads(r.read())

    def go(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.url + "/go", data=b""), timeout=5).close()


@pytest.fixture
def peer(netns, tmp_path):
    peers = []

    def start(*args):
        peers.append(HostilePeer(tmp_path, *args))
        return peers[-1]

    yield start
    for p in peers:
        terminate(p.proc)
        p.log.close()


# The agent's peak RSS after the worst the server may send (MemoryMax=128M): measured
# 66-77 MB after a message of dense JSON at the bound (idle 36-48 MB), 140-165 MB
# before the bound came down from 4 MiB and binary was refused.
PEAK_MB = 100


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


# -- end to end ------------------------------------------------------------------------

@pytest.mark.netns
def test_a_40_mb_message_is_refused_unread_and_the_link_comes_back(
        peer, spawn_agent, agent_python, tmp_path):
    # first a message at the bound, which is taken, then one of 40 MB, which is not
    server = peer("--big-bytes", str(F.MAX_MESSAGE_BYTES), "--big-bytes", str(40 * MiB))
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15, connection=1)
    server.go()
    agent.wait_live(10, connection=2)
    peak = peak_rss_mb(agent.pid)
    print(f"peak RSS {peak:.1f} MB")
    assert peak < 80, f"the agent's peak RSS was {peak:.1f} MB"
    text = agent.log_text()
    taken = text.find("ignoring unknown server event 'device:big'")
    lost = text.find("link lost: message-too-large (the server sent a message of 41943040 bytes")
    assert 0 <= taken < lost, text[-2000:]
    assert text.count("link lost") == 1
    assert len(server.state()["connects"]) == 2


@pytest.mark.netns
def test_an_event_with_binary_attachments_is_refused_before_they_are_read(
        peer, spawn_agent, agent_python, tmp_path):
    # 25 attachments each under the bound: the library would keep all of them (100 MB)
    server = peer("--binary-parts", f"25x{4 * MiB - 64}")
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15, connection=1)
    server.go()
    agent.wait_live(10, connection=2)
    peak = peak_rss_mb(agent.pid)
    print(f"peak RSS {peak:.1f} MB")
    assert peak < PEAK_MB, f"the agent's peak RSS was {peak:.1f} MB"
    text = agent.log_text()
    assert ("link lost: message-refused (the server sent a Socket.IO packet with binary "
            "attachments)") in text, text[-2000:]
    assert text.count("link lost") == 1
    assert "'device:binary'" not in text
    assert len(server.state()["connects"]) == 2


@pytest.mark.netns
def test_dense_json_is_taken_at_the_bound_and_refused_over_it(
        peer, spawn_agent, agent_python, tmp_path):
    # "[{},{},...]" is the text that costs most to parse: one at the bound is taken,
    # one just under the old bound of 4 MiB (143 MB once parsed) is not
    server = peer("--dense-bytes", str(F.MAX_MESSAGE_BYTES), "--dense-bytes", str(4 * MiB - 64))
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15, connection=1)
    server.go()
    agent.wait_live(10, connection=2)
    peak = peak_rss_mb(agent.pid)
    print(f"peak RSS {peak:.1f} MB")
    assert peak < PEAK_MB, f"the agent's peak RSS was {peak:.1f} MB"
    text = agent.log_text()
    taken = text.find("ignoring unknown server event 'device:dense'")
    lost = text.find(f"link lost: message-too-large (the server sent a message of {4 * MiB - 64} "
                     "bytes")
    assert 0 <= taken < lost, text[-2000:]
    assert text.count("link lost") == 1
    assert len(server.state()["connects"]) == 2


@pytest.mark.netns
def test_500_malformed_packets_cost_a_bounded_journal(peer, spawn_agent, agent_python, tmp_path):
    server = peer("--malformed", "500")
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15, connection=1)
    before = agent.log_path.stat().st_size
    server.go()
    # the agent has read all 500 once it tells of the event the peer sent after them
    wait_for(lambda: "'device:end-of-junk'" in agent.log_text(), 15,
             what="the agent to read 500 malformed packets")
    time.sleep(0.5)  # the library's threads for the last of them end
    assert agent.link()["connection"] == 1, "bad packets must not cost the link"
    agent.stop()
    written = agent.log_path.stat().st_size - before
    text = agent.log_text()
    print(f"{written} bytes written for 500 malformed packets")
    assert written < 20_000, f"{written} bytes: {text[-3000:]}"
    assert "held back" in text and "more like this" in text, text[-3000:]
    assert "Traceback" not in text


@pytest.mark.netns
def test_a_handshake_that_opens_with_a_40_mb_frame_is_refused_unread(
        netns, agent_python, tmp_path):
    """The Engine.IO OPEN packet is read before the library keeps the websocket: the
    bound holds there too, and the attempt fails with the reason, at once."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = {}

    def serve():
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            key = [line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                   if line.lower().startswith(b"sec-websocket-key:")][0]
            accept = base64.b64encode(hashlib.sha1(
                key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            try:
                conn.sendall(frame(0x1, 40 * MiB) + b"0" + b"x" * 65536)
                seen["rest"] = conn.recv(1)  # the client hangs up instead of reading on
            except OSError as e:
                seen["rest"] = e

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    script = ("import sys\n"
              "from agent.base.egress import Egress\n"
              "from agent.config.policies import KeepalivePolicy\n"
              "from agent.link.transport import SocketIOTransport, TransportError\n"
              "t = SocketIOTransport(url=sys.argv[1], auth=None, namespace='/',\n"
              "    keepalive=KeepalivePolicy(), connect_timeout_s=10, egress=Egress(),\n"
              "    generation=1, sink=lambda *a: None)\n"
              "try:\n    t.open()\nexcept TransportError as e:\n    print(e.reason, e.detail)\n"
              "else:\n    print('connected')\n")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    r = subprocess.run([agent_python, "-c", script, url], capture_output=True, text=True,
                       timeout=30, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    server.join(5)
    listener.close()
    assert r.stdout.startswith("message-too-large the server sent a message of 41943040 bytes"), \
        r.stdout + r.stderr[-2000:]
    assert seen["rest"] in (b"",) or isinstance(seen["rest"], OSError)


# -- the frame reader, over a real socket pair ---------------------------------------

def frame(opcode: int, length: int, fin: bool = True) -> bytes:
    """A server's frame header (unmasked) announcing ``length`` bytes of payload."""
    b1 = (0x80 if fin else 0) | opcode
    if length < 126:
        return struct.pack("!BB", b1, length)
    if length < 65536:
        return struct.pack("!BBH", b1, 126, length)
    return struct.pack("!BBQ", b1, 127, length)


@pytest.fixture
def pair():
    ours, server = socket.socketpair()
    ws = F.BoundedWebSocket()
    ws.sock, ws.connected = ours, True
    ws.settimeout(3)
    senders = []

    def send(data: bytes):
        t = threading.Thread(target=server.sendall, args=(data,), daemon=True)
        t.start()
        senders.append(t)

    yield ws, server, send
    ours.close()
    server.close()


def test_a_frame_over_the_bound_is_refused_from_its_header(pair):
    ws, server, send = pair
    send(frame(0x1, 40 * MiB) + b"x" * 1000)   # the rest never comes: reading on would hang
    with pytest.raises(F.MessageTooLarge) as refused:
        ws.recv()
    assert refused.value.size == 40 * MiB
    assert ws.refused is refused.value
    server.settimeout(3)
    assert server.recv(1) == b""   # and the connection is ended, not left to drain


def test_a_message_is_bounded_as_a_whole_across_its_fragments(pair):
    ws, server, send = pair
    limit = F.MAX_MESSAGE_BYTES
    send(frame(0x1, limit) + b"a" * limit)               # at the bound: taken
    assert len(ws.recv()) == limit
    half = limit // 2
    send(frame(0x1, half, fin=False) + b"b" * half       # fragments up to the bound,
         + frame(0x9, 4) + b"ping"                       # a ping between them,
         + frame(0x0, limit - half, fin=False) + b"c" * (limit - half)
         + frame(0x0, 1))                                # and one byte more: refused
    with pytest.raises(F.MessageTooLarge) as refused:
        ws.recv()
    assert refused.value.size == limit + 1


def test_a_binary_frame_is_refused_from_its_header(pair):
    ws, server, send = pair
    send(frame(0x2, 1000) + b"x" * 10)   # the rest never comes: reading on would hang
    with pytest.raises(F.MessageRefused, match="binary websocket frame") as refused:
        ws.recv()
    assert refused.value.reason == "message-refused"
    assert ws.refused is refused.value
    server.settimeout(3)
    assert server.recv(1) == b""


@pytest.mark.parametrize("packet_type", [b"5", b"6"])
def test_a_packet_with_attachments_is_refused_however_it_is_fragmented(pair, packet_type):
    ws, server, send = pair
    send(frame(0x1, 2) + b"42")                                  # a plain event: taken
    assert ws.recv() == "42"
    send(frame(0x1, 1, fin=False) + b"4"                         # "45..." split after the "4",
         + frame(0x9, 4) + b"ping"                               # a ping between,
         + frame(0x0, 10) + packet_type + b'1-["x",{}')        # the rest in a last fragment
    with pytest.raises(F.MessageRefused, match="binary attachments"):
        ws.recv()
    server.settimeout(3)
    sent = b""
    while chunk := server.recv(4096):   # the pong, then the end
        sent += chunk
    assert sent[:1] == b"\x8a" and len(sent) == 2 + 4 + 4


@pytest.mark.netns
def test_a_hostile_screentinker_cannot_spawn_threads_or_flood_the_card_and_the_journal(
        peer, spawn_agent, agent_python, tmp_path):
    """2,000 device:registered with alternating tokens made a library thread each (two
    read loops died under TasksMax) and 978 fsync'd credential writes; 40 device:paired
    naming the screen with 900 KB each wrote 36 MB to the journal. Now: the messages are
    taken in on the read loop, the card is written a few times, every line is cut."""
    server = peer("--registered-flood", "2000", "--paired-names", "40x900000")
    cfg = agent_config(server, tmp_path, server={"profile": "screentinker"},
                       identity={"device_id": None, "token": None})
    agent = spawn_agent(agent_python, cfg)
    wait_for(lambda: len(server.state()["heartbeats"]) >= 1, 20, what="a first heartbeat")
    creds = tmp_path / "state" / "credentials.json"
    threads, inodes = [], set()
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                with open(f"/proc/{agent.pid}/status") as f:
                    threads.extend(int(l.split()[1]) for l in f if l.startswith("Threads:"))
                inodes.add(os.stat(creds).st_ino)
            except OSError:
                pass
            stop.wait(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = agent.log_path.stat().st_size
    server.go()
    try:
        wait_for(lambda: server.state()["flood_sent_at"], 60, interval=0.2, what="the flood sent")
        flood_end = server.state()["flood_sent_at"]
        wait_for(lambda: sum(t > flood_end for t in server.state()["heartbeats"]) >= 2, 20,
                 interval=0.2, what="heartbeats on after the flood")
    finally:
        stop.set()
        sampler.join(5)
    # (each device:unpaired between the names is obeyed: a new registration)
    agent.wait_live(20)
    written = agent.log_path.stat().st_size - before
    print(f"threads at most {max(threads)}; {len(inodes)} credential files seen; "
          f"{written} bytes of log")
    assert max(threads) < 30, f"{max(threads)} threads"
    assert len(inodes) <= 6, f"{len(inodes)} credential writes seen (sampled)"
    assert written < 200_000, agent.log_text()[-3000:]
    assert "Traceback" not in agent.log_text()


WAITING_HANDLER = r"""
import json, sys, threading, time
from agent.base.egress import Egress
from agent.link import protocol
from agent.config.policies import KeepalivePolicy
from agent.link.transport import SocketIOTransport
handled = []
def slow_command(_t, data=None, *_):
    # a command's receipt waits for the ledger: a card slow to sync
    handled.append(time.monotonic())
    time.sleep(3.0)
    return {"ok": True}
t = SocketIOTransport(url=sys.argv[1], auth=protocol.connect_auth("screen-1", sys.argv[2], "t"),
                      namespace="/", keepalive=KeepalivePolicy(), connect_timeout_s=5,
                      egress=Egress(), generation=1, sink=lambda *a: None,
                      handlers={protocol.COMMAND: slow_command})
t.open()
print("connected", flush=True)
delays, start = [], time.monotonic()
while time.monotonic() - start < 6.0:
    sent, got = time.monotonic(), threading.Event()
    t.emit(protocol.HEARTBEAT, protocol.heartbeat(len(delays) + 1, time.time(), 1.0),
           lambda *a: got.set())
    got.wait(5.0)
    delays.append(round(time.monotonic() - sent, 3) if got.is_set() else None)
    time.sleep(0.2)
threads = threading.active_count()
t.close()
print(json.dumps({"handled": len(handled), "delays": delays, "threads": threads}), flush=True)
"""


@pytest.mark.netns
def test_a_handler_that_waits_never_holds_a_heartbeats_ack_back(fleet, agent_python, tmp_path):
    """The server's events are taken in on one thread of the connection, ACKs on the
    read loop: a command whose receipt waits 3 s for the card does not delay the proof
    of the link (with ACKs behind it, a 1 s ACK timeout would end a healthy link)."""
    server = fleet(devices={"screen-1": "t0ken-screen-1"})
    proc = subprocess.Popen([agent_python, "-c", WAITING_HANDLER, server.url, "t0ken-screen-1"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "connected"
        time.sleep(0.5)
        server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "diagnostics",
                                          "args": {}})
        out = json.loads(proc.stdout.readline())
    finally:
        terminate(proc)
    assert out["handled"] == 1, out
    assert None not in out["delays"] and max(out["delays"]) < 0.5, out
    assert out["threads"] <= 6, out
