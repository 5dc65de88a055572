"""A draining reference server cuts what did not move (#54): a client that does not
know server:drain (the stock python-socketio client) stays on its connection through
the window; at the window's end and its margin the node cuts it and stops, as
docs/PROTOCOL.md's drain says (at most N + 2 s), instead of idling on in aiohttp's
shutdown (60 s, the connection neither served nor closed). Cut as a stopping process
cuts it, at the transport: the client reconnects by itself (after a Socket.IO
DISCONNECT from the server, a stock client never does)."""
import signal
import time

import pytest

from devtools.bench.common import StockProcess
from devtools.harness import wait_for

pytestmark = pytest.mark.netns

WINDOW, MARGIN_S = 1.0, 2.0   # fleet_server/sessions.py DRAIN_MARGIN_S
CUT_S = 0.5   # fleet_server/serving.py CUT_AFTER_S, waited twice: the handler, its cancel


def test_a_drain_cuts_the_connections_left_at_its_end_and_the_client_comes_back(
        netns, fleet, tmp_path):
    node = fleet("--accept-any", "--drain-window", str(WINDOW))
    stock = StockProcess(node.url, tmp_path, "--heartbeat", "0.5", device_id="stock-1")
    try:
        wait_for(lambda: node.device("stock-1").get("online"), 15, what="the stock client online")
        t_term = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        bound = WINDOW + MARGIN_S + 2 * CUT_S + 1.0
        try:
            node.proc.wait(bound)
        except Exception:
            pytest.fail(f"the node had not stopped {bound:g} s after its SIGTERM with a "
                        f"client left on it")
        assert time.monotonic() - t_term >= WINDOW   # the window was served first
        wait_for(lambda: stock.noticed_after(0), 5, what="the stock client told of the cut")
        node.start()   # the next version, on the same port
        wait_for(lambda: node.device("stock-1").get("online"), 15,
                 what="the stock client back by itself")
    finally:
        stock.stop()
