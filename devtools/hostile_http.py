"""A fleet server gone bad, for the HTTP readers: answers that decompress to gigabytes,
and headers trickled a byte at a time; a websocket that only pings. Plus a driver that runs one of the agent's HTTP
readers against it in a process of its own, under a memory bound, so the test can run
it under each Python stack the agent ships on (Debian 12's urllib3 1.26, current 2.x).

    python -m devtools.hostile_http update|upload|enroll URL HEADROOM_MB BOUND_S

prints one JSON line: what the reader said, how long it took, its peak RSS growth.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import socket
import sys
import threading
import time
import zlib


def gzip_bomb(decoded: int, layers: int = 2) -> bytes:
    """``decoded`` zero bytes, gzipped ``layers`` times (made in chunks: never in memory)."""
    def gz(chunks):
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        out = [c.compress(x) for x in chunks]
        out.append(c.flush())
        return b"".join(out)
    body = gz(b"\0" * (1 << 20) for _ in range(decoded >> 20))
    for _ in range(layers - 1):
        body = gz([body])
    return body


@contextlib.contextmanager
def answering_server(body: bytes, headers: dict | None = None, status: int = 200,
                     seen: list | None = None):
    """Every request answered ``status`` with ``body`` and ``headers``, whatever it asked
    for (each one's method and path appended to ``seen``, with its monotonic time);
    yields the server's base URL."""
    class Answer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            if seen is not None:
                seen.append((time.monotonic(), self.command, self.path))
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:
                pass

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def bomb_server(body: bytes, encoding: str):
    """Every request answered 200 with ``body`` and ``Content-Encoding: encoding``,
    whatever the client asked for."""
    return answering_server(body, {"Content-Type": "application/json",
                                   "Content-Encoding": encoding})


@contextlib.contextmanager
def raw_server(serve, backlog: int = 16):
    """A socket server on loopback handing each connection to ``serve(conn, stop)`` on a
    thread of its own; ``stop`` is set when the block ends. Yields the base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn, stop), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def endless_chunk_server(for_s: float = 10.0):
    """Every request answered 200, ``Transfer-Encoding: chunked``, then a chunk-size line
    that never ends (a megabyte of digits at a time, for ``for_s``): urllib3 1.26's own
    chunked reader reads such a line whole."""
    def serve(conn, stop):
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                t0 = time.monotonic()
                while time.monotonic() - t0 < for_s and not stop.is_set():
                    conn.sendall(b"0" * (1 << 20))
            except OSError:
                pass

    return raw_server(serve, backlog=8)


def trickle_server(every_s: float = 0.2):
    """A raw socket server that accepts, reads the request, and sends its status line and
    headers one byte per ``every_s``, for ever: every read of the client is answered well
    within any read timeout, and the headers never end."""
    def serve(conn, stop):
        with conn:
            conn.settimeout(1.0)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100000
            for b in head:
                if stop.wait(every_s):
                    return
                try:
                    conn.sendall(bytes([b]))
                except OSError:
                    return

    return raw_server(serve)


def pinging_upgrade_server(every_s: float = 0.5):
    """A raw socket server that answers the websocket upgrade (101, its accept key
    right), then sends only websocket pings, one per ``every_s``, for ever: never
    Engine.IO's open, and every read of the client answered within any read timeout."""
    def serve(conn, stop):
        with conn:
            conn.settimeout(1.0)
            request = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    request += chunk
            key = next((line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                        if line.lower().startswith(b"sec-websocket-key:")), b"")
            accept = base64.b64encode(hashlib.sha1(
                key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            try:
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept
                             + b"\r\n\r\n")
                while not stop.wait(every_s):
                    conn.sendall(b"\x89\x00")      # a ping, no payload
                    with contextlib.suppress(socket.timeout):
                        conn.settimeout(0.01)
                        conn.recv(4096)             # the pongs, dropped
            except OSError:
                pass

    return raw_server(serve)


# -- the driver, run under the stack being tested -------------------------------------
def _vm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1])
    return 0


def _rss_kb() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv) -> int:
    import base64
    import resource
    import tempfile

    target, url, headroom_mb, bound_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    from agent.base.egress import Egress
    from agent.identity import enroller as enroller_mod, exchange as exchange_mod
    from agent.update import rules
    from agent.update import service as service_mod
    from agent.uploads import sender as sender_mod

    # the bounds this run is about, short
    service_mod.DOWNLOAD_LIMIT_S = bound_s
    sender_mod.TIMEOUT = (bound_s / 3, bound_s * 2 / 3)
    exchange_mod.TIMEOUT = (bound_s / 3, bound_s * 2 / 3)   # the enroller's requests
    tmp = tempfile.mkdtemp()
    if target == "update":
        u = service_mod.Updater(url, Egress(), tmp, bound_s, settled=lambda *a: None,
                                root_dir=tmp)
        import os
        os.makedirs(u.staging, exist_ok=True)
        order = rules.order({"version": "9.9.9-1", "url": "/releases/x.deb", "size": 100_000,
                             "sha256": "a" * 64, "signature": base64.b64encode(b"s").decode()})
        call = lambda: u._download(order, url + "/releases/x.deb")   # noqa: E731
    elif target == "upload":
        s = sender_mod.UploadSender(url, ("dev1", "tok"), Egress())
        call = lambda: s._post(url + "/api/v1/devices/dev1/uploads",   # noqa: E731
                               {"Content-Type": "application/json"}, b"{}")
    elif target == "enroll":
        e = enroller_mod.Enroller(url, "dev1", tmp, Egress())
        call = lambda: e._call("POST", "/api/v1/enroll", enroller_mod.NotEnrolling, json={})   # noqa: E731
    else:
        raise SystemExit(f"unknown target {target}")
    # the unit's memory bound, as address space over what the process has now
    limit = (_vm_kb() << 10) + (headroom_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    rss0, t0 = _rss_kb(), time.monotonic()
    try:
        out = {"returned": repr(call())[:300]}
    except BaseException as e:   # MemoryError included: that is what is measured
        out = {"raised": type(e).__name__, "text": str(e)[:300]}
    out["took_s"] = round(time.monotonic() - t0, 2)
    out["rss_growth_mb"] = round((_rss_kb() - rss0) / 1024, 1)
    import urllib3
    out["urllib3"] = urllib3.__version__
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
