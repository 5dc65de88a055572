"""The upload queue on a stand-in SD card that loses power between enqueue and confirm.

The churn process enqueues and uploads as fast as it can; it writes a name to its log
(on another file system, which keeps it) only after the enqueue returned. Then the power
goes: kill -9, and the card keeps only what was synced (devtools/card.py). Every name
in the log must still reach the server, stored once. With the store's fdatasync taken
out, this test loses items.
"""
import random

import pytest

from devtools.card import SdCard
from devtools.harness import REPO
from devtools.queue_churn import Churn

pytestmark = pytest.mark.netns


def test_a_power_cut_between_enqueue_and_confirm_loses_nothing_that_was_queued(
        netns, fleet, tmp_path):
    server = fleet()
    rng = random.Random(11)
    with SdCard(tmp_path) as card:
        churn = Churn(card.mountpoint / "queue", server, tmp_path / "enqueued.log", REPO)
        for cut in range(6):
            churn.killed_after(cut, rng.uniform(0.3, 0.9))
            card.power_cut()
        names, hashes = churn.assert_delivered(at_least=200)
    print(f"\n{len(names)} items enqueued across 6 power cuts, {len(hashes)} stored once each, "
          f"{server.device()['upload_repeats']} sends repeated (their confirm was lost) and "
          f"deduplicated by Idempotency-Key")
