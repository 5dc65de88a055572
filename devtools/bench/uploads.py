"""Upload queue: items per second to the local reference server, bytes written per item."""
from __future__ import annotations

import os
import time
from pathlib import Path

from devtools.harness import FleetServerProcess
from devtools.netns import NetNS


def _write_bytes() -> int:
    with open("/proc/thread-self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def upload_queue(items: int, workroot: Path) -> dict:
    """Items per second to the local reference server, and bytes written per item
    (the kernel's count of bytes this thread sent to the block layer, fsyncs included)."""
    from agent.uploads.schedule import UploadPolicy
    from agent.uploads.sender import UploadSender
    from agent.uploads.store import QueueStore
    from agent.uploads.worker import UploadWorker
    work = workroot / "uploads"
    work.mkdir(parents=True)
    with NetNS():
        server = FleetServerProcess(work, "--accept-any").start()
        try:
            policy = UploadPolicy()
            store = QueueStore(str(work / "queue.db"), policy)
            payload = os.urandom(2048)
            os.sync()
            before = _write_bytes()
            for i in range(items):
                store.enqueue("log", payload + i.to_bytes(4, "big"))
            os.sync()
            enqueue_bytes = _write_bytes() - before
            worker = UploadWorker(store, UploadSender(server.url, ("screen-1", "t")), policy)
            before, t0 = _write_bytes(), time.monotonic()
            while store.stats()["items"]:
                if worker._work_once() > 0 and store.stats()["items"]:
                    time.sleep(0.01)
            elapsed = time.monotonic() - t0
            os.sync()
            send_bytes = _write_bytes() - before
            stored = server.device("screen-1").get("uploads")
        finally:
            server.kill()
    return {"items": items, "stored": stored, "items_per_s": round(items / elapsed, 1),
            "enqueue_bytes_per_item": round(enqueue_bytes / items),
            "send_bytes_per_item": round(send_bytes / items), "payload_bytes": 2052}
