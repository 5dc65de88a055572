"""A site whose edge inspects TLS (issue #28): the server is reached through a box that
presents its own certificate, signed by the site's CA. The box here is a real TLS
terminator from Debian (socat), the CA and its certificate made by openssl."""
import shutil
import socket
import subprocess
import time

import pytest

from devtools.harness import REPO, agent_config, wait_for

pytestmark = pytest.mark.netns


def _site_ca(work) -> tuple[str, str, str]:
    """(CA certificate, the box's certificate, its key): the box's names 127.0.0.1."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=work, timeout=60)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=Site inspection CA", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "box.key", "-out", "box.csr")
    (work / "box.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "box.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "box.ext", "-out", "box.pem")
    return str(work / "ca.pem"), str(work / "box.pem"), str(work / "box.key")


@pytest.fixture
def inspecting_box(tmp_path):
    """Starts a TLS terminator in front of ``upstream_port``; returns its https URL."""
    assert shutil.which("socat") and shutil.which("openssl"), \
        "socat and openssl are needed (scripts/test installs them)"
    procs = []

    def start(upstream_port: int) -> tuple[str, str]:
        ca, cert, key = _site_ca(tmp_path)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs.append(subprocess.Popen(
            ["socat", f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={cert},"
                      f"key={key},verify=0", f"TCP:127.0.0.1:{upstream_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(lambda: _listening(port), 10, what="the inspecting box to listen")
        return f"https://127.0.0.1:{port}", ca
    yield start
    for p in procs:
        p.terminate()
        p.wait(5)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
        return True
    except OSError:
        return False


def test_with_the_sites_ca_the_link_and_the_uploads_go_through_and_without_it_neither(
        netns, fleet, spawn_agent, agent_python, inspecting_box, tmp_path):
    server = fleet()
    url, ca = inspecting_box(server.port)
    cfg = agent_config(server, tmp_path, server={"url": url, "ca_file": ca})
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(20)     # before: uploads went through, the link never came up
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg),
                        "--kind", "log", "-"], input=b"through the box", capture_output=True,
                       env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: server.device()["uploads"] == 1, 10, what="the upload through the box")
    agent.stop()
    # verification stays on: without the site's CA the box is not the server
    connects = server.device()["connects"]
    other = spawn_agent(agent_python, agent_config(server, tmp_path, server={"url": url}))
    wait_for(lambda: "failed (tls-untrusted" in other.log_text(), 15,
             what="a connect refused for the box's certificate")
    time.sleep(1.0)   # a few more tries, each refused
    assert other.link().get("state") != "online"
    assert server.device()["connects"] == connects, "connected through an untrusted box"
