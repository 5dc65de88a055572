"""A process that enqueues and uploads as fast as it can, to be killed with -9.

The kill test runs it dozens of times, killing it at random moments, then once more
with --drain. Every payload name written to --log was committed to the queue before
the line was written, so each one must end up at the server, exactly once.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from agent.uploads.schedule import UploadPolicy
from agent.uploads.sender import UploadSender
from agent.uploads.store import QueueStore
from agent.uploads.worker import UploadWorker


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--drain", action="store_true")
    args = p.parse_args(argv)
    policy = UploadPolicy(base_s=0.2, cap_s=1.0)
    store = QueueStore(args.db, policy)
    worker = UploadWorker(QueueStore(args.db, policy),
                          UploadSender(args.server, ("screen-1", args.token)), policy)
    worker.start()
    if args.drain:
        deadline = time.monotonic() + 60
        while store.stats()["items"] and time.monotonic() < deadline:
            worker.wake()
            time.sleep(0.1)
        return 0 if not store.stats()["items"] else 1
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    n = args.start
    while True:
        name = f"item-{n}"
        if store.enqueue("log", name.encode()):
            os.write(fd, (name + "\n").encode())
            worker.wake()
        n += 1
        time.sleep(0.003)


if __name__ == "__main__":
    sys.exit(main())
