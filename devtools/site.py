"""A customer's site for tests, from real parts: a CA and the certificates it signs
(openssl), a TLS-terminating box (socat), an HTTP proxy with Basic authentication
(tinyproxy), and a captive portal (a local HTTP server that answers for the server).
All of them listen on loopback only; the caller owns the network namespace."""
from __future__ import annotations

import http.server
import pwd
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

NOBODY = "nobody"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), 0.2).close()
        return True
    except OSError:
        return False


def _wait_listening(port: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while not listening(port):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not listen on {port}")
        time.sleep(0.02)


def _openssl(work: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=work, timeout=60)


class SiteCA:
    """A site's own CA, as a TLS-inspecting box has; signs certificates for 127.0.0.1."""

    def __init__(self, work: Path):
        assert shutil.which("openssl"), "openssl is needed (scripts/test installs it)"
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        _openssl(work, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                 "/CN=Site inspection CA", "-keyout", "ca.key", "-out", "ca.pem")
        self.cert = str(work / "ca.pem")
        (work / "index.txt").write_text("")
        (work / "serial").write_text("01\n")
        (work / "ca.cnf").write_text(
            f"[ca]\ndefault_ca = site\n[site]\ndatabase = {work}/index.txt\n"
            f"new_certs_dir = {work}\nserial = {work}/serial\ndefault_md = sha256\n"
            f"policy = anything\ncopy_extensions = copy\nunique_subject = no\n"
            f"[anything]\ncommonName = supplied\n")

    def issue(self, name: str, start: str | None = None, end: str | None = None) -> tuple[str, str]:
        """(certificate, key) for 127.0.0.1; ``start``/``end`` as openssl's
        YYYYMMDDHHMMSSZ (a start in the future is a certificate not valid yet)."""
        _openssl(self.work, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                 "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr")
        dates = ["-days", "2"] if start is None else ["-startdate", start, "-enddate", end]
        _openssl(self.work, "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile",
                 "ca.key", "-in", f"{name}.csr", "-out", f"{name}.pem", *dates)
        return str(self.work / f"{name}.pem"), str(self.work / f"{name}.key")


def self_signed(work: Path) -> tuple[str, str]:
    work.mkdir(parents=True, exist_ok=True)
    _openssl(work, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
             "-keyout", "self.key", "-out", "self.pem")
    return str(work / "self.pem"), str(work / "self.key")


class Parts:
    """Starts the site's parts and stops them all at the end."""

    def __init__(self, work: Path):
        self.work = work
        self._procs: list[subprocess.Popen] = []
        self._servers: list[http.server.HTTPServer] = []

    def tls_box(self, cert: str, key: str, upstream_port: int,
                client_ca: str | None = None) -> int:
        """socat terminating TLS with ``cert`` in front of ``upstream_port``: its port.
        With ``client_ca``, it asks for a client certificate that CA signed (mutual TLS)."""
        assert shutil.which("socat"), "socat is needed (scripts/test installs it)"
        port = free_port()
        verify = f"verify=1,cafile={client_ca}" if client_ca else "verify=0"
        self._procs.append(subprocess.Popen(
            ["socat", f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={cert},"
                      f"key={key},{verify}", f"TCP:127.0.0.1:{upstream_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_listening(port, "socat")
        return port

    def proxy(self, user: str | None = None, password: str | None = None,
              connect_ports: tuple[int, ...] = ()) -> tuple[int, Path]:
        """tinyproxy running as nobody, asking for Basic credentials if given:
        (its port, its log)."""
        assert shutil.which("tinyproxy"), "tinyproxy is needed (scripts/test installs it)"
        port = free_port()
        log = self.work / f"tinyproxy-{port}.log"
        conf = self.work / f"tinyproxy-{port}.conf"
        group = "nogroup"
        lines = [f"Port {port}", "Listen 127.0.0.1", "Timeout 30", "MaxClients 50",
                 f"User {NOBODY}", f"Group {group}", "LogLevel Connect", f"LogFile \"{log}\""]
        if user is not None:
            lines.append(f"BasicAuth {user} {password}")
        lines += [f"ConnectPort {p}" for p in connect_ports]
        conf.write_text("\n".join(lines) + "\n")
        log.touch()
        shutil.chown(log, NOBODY, group)
        self._procs.append(subprocess.Popen(["tinyproxy", "-d", "-c", str(conf)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_listening(port, "tinyproxy")
        return port, log

    def portal(self, status: int, headers: dict | None = None,
               body: bytes = b"<html><body>Sign in to the guest Wi-Fi</body></html>") -> int:
        """An HTTP server answering every request with ``status`` and a page."""
        class Portal(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.send_response(status)
                for k, v in (headers or {"Content-Type": "text/html"}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Portal)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._servers.append(server)
        return server.server_address[1]

    def hung_server(self) -> int:
        """A port that completes the TCP handshake and then never answers: a stopped
        process's listening socket, or a balancer node whose backend hangs."""
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        self._held = getattr(self, "_held", []) + [s]
        return s.getsockname()[1]

    def close(self) -> None:
        for p in self._procs:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for s in self._servers:
            s.shutdown()
            s.server_close()
        for s in getattr(self, "_held", []):
            s.close()


def nobody_uid() -> int:
    return pwd.getpwnam(NOBODY).pw_uid
