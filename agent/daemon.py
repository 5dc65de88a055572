"""The running agent: wires configuration to the link thread, signals and status."""
from __future__ import annotations

import logging
import os
import signal
import threading

from . import __version__, status
from .config import Config
from .link.runner import LinkRunner

log = logging.getLogger("edge_agent")


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.runner = LinkRunner(config, on_status=self._write_status)
        self._status_lock = threading.Lock()

    def _write_status(self, link: dict) -> None:
        doc = {
            "pid": os.getpid(),
            "version": __version__,
            "device_id": self.config.device_id,
            "server": self.config.server_url,
            "updated_at": round(self.runner.clock.wall(), 3),
            "link": link,
            "journal": [r.to_dict() for r in list(self.runner.core.journal.records)[-10:]],
        }
        with self._status_lock:
            try:
                status.write(self.config.status_path, doc)
            except OSError as e:
                log.warning("cannot write status file %s: %s", self.config.status_path,
                            e.strerror)

    def run(self) -> int:
        def on_signal(signum, _frame):
            log.info("received %s, stopping", signal.Signals(signum).name)
            self.runner.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        log.info("edge-agent %s starting: device %s, server %s", __version__,
                 self.config.device_id, self.config.server_url)
        self.runner.run()
        log.info("edge-agent stopped")
        return 0
