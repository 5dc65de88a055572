"""`update-ca-certificates` instead of `[server] ca_file`, on the stack a screen runs:
Debian bookworm's and trixie's own python3, python3-requests and python3-certifi, in
the booted tier's cached root filesystems (an overlay: the cache is never written).
Before the site's CA is added with update-ca-certificates the agent's HTTPS requests
and its link's TLS context both refuse a server the CA signed; after, both accept it,
with no `ca_file` set (docs/install.md, "A site CA")."""
import http.server
import os
import shutil
import ssl
import subprocess
import threading

import pytest

from devtools.booted import ensure_rootfs, package_depends
from devtools.harness import REPO

pytestmark = pytest.mark.system

DISPLAY_STAND_IN = ["xvfb", "x11-xserver-utils"]   # as tests/test_booted_systemd.py's root
PROBE = """
import sys
sys.path.insert(0, "/opt/edge-agent")
import socket, ssl
from agent.base.egress import Egress
url = sys.argv[1]
e = Egress()   # no ca_file: the system's store
said = []
try:
    e.session(url).get(url, timeout=10).raise_for_status()
    said.append("requests ok")
except Exception as x:
    said.append("requests refused" if "CERTIFICATE_VERIFY_FAILED" in str(x) else f"requests {x!r}")
try:
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), 10) as raw:
        with e.ssl_context().wrap_socket(raw, server_hostname="127.0.0.1"):
            said.append("link ok")
except ssl.SSLCertVerificationError as x:
    said.append("link refused")
    print(x.verify_message, file=sys.stderr)   # for the failure's message
print(", ".join(said))
"""


@pytest.fixture(params=["bookworm", "trixie"])
def screen_root(request, tmp_path):
    control = REPO / "debian" / "control"
    lower = ensure_rootfs(package_depends(control) + DISPLAY_STAND_IN,
                          package_depends(control, "Recommends"), suite=request.param)
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        shutil.copytree(REPO / "agent", merged / "opt/edge-agent/agent",
                        ignore=shutil.ignore_patterns("__pycache__"))
        yield merged
    finally:
        subprocess.run(["umount", str(merged)], check=True)


@pytest.fixture
def site_server(tmp_path):
    """An HTTPS server on loopback whose certificate the site's CA signed."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path,
                       timeout=60)
    # as a site's CA is: key usage for signing certificates, which Python 3.13 (trixie)
    # requires of a CA (VERIFY_X509_STRICT), as it requires the Authority Key Identifier
    # of the certificates it signs
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=Site inspection CA", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "box.key", "-out", "box.csr")
    (tmp_path / "box.ext").write_text("subjectAltName=IP:127.0.0.1\n"
                                      "authorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", "box.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "box.ext", "-out", "box.pem")
    httpd = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "box.pem", tmp_path / "box.key")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}", tmp_path / "ca.pem"
    httpd.shutdown()


def _probe(root, url) -> str:
    r = subprocess.run(["chroot", str(root), "/usr/bin/python3", "-I", "-c", PROBE, url],
                       capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    print(r.stderr)   # why a refusal refused, shown with a failure
    return r.stdout.strip()


def test_update_ca_certificates_adds_the_site_ca_for_the_agent_without_ca_file(
        screen_root, site_server):
    url, ca = site_server
    assert _probe(screen_root, url) == "requests refused, link refused"
    shutil.copy(ca, screen_root / "usr/local/share/ca-certificates/site-ca.crt")
    r = subprocess.run(["chroot", str(screen_root), "update-ca-certificates"],
                       capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert r.returncode == 0 and "1 added" in r.stdout, r.stdout + r.stderr
    assert _probe(screen_root, url) == "requests ok, link ok"
