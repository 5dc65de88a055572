"""A process that enqueues and uploads as fast as it can, to be killed with -9.

The kill test runs it dozens of times, killing it at random moments, then once more
with --drain. Every payload name written to --log was committed to the queue before
the line was written, so each one must end up at the server, exactly once.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time

from agent.config.policies import UploadPolicy
from agent.uploads.sender import UploadSender
from agent.base.upload_kinds import LOG
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
        if store.enqueue(LOG, name.encode()):
            os.write(fd, (name + "\n").encode())
            worker.wake()
        n += 1
        time.sleep(0.003)


class Churn:
    """The tests' side: rounds of this process killed at random moments, a drain, and
    what reached the server."""

    def __init__(self, queue, server, log, repo):
        self.server, self.log, self.repo = server, log, repo
        self.cmd = [sys.executable, "-m", "devtools.queue_churn", "--db", str(queue), "--server",
                    server.url, "--token", "s3cret-token", "--log", str(log)]

    def killed_after(self, round_no: int, seconds: float) -> None:
        """Killed ``seconds`` after the round's first accepted item: a moment of the churn
        itself, however long its interpreter took to start (on a loaded CI, most of a
        second: six rounds then accepted too few items to mean anything)."""
        from devtools.harness import wait_for   # not in the churn process: its start is timed
        before = self._accepted_bytes()
        proc = subprocess.Popen(self.cmd + ["--start", str(round_no * 100_000)], cwd=self.repo)
        wait_for(lambda: self._accepted_bytes() != before or proc.poll() is not None, 30,
                 interval=0.01, what="the churn's first accepted item")
        time.sleep(seconds)
        proc.kill()
        proc.wait(5)

    def _accepted_bytes(self) -> int:
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0

    def assert_delivered(self, at_least: int) -> tuple[list[str], list[str]]:
        """Drains the queue; every name the queue accepted reached the server, stored once.
        Returns (accepted names, payload hashes stored)."""
        drain = subprocess.run(self.cmd + ["--drain"], cwd=self.repo, timeout=120)
        assert drain.returncode == 0, "the queue did not drain"
        names = self.log.read_text().split()
        assert len(names) > at_least, "the churn did not get far enough to mean anything"
        hashes = [h for _, h in self.server.admin("/admin/uploads/screen-1").values()]
        assert len(hashes) == len(set(hashes)), "a payload was stored twice at the server"
        missing = {hashlib.sha256(n.encode()).hexdigest() for n in names} - set(hashes)
        assert not missing, f"{len(missing)} items the queue had accepted never reached the server"
        return names, hashes

if __name__ == "__main__":
    sys.exit(main())
