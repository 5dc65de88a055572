"""The idle limits learnt per network (idle_limit.py), kept in the state directory: an
agent restarted behind the same reaping box starts with what it learnt, instead of
paying two more reaps to learn it again, and a screen moved to another site does not
carry one site's limit to the next.

A network is named by its default route: the interface, the gateway and the gateway's
hardware address (two sites on the same private range have different gateways' MACs).
Written when what was learnt changes (a few times a day at worst, never per
heartbeat), durably: it is worth a power cut.
"""
from __future__ import annotations

import json
import logging
import os

from ..base.fsutil import an_object, atomic_write, load_state

log = logging.getLogger("edge_agent.link")

FILE = "idle-limits.json"
MAX_NETWORKS = 16
MAX_BYTES = 64 * 1024
NO_ROUTE = "no-default-route"


def network_key(proc: str = "/proc") -> str:
    """The network this device is on, as its default route names it."""
    try:
        with open(os.path.join(proc, "net/route"), encoding="ascii", errors="replace") as f:
            rows = [line.split() for line in f.read(65536).splitlines()[1:]]
    except OSError:
        return NO_ROUTE
    for row in rows:
        if len(row) >= 3 and row[1] == "00000000":
            iface, gateway = row[0], _ipv4(row[2])
            return f"{iface}/{gateway}/{_hardware_address(proc, gateway)}"
    return NO_ROUTE


def _ipv4(little_endian_hex: str) -> str:
    try:
        raw = int(little_endian_hex, 16).to_bytes(4, "little")
    except (ValueError, OverflowError):
        return "?"
    return ".".join(str(b) for b in raw)


def _hardware_address(proc: str, ip: str) -> str:
    try:
        with open(os.path.join(proc, "net/arp"), encoding="ascii", errors="replace") as f:
            for line in f.read(65536).splitlines()[1:]:
                cols = line.split()
                if len(cols) >= 4 and cols[0] == ip:
                    return cols[3]
    except OSError:
        pass
    return "?"


class IdleMemory:
    def __init__(self, state_dir: str):
        self.path = os.path.join(state_dir, FILE)

    def _load(self) -> dict:
        doc, why = load_state(self.path, MAX_BYTES, an_object)
        if why is not None:
            log.warning("ignoring the learnt idle limits in %s: %s", self.path, why)
        return doc or {}

    def recall(self, network: str) -> dict | None:
        entry = self._load().get(network)
        return entry if isinstance(entry, dict) else None

    def keep(self, network: str, memory: dict | None) -> None:
        doc = {k: v for k, v in self._load().items() if k != network and isinstance(v, dict)}
        if memory is not None:
            doc[network] = memory
        while len(doc) > MAX_NETWORKS:      # the oldest kept first: insertion order
            doc.pop(next(iter(doc)))
        try:
            atomic_write(self.path, json.dumps(doc, sort_keys=False).encode(), 0o600)
        except OSError as e:
            log.warning("cannot keep the learnt idle limit in %s: %s", self.path, e.strerror)
