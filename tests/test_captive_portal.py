"""Something else answers for the server (issue #28): a captive portal's login page, a
redirect, a 511. The queue holds, as for a server out of reach, and no item is deleted,
dead-lettered or charged an attempt; once the server answers, everything goes."""
import http.server
import json
import threading

import pytest

from agent.base.clock import FakeClock
from agent.config.policies import UploadPolicy
from agent.uploads.sender import UploadSender
from agent.uploads.store import QueueStore
from agent.uploads.worker import UploadWorker


class Site(http.server.BaseHTTPRequestHandler):
    answer = "portal-page"   # what the site answers with, the test switches it
    seen: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Site.seen.append(self.path)
        if Site.answer == "portal-page":
            self._answer(200, b"<html><body>Welcome! Log in to the guest Wi-Fi</body></html>",
                         "text/html")
        elif Site.answer == "redirect":
            self.send_response(302)
            self.send_header("Location", "http://portal.example/login")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif Site.answer == "511":
            self._answer(511, b"<html>Network Authentication Required</html>", "text/html")
        elif Site.answer == "empty-json":    # a middlebox's generic JSON 200
            self._answer(200, b"{}", "application/json")
        else:   # the server: the key echoed, each record acknowledged
            doc = {"ok": True, "id": self.headers.get("Idempotency-Key")}
            if self.path.endswith("/proof-of-play"):
                doc = {"ok": True, "acked": [r["id"] for r in json.loads(body)["records"]]}
            self._answer(200, json.dumps(doc).encode(), "application/json")

    def _answer(self, status, body, kind):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def site():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Site.seen = []
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


@pytest.mark.parametrize("answer", ["portal-page", "redirect", "511", "empty-json"])
def test_a_site_answering_for_the_server_holds_the_queue_and_costs_no_item(
        site, tmp_path, answer):
    Site.answer = answer
    store = QueueStore(str(tmp_path / "queue"), UploadPolicy())
    clock = FakeClock(wall_offset=1_700_000_000.0)
    store.enqueue("screenshot", b"\xff\xd8 a screenshot", now=clock.wall())
    store.enqueue("proof-of-play", b'{"event": "play_start", "content_id": "c-1"}',
                  now=clock.wall())
    worker = UploadWorker(store, UploadSender(site, ("screen-1", "t" * 32)), UploadPolicy(),
                          clock=clock)
    worker._work_once()
    assert Site.seen, "nothing was sent: the test proves nothing"
    stats = store.stats()
    assert stats["items"] == 2 and stats["dead_letter"] == 0, stats
    assert worker.scheduler.hold_until > clock.monotonic(), "the whole queue holds, as for an outage"
    assert all(i.attempts == 0 for i in store.due(clock.wall() + 1e6, 10)), \
        "an item was charged for the site's answer"
    # the portal is passed (the link is back, or the backoff ran out): everything goes
    Site.answer = "server"
    clock.advance(3600.0)
    worker.link_up()
    worker._work_once()
    assert store.stats()["items"] == 0 and worker.sent == 2
    store.close()
