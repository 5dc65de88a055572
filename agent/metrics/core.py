"""What the metrics say, decided without I/O: the link's journal read once per change
into counters and histograms, the status document turned into gauges, and when the
textfile is due. The numbers live here as plain data; the shell (service.py) only puts
them in Prometheus' text format and on tmpfs.

Counters count from this process's start, as Prometheus expects of a counter (its
rate() sees a restart as a reset); the gauges say what the status file says."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..base import reasons
from ..screen.core import DISPLAY_STATES
from ..device import power as device_power, storage as device_storage
from ..link.journal import ConnectionJournal
from ..screen import ladder
from ..settings import rules as settings_rules
from ..update import rules as update_rules

PREFIX = "edge_agent_"
# Seconds. A connect is DNS, TCP, TLS, the upgrade and the server's answer: tenths on a
# good site, seconds through a proxy or on a weak cellular link, the connect timeout at
# worst. A heartbeat's round trip is milliseconds on a LAN, a second on a bad one.
CONNECT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RTT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# The labels a series may carry, fixed: a value from outside them is said as "other",
# so nothing the server or a file says can grow the number of series.
REASONS = frozenset(v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str))
COMMAND_RESULTS = ("ok", "error", "refused")
UPDATE_OUTCOMES = (update_rules.COMMITTED, update_rules.ROLLED_BACK, update_rules.REFUSED,
                   update_rules.FAILED)
SETTINGS_STATES = ("none", "staged", "trial", "kept")
SETTINGS_RESULTS = (settings_rules.KEPT, settings_rules.ROLLED_BACK, settings_rules.EXPIRED)
# base/card.py's words for a card the agent cannot use (app/state_health.py says them)
STORAGE_STATES = ("ok", "read-only", "failed", "unavailable")
# the picture check's verdicts (screen/watch.py), the ladder's states (the held state's
# words shortened) and rungs (screen/ladder.py)
PICTURE_VERDICTS = (*ladder.VERDICTS, "unavailable", "off")
RECOVERY_STATES = {ladder.WATCHING: "watching", ladder.CONFIRMING: "confirming",
                   ladder.ACTING: "acting", ladder.WAITING: "waiting",
                   ladder.EXHAUSTED: "exhausted", ladder.HELD: "held"}
# what the status document counts itself: written as counters (name_total)
DOC_COUNTERS = frozenset({"screen_recovery_rungs"})


def reason_label(reason: object) -> str:
    return reason if isinstance(reason, str) and reason in REASONS else "other"


def _label(value: object, allowed) -> str:
    return value if isinstance(value, str) and value in allowed else "other"


def _number(value: object) -> float:
    """A number from the status document; NaN (Prometheus' "no value") for anything else."""
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


@dataclass
class Histogram:
    buckets: tuple
    counts: list = field(default_factory=list)   # per bucket, not cumulative; +Inf last
    total: float = 0.0

    def __post_init__(self):
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        i = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += times
        self.total += value * times

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip([*map(_bound, self.buckets), "+Inf"], self.counts):
            running += n
            out.append((bound, running))
        return out


def _bound(b: float) -> str:
    return repr(float(b))


@dataclass(frozen=True)
class Family:
    """One metric as the text format says it: ``samples`` are (suffix, labels, value)."""
    name: str
    kind: str     # counter | gauge | histogram
    help: str
    samples: tuple


class JournalReader:
    """What is new in the link's journal since the last read, each thing once: a heal
    (a connection opened after one was lost, labelled with why that one ended), every
    loss and failed attempt by reason, each connect's duration, each heartbeat's round
    trip. Read on the link thread, which alone writes the journal."""

    def __init__(self):
        self._seen_n = 0                   # the highest connection number read
        self._loss_mark = (-math.inf, 0)   # (the latest failure's time, how many at it)
        self._rtt_at = (0, 0, 0.0)         # (connection number, its acks and their ms read)

    def read(self, journal: ConnectionJournal, core: "MetricsCore") -> bool:
        changed = False
        records = list(journal.records)
        by_n = {r.n: r for r in records}
        for rec in records:
            if rec.n <= self._seen_n:
                continue
            changed = True
            if rec.connect_ms is not None:
                core.connect.observe(rec.connect_ms / 1000.0)
            before = by_n.get(rec.n - 1)
            if before is not None and before.ended_reason is not None:
                label = reason_label(before.ended_reason)
                core.heals[label] = core.heals.get(label, 0) + 1
        changed |= self._read_losses(journal, core)
        changed |= self._read_rtts(records, core)
        if records:
            self._seen_n = max(self._seen_n, records[-1].n)
        return changed

    def _read_losses(self, journal: ConnectionJournal, core: "MetricsCore") -> bool:
        """The failures come in time order (the monotonic clock); what was read is
        the ones before the mark and as many as were read at it."""
        mark, read_at_mark = self._loss_mark
        failures, fresh, at_mark = list(journal.failures), [], 0
        for at, reason in failures:
            if at < mark:
                continue
            if at == mark:
                at_mark += 1
                if at_mark <= read_at_mark:
                    continue
            fresh.append((at, reason))
        for _, reason in fresh:
            label = reason_label(reason)
            core.losses[label] = core.losses.get(label, 0) + 1
        if fresh:
            last = fresh[-1][0]
            self._loss_mark = (last, sum(1 for at, _ in failures if at == last))
        return bool(fresh)

    def _read_rtts(self, records: list, core: "MetricsCore") -> bool:
        """Each ack once. The link thread turns after every ack it takes, so two acks
        between reads are rare (the minutes before the first proof): their mean stands
        for each, and the sum stays exact."""
        n_read, acks_read, ms_read = self._rtt_at
        changed = False
        for rec in records:
            if rec.n < n_read:
                continue
            same = rec.n == n_read
            new = rec.heartbeats_acked - (acks_read if same else 0)
            if new > 0:
                ms = rec.rtt_ms_sum - (ms_read if same else 0.0)
                core.rtt.observe(max(ms, 0.0) / new / 1000.0, new)
                changed = True
            self._rtt_at = n_read, acks_read, ms_read = rec.n, rec.heartbeats_acked, rec.rtt_ms_sum
        return changed


class MetricsCore:
    """Everything the textfile says. ``link(journal)``, ``document(doc)`` and
    ``counts(...)`` take news and answer whether a series changed; ``families()`` is
    what to write. ``every_s``: the least time between two writes."""

    def __init__(self, every_s: float):
        self.every_s = every_s
        self.heals: dict[str, int] = {}
        self.losses: dict[str, int] = {}
        self.connect = Histogram(CONNECT_BUCKETS)
        self.rtt = Histogram(RTT_BUCKETS)
        self.connections = 0
        self.commands = {result: 0 for result in COMMAND_RESULTS}
        self.pets = 0
        self.gauges: tuple = ()
        self._reader = JournalReader()
        self._dirty = False
        self._written_at = -math.inf

    # -- news --------------------------------------------------------------------------
    def link(self, journal: ConnectionJournal) -> bool:
        changed = self._reader.read(journal, self)
        self.connections = journal.total_connections
        return self._note(changed)

    def counts(self, commands: dict, pets: int) -> bool:
        counted = {r: int(commands.get(r, 0)) for r in COMMAND_RESULTS}
        changed = counted != self.commands or pets != self.pets
        self.commands, self.pets = counted, pets
        return self._note(changed)

    def document(self, doc: dict) -> bool:
        gauges = tuple(gauges_of(doc))
        changed = gauges != self.gauges
        self.gauges = gauges
        return self._note(changed)

    # -- pace --------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        """A change not written yet, and the last write at least every_s ago."""
        return self._dirty and now - self._written_at >= self.every_s

    def written(self, now: float) -> None:
        self._dirty, self._written_at = False, now

    def _note(self, changed: bool) -> bool:
        self._dirty |= changed
        return changed

    # -- what is written ----------------------------------------------------------------
    def families(self) -> list[Family]:
        p = PREFIX
        return [
            Family(p + "link_heals", "counter",
                   "Connections made again after one was lost, by why it was lost",
                   tuple(("_total", {"reason": r}, n) for r, n in sorted(self.heals.items()))),
            Family(p + "link_losses", "counter",
                   "Connections lost and connect attempts failed, by reason",
                   tuple(("_total", {"reason": r}, n) for r, n in sorted(self.losses.items()))),
            Family(p + "link_connections", "counter", "Connections opened",
                   (("_total", {}, self.connections),)),
            _histogram(p + "link_connect_seconds", "From dialing to the server's answer",
                       self.connect),
            _histogram(p + "link_heartbeat_rtt_seconds", "Heartbeat round trips",
                       self.rtt),
            Family(p + "commands", "counter", "Server commands by result",
                   tuple(("_total", {"result": r}, n) for r, n in self.commands.items())),
            Family(p + "watchdog_pets", "counter", "systemd watchdog pets sent",
                   (("_total", {}, self.pets),)),
            *_gauge_families(self.gauges),
        ]


def _histogram(name: str, help_text: str, h: Histogram) -> Family:
    buckets = h.cumulative()
    return Family(name, "histogram", help_text, (
        *(("_bucket", {"le": bound}, n) for bound, n in buckets),
        ("_count", {}, buckets[-1][1]), ("_sum", {}, round(h.total, 6))))


# -- the status document's gauges --------------------------------------------------------
GAUGE_HELP = {
    "link_up": "1 while the link is connected",
    "link_proven_live": "1 while the link is connected and a heartbeat proved it lately",
    "queue_items": "Uploads queued on the card",
    "queue_bytes": "Bytes of uploads queued on the card",
    "queue_oldest_item_timestamp_seconds":
        "When the oldest queued upload was queued (Unix time; its age: time() - this)",
    "queue_dead_letters": "Uploads given up on and kept aside",
    "update_pending": "Self-updates ordered and not settled",
    "update_last_outcome": "1 for the outcome of the latest self-update",
    "settings_state": "1 for the state of the fleet's settings revision",
    "settings_revision": "The fleet's settings revision in force",
    "settings_last_result": "1 for how the latest fleet settings revision ended",
    "storage_state": "1 for the state of the card as the agent uses it",
    "display_state": "1 for the display's state as last read (on, off, disconnected, unknown)",
    "info": "The agent's version",
    "screen_picture_verdict": "1 for the picture check's latest verdict",
    "screen_player_up": "1 while the player's unit is active, 0 while not (NaN: unread)",
    "screen_player_restarts": "The player unit's restarts, as systemd counts them (NRestarts)",
    "screen_recovery_state": "1 for the state of the screen's recovery ladder",
    "screen_recovery_rungs": "Rungs of the recovery ladder run, by rung",
    "package_info": "1, labelled with the version dpkg installed and the newest apt's lists offer",
    "package_behind": "1 while apt's lists offer a newer version than the one installed",
    "apt_update_success_timestamp_seconds":
        "When apt last updated its lists with success (Unix time; its age: time() - this)",
    "device_storage_verdict": "1 for the card's verdict from the kernel's counts",
    "device_power_flag": "1 for each Pi firmware throttling flag up now",
    "device_written_bytes_per_day": "Bytes written to the card a day since the agent started",
}


def gauges_of(doc: dict) -> list[tuple[str, tuple, float]]:
    """(name, ((label, value), ...), value) from the status document (app/status.py)."""
    def section(name: str) -> dict:
        value = doc.get(name)
        return value if isinstance(value, dict) else {}

    link, queue, update = section("link"), section("uploads"), section("update")
    settings, storage = section("settings"), section("storage")
    last_update = update.get("last") if isinstance(update.get("last"), dict) else {}
    last_settings = settings.get("last") if isinstance(settings.get("last"), dict) else {}
    pending = update.get("pending")
    out = [
        ("link_up", (), float(link.get("state") == "online")),
        ("link_proven_live", (), float(link.get("proven_live") is True)),
        ("queue_items", (), _number(queue.get("items"))),
        ("queue_bytes", (), _number(queue.get("bytes"))),
        ("queue_oldest_item_timestamp_seconds", (), _number(queue.get("oldest_at"))),
        ("queue_dead_letters", (), _number(queue.get("dead_letter"))),
        ("update_pending", (), float(len(pending)) if isinstance(pending, list) else math.nan),
        ("settings_revision", (), _number(settings.get("revision"))),
        ("info", (("version", _label(doc.get("version"), _VersionLike())),), 1.0),
    ]
    out += _one_hot("update_last_outcome", "outcome", UPDATE_OUTCOMES,
                    last_update.get("outcome") if last_update else None)
    out += _one_hot("settings_state", "state", SETTINGS_STATES,
                    settings.get("state") or "none")
    out += _one_hot("settings_last_result", "result", SETTINGS_RESULTS,
                    last_settings.get("result") if last_settings else None)
    out += _one_hot("storage_state", "state", STORAGE_STATES, storage.get("state"))
    screen = section("screen")
    out += _screen_gauges(screen)
    out += _package_gauges(update)
    watched = screen.get("watched") if isinstance(screen.get("watched"), dict) else None
    if watched is not None:   # a screen whose display is watched: its series, no other's
        out += _one_hot("display_state", "state", DISPLAY_STATES, watched.get("state"))
    device = section("device")
    card = device.get("storage") if isinstance(device.get("storage"), dict) else {}
    flags = (device.get("power") or {}).get("now") if isinstance(device.get("power"), dict) \
        else None
    out += _one_hot("device_storage_verdict", "verdict", device_storage.VERDICTS,
                    card.get("verdict"))
    out += [("device_power_flag", (("flag", f),),
             float(isinstance(flags, list) and f in flags)) for f in device_power.FLAGS]
    out.append(("device_written_bytes_per_day", (),
                _number(card.get("written_bytes_per_day"))))
    return out


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _screen_gauges(screen: dict) -> list:
    """The picture's verdict (every screen: all 0 where none is checked), the player and
    the ladder where this screen has them."""
    picture, player, recovery = (_dict(screen.get(k)) for k in ("picture", "player",
                                                                 "recovery"))
    out = _one_hot("screen_picture_verdict", "verdict", PICTURE_VERDICTS,
                   picture.get("verdict"))
    if player:
        active = player.get("active")
        out += [("screen_player_up", (), float(active) if isinstance(active, bool) else math.nan),
                ("screen_player_restarts", (), _number(player.get("restarts")))]
    if recovery.get("enabled") is True:
        out += _one_hot("screen_recovery_state", "state", tuple(RECOVERY_STATES.values()),
                        RECOVERY_STATES.get(recovery.get("state")))
        taken = _dict(recovery.get("taken"))
        out += [("screen_recovery_rungs", (("rung", rung),), _number(taken.get(rung, 0)))
                for rung in ladder.RUNGS]
    return out


def _package_gauges(update: dict) -> list:
    """The installed package against what apt's lists offer, and apt's last success:
    nothing where apt was not read."""
    repository = _dict(update.get("repository"))
    if not repository:
        return []
    version = _VersionLike()
    behind = repository.get("behind")
    return [("package_info", (("installed", _label(update.get("installed"), version)),
                              ("newest", _label(repository.get("newest"), version))), 1.0),
            ("package_behind", (), float(behind) if isinstance(behind, bool) else math.nan),
            ("apt_update_success_timestamp_seconds", (),
             _number(repository.get("apt_success_at")))]


def _one_hot(name: str, label: str, values: tuple, current) -> list:
    """Each known value a series, 1 for the current one: an alert says `== 1`, and a
    value that ends is a 0, not a series that vanishes. Nothing at all: all 0."""
    return [(name, ((label, v),), float(current == v)) for v in values]


class _VersionLike:
    """A version string as a label: short, of the characters a version has."""

    def __contains__(self, value: str) -> bool:
        return 0 < len(value) <= 64 and all(c.isalnum() or c in ".+-~_" for c in value)


def _gauge_families(gauges: tuple) -> list[Family]:
    grouped: dict[str, list] = {}
    for name, labels, value in gauges:
        grouped.setdefault(name, []).append(("", dict(labels), value))
    return [Family(PREFIX + name, "counter", GAUGE_HELP[name],
                   tuple(("_total", labels, v) for _, labels, v in samples))
            if name in DOC_COUNTERS else
            Family(PREFIX + name, "gauge", GAUGE_HELP[name], tuple(samples))
            for name, samples in grouped.items()]
