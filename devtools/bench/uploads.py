"""Upload queue: the spool against the sqlite queue it replaced, on a stand-in SD card.

Both designs run in the same run on the same loop-mounted ext4 (devtools/card.py), with
the same worker and sender, to the local reference server. Two measures of wear: what
this thread dirtied (/proc/thread-self/io write_bytes, the measure of earlier runs) and
what the card was asked to write, ext4's journal included (the loop device's sectors).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from devtools.card import SdCard
from devtools.harness import FleetServerProcess
from devtools.netns import NetNS

PAYLOAD = 2052
# per item, from the issue: enqueue <= 2x the payload + 4 KiB, confirm <= 4 KiB
ENQUEUE_TARGET = 2 * PAYLOAD + 4096
CONFIRM_TARGET = 4096


def _thread_bytes() -> int:
    with open("/proc/thread-self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


class _Meter:
    def __init__(self, card: SdCard):
        self.card = card

    def __enter__(self):
        self.card_before, self.thread_before = self.card.bytes_written(), _thread_bytes()
        return self

    def __exit__(self, *_):
        self.card_bytes = self.card.bytes_written() - self.card_before
        self.thread_bytes = _thread_bytes() - self.thread_before


def _one_design(store_class, path: str, card: SdCard, server_url: str, items: int) -> dict:
    from agent.base.clock import FakeClock
    from agent.base.upload_kinds import LOG
    from agent.config.policies import UploadPolicy
    from agent.uploads.sender import UploadSender
    from agent.uploads.worker import UploadWorker
    policy = UploadPolicy()
    store = store_class(path, policy)
    try:
        payload = os.urandom(PAYLOAD - 4)
        with _Meter(card) as enqueue:
            for i in range(items):
                store.enqueue(LOG, payload + i.to_bytes(4, "big"))
        # an hour of the server out of reach (nothing listens there), on a fake clock
        clock = FakeClock(wall_offset=time.time() - 1000.0)
        dead_end = UploadWorker(store, UploadSender("http://127.0.0.1:9", ("screen-1", "t")),
                                policy, clock=clock)
        requests = 0
        with _Meter(card) as outage:
            while clock.now < 1000.0 + 3600:
                before = dead_end.scheduler.hold_failures
                dead_end._work_once()
                requests += dead_end.scheduler.hold_failures - before
                clock.advance(max(1.0, dead_end.scheduler.hold_until - clock.now))
        worker = UploadWorker(store, UploadSender(server_url, ("screen-1", "t")), policy)
        with _Meter(card) as send:
            t0 = time.monotonic()
            while store.stats()["items"]:
                if worker._work_once() > 0 and store.stats()["items"]:
                    time.sleep(0.01)
            elapsed = time.monotonic() - t0
    finally:
        store.close()
    return {"items_per_s": round(items / elapsed, 1),
            "enqueue_thread": round(enqueue.thread_bytes / items),
            "enqueue_card": round(enqueue.card_bytes / items),
            "send_thread": round(send.thread_bytes / items),
            "send_card": round(send.card_bytes / items),
            "outage_requests": requests, "outage_card": outage.card_bytes}


def upload_queue(items: int, workroot: Path) -> dict:
    from agent.uploads.store import QueueStore
    from devtools.bench.sqlite_queue import QueueStore as SqliteQueue
    work = workroot / "uploads"
    work.mkdir(parents=True)
    out: dict = {"items": items, "payload_bytes": PAYLOAD}
    with NetNS():
        server = FleetServerProcess(work, "--accept-any").start()
        try:
            with SdCard(work) as card:
                out["sqlite"] = _one_design(SqliteQueue, str(card.mountpoint / "queue.db"), card,
                                            server.url, items)
                before = server.device("screen-1").get("uploads") or 0
                out["spool"] = _one_design(QueueStore, str(card.mountpoint / "queue"), card,
                                           server.url, items)
                out["stored"] = (server.device("screen-1").get("uploads") or 0) - before
        finally:
            server.kill()
    return out


def uploads_section(u) -> list[str]:
    lines = ["## 6. Upload queue", "",
             f"{u['items']} items of {u['payload_bytes']} bytes queued, an hour of the server out of "
             "reach (fake clock), then sent one request each to the reference server on loopback; "
             "both designs in this run, on the same loop-mounted ext4 (ordered data, noatime). "
             "Bytes per item: dirtied by the thread / written to the card, journal included.", "",
             "| design | items/s | per enqueue (thread / card) | per confirmed send (thread / card) "
             "| hour unreachable: requests, bytes to the card |",
             "|---|---|---|---|---|"]
    for name, label in (("sqlite", "sqlite, WAL, synchronous=FULL (before)"),
                        ("spool", "spool, fdatasync per enqueue (now)")):
        d = u[name]
        lines.append(f"| {label} | {d['items_per_s']} | {d['enqueue_thread']} / {d['enqueue_card']} | "
                     f"{d['send_thread']} / {d['send_card']} | {d['outage_requests']}, "
                     f"{d['outage_card']} |")
    s, b = u["spool"], u["sqlite"]
    met = lambda v, t: "met" if v <= t else "NOT met"
    lines += ["", f"Spool against the targets (enqueue <= 2x payload + 4 KiB = {ENQUEUE_TARGET}, "
              f"confirm <= {CONFIRM_TARGET}): enqueue {s['enqueue_thread']} thread "
              f"({met(s['enqueue_thread'], ENQUEUE_TARGET)}), {s['enqueue_card']} card "
              f"({met(s['enqueue_card'], ENQUEUE_TARGET)}); confirm {s['send_thread']} thread "
              f"({met(s['send_thread'], CONFIRM_TARGET)}), {s['send_card']} card "
              f"({met(s['send_card'], CONFIRM_TARGET)}). Card bytes against sqlite: enqueue "
              f"{s['enqueue_card'] / max(b['enqueue_card'], 1):.2f}x, confirm "
              f"{s['send_card'] / max(b['send_card'], 1):.3f}x. Stored at the server: "
              f"{u['stored']}/{u['items']}."]
    return lines
