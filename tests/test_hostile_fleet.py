"""A fleet server (or whoever answers in its place) that means harm, against every HTTP
reader of the agent, on each stack the agent ships on: a compressed answer that grows
to a gigabyte, headers trickled for ever, a URL two parsers read differently.

The readers run in a process of their own under the Python of each AGENT_TEST_PYTHONS
entry (Debian 12's urllib3 1.26 in .venv-bookworm, current 2.x in .venv), with their
address space bounded a little above what they hold (the unit's MemoryMax, in spirit)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from devtools.harness import REPO
from devtools.hostile_http import (answering_server, bomb_server, endless_chunk_server, gzip_bomb,
                                   trickle_server)

TARGETS = ("update", "upload", "enroll")


@pytest.fixture(scope="module")
def bomb() -> bytes:
    # 1 GiB of zeros, gzip inside gzip: about 1 KB on the wire
    return gzip_bomb(1 << 30, layers=2)


def drive(python: str, target: str, url: str, headroom_mb: int = 96, bound_s: float = 3.0,
          timeout: float = 60) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "1"}
    r = subprocess.run([python, "-m", "devtools.hostile_http", target, url, str(headroom_mb),
                        str(bound_s)], capture_output=True, text=True, timeout=timeout,
                       cwd=REPO, env=env)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and lines, f"driver failed: {r.stdout[-2000:]}{r.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("target", TARGETS)
def test_a_compressed_answer_never_grows_past_the_bytes_read(agent_python, target, bomb):
    """Before: on urllib3 1.26 each reader decompressed the gzip-in-gzip answer whole
    (MemoryError under the bound); on 2.x the reads stayed bounded. Now: identity is asked
    for, and an answer in any other encoding is refused before a byte is decoded."""
    with bomb_server(bomb, "gzip, gzip") as url:
        out = drive(agent_python, target, url)
    assert out.get("raised") != "MemoryError", out
    assert out["rss_growth_mb"] < 16, out
    said = out.get("text", "") + out.get("returned", "")
    assert "encoding" in said, out


@pytest.mark.parametrize("target", TARGETS)
def test_a_single_gzip_layer_is_refused_too(agent_python, target):
    with bomb_server(gzip_bomb(256 << 20, layers=1), "gzip") as url:
        out = drive(agent_python, target, url)
    assert out.get("raised") != "MemoryError" and out["rss_growth_mb"] < 16, out
    assert "encoding" in out.get("text", "") + out.get("returned", ""), out


@pytest.mark.parametrize("target", TARGETS)
def test_headers_trickled_for_ever_are_cut_at_the_exchange_bound(agent_python, target):
    """Before: each byte came well within the read timeout, so the exchange never ended
    (the update's bound started after the headers). Now one deadline covers connect,
    headers and body: 3 s here."""
    with trickle_server(0.2) as url:
        out = drive(agent_python, target, url, bound_s=3.0, timeout=40)
    assert 2.5 < out["took_s"] < 5.0, out
    said = {"update": "download too slow", "upload": "unreachable",
            "enroll": "not done in 3 s"}[target]
    assert said in out.get("text", "") + out.get("returned", ""), out


def test_an_order_url_two_parsers_read_differently_sends_the_screen_nowhere(tmp_path):
    """``http://OTHER:P\\@FLEET:P/x.deb``: urlsplit sees the fleet's host, urllib3 (which
    connects) sees OTHER. Before: the origin check passed it and the package was asked
    of OTHER, with the fleet's proxy choice and client certificate. Now: refused at
    once, and OTHER never hears a byte."""
    import base64
    import http.server
    import threading

    from agent.base.egress import Egress
    from agent.update.rules import NotStaged
    from agent.update.service import Updater

    hits = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        fleet = "http://localhost:9"
        u = Updater(fleet, Egress(), str(tmp_path / "state"), 2.0,
                    settled=lambda *a: hits.append(a), root_dir=str(tmp_path))
        url = f"http://127.0.0.1:{other.server_port}\\@localhost:9/x.deb"
        with pytest.raises(NotStaged) as e:
            u.begin("bs", {"version": "9.9.9-1", "url": url, "size": 10, "sha256": "a" * 64,
                           "signature": base64.b64encode(b"s").decode()})
        assert "url:" in str(e.value)
        assert hits == []
    finally:
        other.shutdown()
        other.server_close()


# -- nothing left on the card by a failed download -------------------------------------
def _order(size: int):
    import base64

    from agent.update import rules
    return rules.order({"version": "9.9.9-1", "url": "/x.deb", "size": size,
                        "sha256": "b" * 64, "signature": base64.b64encode(b"s").decode()})


@pytest.fixture
def small_card(tmp_path):
    """A real 1 MiB file system for the state directory: a card that fills up."""
    mnt = tmp_path / "card"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _updater(url, state, tmp_path):
    from agent.base.egress import Egress
    from agent.update.service import Updater
    u = Updater(url, Egress(), str(state), 2.0, settled=lambda *a: None,
                root_dir=str(tmp_path))
    os.makedirs(u.staging, exist_ok=True)
    return u


def test_a_download_the_card_cannot_take_leaves_nothing_on_it(small_card, tmp_path):
    """Before: the .part stayed, filling the card (0 KiB free afterwards)."""
    from agent.update.rules import NotStaged
    with answering_server(os.urandom(3 << 20)) as url:
        u = _updater(url, small_card, tmp_path)
        with pytest.raises(NotStaged) as e:
            u._download(_order(3 << 20), f"{url}/x.deb")
    assert "No space left" in str(e.value)
    assert os.listdir(u.staging) == []
    assert os.statvfs(small_card).f_bfree > 200


def test_a_body_longer_than_the_order_leaves_nothing_on_the_card(tmp_path):
    from agent.update.rules import NotStaged
    with answering_server(os.urandom(300_000)) as url:
        u = _updater(url, tmp_path / "state", tmp_path)
        with pytest.raises(NotStaged) as e:
            u._download(_order(100_000), f"{url}/x.deb")
    assert "larger than the order" in str(e.value)
    assert os.listdir(u.staging) == []


def test_a_partial_download_no_order_came_back_for_is_cleaned_at_start(tmp_path):
    import time

    from agent.update import service
    u = _updater("http://127.0.0.1:9", tmp_path / "state", tmp_path)
    old, fresh = (os.path.join(u.staging, f"{c * 64}.part") for c in "cd")
    for path in (old, fresh):
        with open(path, "wb") as f:
            f.write(b"x" * 1000)
    two_days = time.time() - 2 * service.PART_KEEP_S
    os.utime(old, (two_days, two_days))
    u.recover([])
    assert sorted(os.listdir(u.staging)) == [os.path.basename(fresh)]   # resumable still


@pytest.mark.parametrize("target", TARGETS)
def test_a_chunk_size_line_that_never_ends_is_never_held(agent_python, target):
    """urllib3 1.26 reads a chunked body's size line with no bound in its own reader:
    2.7 GB in 6 s on the update's download (a review found it). Every body is read
    through http.client's parser, whose lines are bounded."""
    with endless_chunk_server() as url:
        out = drive(agent_python, target, url)
    assert out.get("raised") != "MemoryError" and out["rss_growth_mb"] < 16, out
