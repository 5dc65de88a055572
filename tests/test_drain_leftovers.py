"""A draining reference server cuts what did not move (#54): a client that does not
know server:drain (the stock python-socketio client) stays on its connection through
the window; at the window's end and its margin the node cuts it and stops, as
docs/PROTOCOL.md's drain says, instead of idling on in aiohttp's shutdown (60 s, the
connection neither served nor closed) until the client gives up on its pings."""
import signal
import time

import pytest

from devtools.bench.common import StockProcess
from devtools.harness import wait_for

pytestmark = pytest.mark.netns

WINDOW, MARGIN_S = 1.0, 2.0   # fleet_server/sessions.py DRAIN_MARGIN_S


def test_a_drain_cuts_the_connections_left_at_its_end_and_the_node_stops(netns, fleet, tmp_path):
    node = fleet("--accept-any", "--drain-window", str(WINDOW))
    stock = StockProcess(node.url, tmp_path, "--heartbeat", "0.5", device_id="stock-1")
    try:
        wait_for(lambda: node.device("stock-1").get("online"), 15, what="the stock client online")
        t_term = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(WINDOW + MARGIN_S + 3.0)
        except Exception:
            pytest.fail(f"the node had not stopped {WINDOW + MARGIN_S + 3.0:g} s after its "
                        f"SIGTERM with a client left on it")
        stopped = time.monotonic() - t_term
        assert stopped >= WINDOW, stopped   # the window was served first
        wait_for(lambda: stock.noticed_after(0), 5, what="the stock client told of the cut")
    finally:
        stock.stop()
