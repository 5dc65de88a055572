"""The upload queue on a stand-in SD card that loses power between enqueue and confirm.

The churn process enqueues and uploads as fast as it can; it writes a name to its log
(on another file system, which keeps it) only after the enqueue returned. Then the power
goes: kill -9, and the card keeps only what was synced (devtools/card.py). Every name
in the log must still reach the server, stored once. With the store's fdatasync taken
out, this test loses items.
"""
import hashlib
import random
import subprocess
import sys
import time

import pytest

from devtools.card import SdCard
from devtools.harness import REPO

pytestmark = pytest.mark.netns


def test_a_power_cut_between_enqueue_and_confirm_loses_nothing_that_was_queued(
        netns, fleet, tmp_path):
    server = fleet()
    log = tmp_path / "enqueued.log"
    rng = random.Random(11)
    with SdCard(tmp_path) as card:
        queue = card.mountpoint / "queue"
        cmd = [sys.executable, "-m", "devtools.queue_churn", "--db", str(queue), "--server",
               server.url, "--token", "s3cret-token", "--log", str(log)]
        for cut in range(6):
            proc = subprocess.Popen(cmd + ["--start", str(cut * 100_000)], cwd=REPO)
            time.sleep(rng.uniform(0.6, 1.2))
            proc.kill()
            proc.wait(5)
            card.power_cut()
        drain = subprocess.run(cmd + ["--drain"], cwd=REPO, timeout=120)
        assert drain.returncode == 0, "the queue did not drain"
    names = log.read_text().split()
    assert len(names) > 200, "the churn did not get far enough to mean anything"
    stored = server.admin("/admin/uploads/screen-1")
    hashes = [h for _, h in stored.values()]
    assert len(hashes) == len(set(hashes)), "a payload was stored twice at the server"
    missing = {hashlib.sha256(n.encode()).hexdigest() for n in names} - set(hashes)
    assert not missing, f"{len(missing)} items the queue had accepted were lost in a power cut"
    print(f"\n{len(names)} items enqueued across 6 power cuts, {len(hashes)} stored once each, "
          f"{server.device()['upload_repeats']} sends repeated (their confirm was lost) and "
          f"deduplicated by Idempotency-Key")
