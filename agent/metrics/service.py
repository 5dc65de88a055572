"""The metrics' shell: the core's numbers in Prometheus' text format, in a file on tmpfs
that node_exporter's textfile collector reads (docs/operate.md, metrics). Written on a
change, at most every [metrics] every_s, never per heartbeat and never to the card.

No thread of its own: the status board hands it each document it writes (any thread),
and the link thread's wake-ups, which come on every heartbeat and at least every 30 s,
read the link's journal and write what waited for its turn."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Callable

from ..base.fsutil import write_in_place
from ..link.journal import ConnectionJournal
from .core import Family, MetricsCore

log = logging.getLogger("edge_agent.metrics")

def renderer() -> Callable[[list[Family]], bytes] | None:
    """The text format's writer, prometheus_client's (Debian's python3-prometheus-client),
    imported here, only where metrics are on: an agent without them never pays for it."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.metrics_core import Metric
    except ImportError:
        return None

    def render(families: list[Family]) -> bytes:
        metrics = []
        for f in families:
            metric = Metric(f.name, f.help, f.kind)
            for suffix, labels, value in f.samples:
                metric.add_sample(f.name + suffix, labels, value)
            metrics.append(metric)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(metrics))
        return generate_latest(registry)

    return render


class _Fixed:
    """A collector of metrics already made: the registry's way in for them."""

    def __init__(self, metrics: list):
        self._metrics = metrics

    def collect(self):
        return iter(self._metrics)


class Metrics:
    """``journal()``: the link's journal (read only from the link thread's turn);
    ``counts()``: (commands by result, watchdog pets so far)."""

    def __init__(self, path: str, every_s: float, *, journal: Callable[[], ConnectionJournal],
                 counts: Callable[[], tuple[dict, int]],
                 render: Callable[[list[Family]], bytes],
                 clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.core = MetricsCore(every_s)
        self._journal, self._counts, self._render, self._clock = journal, counts, render, clock
        self._lock = threading.Lock()
        self._failed: str | None = None   # the last write's error, said once
        self._stopped = False
        # a file a killed process left (tmpfs outlives a restart) says the link was up:
        # emptied before this process says anything
        self._empty()

    def document(self, doc: dict) -> None:
        """From any thread: the status board's document, as it was just written."""
        with self._lock:
            self.core.document(doc)
            self.core.counts(*self._counts())
            self._write_if_due()

    def turn(self, now: float) -> None:
        """On the link thread's wake-up: what the journal has new, and a write due."""
        with self._lock:
            self.core.link(self._journal())
            self.core.counts(*self._counts())
            self._write_if_due()

    def stop(self) -> None:
        """The numbers end with the process: a file left would say the link is up."""
        with self._lock:
            self._stopped = True   # a late refresh of the board writes nothing again
            self._empty()

    def _empty(self) -> None:
        """No series at all: emptied, not removed (under systemd the directory is root's,
        grants.py; node_exporter reads an empty file as no series and no error)."""
        with contextlib.suppress(OSError):
            write_in_place(self.path, b"", create=False)

    def _write_if_due(self) -> None:
        now = self._clock()
        if self._stopped or not self.core.due(now):
            return
        self.core.written(now)   # a failed write is tried again only after every_s too
        try:
            self._make_directory()
            # 0644: node_exporter reads it as its own user; in place: under systemd the
            # file is the agent's, its directory root's (nothing to rename in)
            write_in_place(self.path, self._render(self.core.families()), 0o644)
        except Exception as e:   # a write (OSError) or the library's rendering: said once,
            why = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"[:200]
            if self._failed != why:   # never raised into the thread that refreshed the board
                log.warning("cannot write the metrics textfile %s: %s", self.path, why)
            self._failed = why
            return
        if self._failed is not None:
            log.info("metrics textfile %s written again", self.path)
            self._failed = None


    def _make_directory(self) -> None:
        """The textfile's directory, made readable by node_exporter's user where this
        makes it (the unit's UMask=0077 would leave it 0700); one that exists is the
        operator's, left as it is."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            os.chmod(directory, 0o755)


def from_config(section, path: str, *, journal: Callable[[], ConnectionJournal],
                counts: Callable[[], tuple[dict, int]]) -> Metrics | None:
    """The metrics [metrics] asks for, written to ``path`` (Config.metrics_path): None
    where it is off, or (said once) without the library."""
    if not section.enabled:
        return None
    render = renderer()
    if render is None:
        log.error("[metrics] enabled, but prometheus_client is not installed "
                  "(apt install python3-prometheus-client): no metrics")
        return None
    log.info("metrics: %s, at most every %gs", path, section.every_s)
    return Metrics(path, section.every_s, journal=journal, counts=counts, render=render)
