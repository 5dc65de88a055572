"""The network healed on the device, never blindly: sans I/O.

The link says why it is down (base/reasons.py); the device says what it sees of its own
network (the shell's probe: netprobe.py). Only when both point at the device is anything
done, and then step by step:

- **What counts as a device-side cause.** The link is down for a reason where nothing
  answered (``reasons.SILENT_PATH``: no route, a timeout, DNS that got no answer...), and
  the kernel says one of: no carrier on the default route's interface, no address on it
  (no lease), no default route, the gateway's neighbour entry FAILED or INCOMPLETE (it
  answers nothing at the neighbour level), or an interface that sent and received
  nothing (wedged). Anything else is upstream: a reason where something answered (a
  reset, TLS, the proxy, HTTP, a captive portal) or a gateway the kernel holds as
  reachable (a WAN outage the gateway itself sees). Upstream, nothing is done beyond the
  link's own backoff.
- **Not one probe.** A cause is acted on once it has been seen for ``confirm_s`` and by
  at least two probes. Each episode that begins within the hour of the one before waits
  twice as long (at most MAX_BACKOFF times): a flapping cause is not mended in a storm.
- **The rungs, in order**, each at most once an episode: bounce the interface through
  whatever manages it (a renew, a reconfigure, ifup again), restart that manager, reboot
  (only where allowed; the reboots a day are the screen ladder's book, shared: the shell
  counts the reboot there and answers a refusal as a rung that did not run). The bounce
  and the restart have their own hourly budgets (the screen ladder's rule, imported).
- **After each rung** the network has ``wait_s``; then, if the link is still not proven
  live and a probe made after the rung still sees a device-side cause, the next rung.
  Upstream meanwhile: held, nothing more (the episode stays open, its rungs spent).
- **Healed** when the link is proven live again: the episode ends, said once.
- **Exhausted**: no rung left. Said once; nothing more until the link is proven live.

Inputs: ``LinkSeen``, ``Probed``, ``RungDone``, ``Tick``. Effects: ``Act`` (run the rung,
answer with RungDone) and ``Report`` (the event ``network.healing``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..base import reasons as R
from ..base.backoff import ceiling
# a rung's answer, the clock's tick and a report are the screen ladder's own records
from ..screen.ladder import HOUR, Budget, Report, RungDone, Tick

EVENT = "network.healing"
BOUNCE, RESTART_MANAGER, REBOOT = "bounce", "restart-manager", "reboot"
RUNGS = (BOUNCE, RESTART_MANAGER, REBOOT)
# device-side causes, in the order they are told (the first found is the cause)
NO_ROUTE, NO_CARRIER, NO_ADDRESS, GATEWAY_SILENT, WEDGED = (
    "no-default-route", "no-carrier", "no-address", "gateway-silent", "wedged")
CAUSES = (NO_ROUTE, NO_CARRIER, NO_ADDRESS, GATEWAY_SILENT, WEDGED)
UPSTREAM = "upstream"
# the kernel's neighbour states (ip-neighbour(8)): the gateway answers nothing
NEIGH_SILENT = frozenset({"FAILED", "INCOMPLETE"})
# the kernel's neighbours could not be read: nothing is known of the gateway, so nothing
# is proven (not "no entry", which is None)
NEIGH_UNKNOWN = "unknown"
MAX_BACKOFF = 16
MAX_SAID = 300


@dataclass(frozen=True)
class Probe:
    """What the kernel says of the device's own network, at one moment."""
    interface: str | None        # the default route's, else the last one seen (None: none)
    route: bool = True           # a default route exists
    carrier: bool | None = None  # /sys/class/net/IF/carrier (None: not known)
    address: bool | None = None  # a global address on it
    neighbour: str | None = None  # the gateway's neighbour state, upper case (None: no
    #                               entry; NEIGH_UNKNOWN: the kernel's table not read)
    rx_packets: int | None = None
    tx_packets: int | None = None
    manager: str | None = None   # what manages the interface (netprobe.py), or None
    known: bool = True           # False: the routes could not be read (no proof of anything)


@dataclass(frozen=True)
class LinkSeen:
    down: bool                   # waiting or connecting: no connection
    reason: str | None           # the link's last reason (base/reasons.py)
    proven_live: bool
    now: float


@dataclass(frozen=True)
class Probed:
    probe: Probe
    now: float


@dataclass(frozen=True)
class Act:
    rung: str
    cause: str
    interface: str | None
    manager: str | None


@dataclass(frozen=True)
class Policy:
    enabled: bool                 # [device] heal_network
    probe_s: float                # [device] heal_probe_s: a probe this often while down
    confirm_s: float              # [device] heal_confirm_s
    wait_s: float                 # [device] heal_wait_s: each rung's time to work
    reboot: bool                  # reboot in [commands] allow and a reboot budget
    bounces_per_hour: int = 4
    restarts_per_hour: int = 2


WATCHING, CONFIRMING, ACTING, WAITING, HELD, EXHAUSTED = (
    "watching", "confirming", "acting", "waiting", "held: the cause is upstream",
    "exhausted")


# the link's reasons that a missing default route explains: the kernel found no route
# (or the resolver none to ask); a connect that timed out had one, to a server on the
# screen's own subnet that needs no default route
ROUTELESS = frozenset({R.NETWORK_UNREACHABLE, R.DNS_FAILED, R.PROXY_UNREACHABLE})


def cause(probe: Probe, before: Probe | None, reason: str | None = None) -> str:
    """The device-side cause ``probe`` shows (``before``: the probe before it, for a
    wedged interface; ``reason``: the link's), or UPSTREAM where the kernel sees nothing
    wrong on the device."""
    if not probe.known:
        return UPSTREAM
    routeless = reason is None or reason in ROUTELESS
    if probe.interface is None:
        return NO_ROUTE if routeless else UPSTREAM
    if probe.carrier is False:
        return NO_CARRIER
    if probe.address is False:
        return NO_ADDRESS
    if not probe.route:
        return NO_ROUTE if routeless else UPSTREAM
    if probe.neighbour in NEIGH_SILENT:
        return GATEWAY_SILENT
    if (before is not None and before.interface == probe.interface
            and None not in (probe.rx_packets, probe.tx_packets, before.rx_packets,
                             before.tx_packets)
            and probe.tx_packets > before.tx_packets and probe.rx_packets == before.rx_packets
            and probe.neighbour not in ("REACHABLE", NEIGH_UNKNOWN)):
        return WEDGED
    return UPSTREAM


class Healer:
    def __init__(self, policy: Policy):
        self.policy = policy
        self.state = WATCHING
        self.down = False
        self.reason: str | None = None
        self.probe: Probe | None = None
        self.probe_at: float | None = None
        self.cause = UPSTREAM
        self.interface: str | None = None     # the last interface a default route named
        self.since: float | None = None       # the device-side cause seen since
        self.samples = 0
        self.episode_cause = ""
        self.tried: list[str] = []
        self.considered: list[str] = []
        self.passed: list[str] = []
        self.rung_at = 0.0
        self.wait_until = 0.0
        self.episodes: list[float] = []
        self.taken = {rung: 0 for rung in RUNGS}
        self.budgets = {BOUNCE: Budget(policy.bounces_per_hour, HOUR),
                        RESTART_MANAGER: Budget(policy.restarts_per_hour, HOUR)}
        self.last_outcome = ""
        self._next_probe = 0.0

    # -- what the shell asks -----------------------------------------------------------
    def probe_due(self, now: float) -> bool:
        """A probe is wanted now: only while the link is down for a silent reason (an
        agent whose link is up probes nothing)."""
        return (self.policy.enabled and self.suspect() and self.state != ACTING
                and now >= self._next_probe)

    def next_wake(self, now: float) -> float | None:
        """When the shell should look again (monotonic), or None: nothing until the link
        changes."""
        if not self.policy.enabled or not self.suspect():
            return None
        wake = max(now, self._next_probe)
        if self.state == WAITING:
            wake = min(wake, max(now, self.wait_until))
        return wake

    def suspect(self) -> bool:
        return self.down and self.reason in R.SILENT_PATH

    # -- across a restart of the agent (a watchdog's, in the same boot) ---------------
    def kept(self) -> dict:
        """What a restart in this boot must not forget: the episode's rungs and the
        hours' budgets, in monotonic seconds (the boot's clock, not the process's)."""
        return {"tried": list(self.tried), "considered": list(self.considered),
                "passed": list(self.passed), "cause": self.episode_cause,
                "taken": dict(self.taken), "episodes": list(self.episodes),
                "budgets": {r: list(b.times) for r, b in self.budgets.items()}}

    def restore(self, doc) -> None:
        """The episode a previous process of this boot left: held, so a device-side cause
        still there is confirmed again and climbs on from the next rung, never from the
        first. ValueError for anything kept() does not write."""
        def words(key, allowed=None):
            v = doc.get(key)
            if not isinstance(v, list) or len(v) > 16 or not all(
                    isinstance(x, str) and len(x) <= MAX_SAID for x in v) or (
                    allowed is not None and not set(v) <= set(allowed)):
                raise ValueError(f"{key}: not a list of words")
            return list(v)

        def times(v):
            if not isinstance(v, list) or len(v) > 64 or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ValueError("not a list of times")
            return [float(x) for x in v]
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        tried, considered = words("tried", RUNGS), words("considered", RUNGS)
        passed, episode = words("passed"), doc.get("cause")
        budgets = doc.get("budgets") if isinstance(doc.get("budgets"), dict) else {}
        taken = doc.get("taken") if isinstance(doc.get("taken"), dict) else {}
        if episode not in ("", *CAUSES):
            raise ValueError("cause: not a cause")
        self.episodes = times(doc.get("episodes", []))
        for rung, budget in self.budgets.items():
            budget.times = times(budgets.get(rung, []))
        self.taken.update({r: n for r, n in taken.items()
                           if r in RUNGS and isinstance(n, int) and 0 <= n < 1 << 31})
        self.tried, self.considered, self.passed = tried, considered, passed
        self.episode_cause = episode
        self.state = HELD if tried else WATCHING

    def snapshot(self) -> dict:
        p = self.probe
        return {"enabled": self.policy.enabled, "state": self.state,
                "cause": self.episode_cause or (self.cause if p is not None and self.suspect()
                                                else None),
                "interface": p.interface if p else self.interface,
                "manager": p.manager if p else None,
                "carrier": p.carrier if p else None, "gateway": p.neighbour if p else None,
                "tried": list(self.tried), "taken": dict(self.taken),
                "last": self.last_outcome or None}

    # -- inputs ------------------------------------------------------------------------
    def handle(self, event) -> list:
        if isinstance(event, LinkSeen):
            return self._link(event)
        if isinstance(event, Probed):
            return self._probed(event)
        if isinstance(event, RungDone):
            return self._done(event)
        if isinstance(event, Tick):
            return self._look(event.now)
        raise TypeError(f"not an input of the network's healer: {event!r}")

    # -- internals ---------------------------------------------------------------------
    def _link(self, event: LinkSeen) -> list:
        was = self.suspect()
        self.down, self.reason = bool(event.down), event.reason
        if event.proven_live:
            return self._healed()
        if self.suspect() and not was:
            self._next_probe = event.now    # probe at once
        if not self.suspect() and self.state == CONFIRMING:
            self.state, self.since, self.samples = WATCHING, None, 0
        return self._look(event.now)

    def _probed(self, event: Probed) -> list:
        before = self.probe
        self.probe, self.probe_at = event.probe, event.now
        self._next_probe = event.now + self.policy.probe_s
        if event.probe.interface is not None:
            self.interface = event.probe.interface
        self.cause = cause(event.probe, before, self.reason)
        if not self.policy.enabled or not self.suspect():
            return []
        if self.cause != UPSTREAM:
            if self.since is None:
                self.since, self.samples = event.now, 0
            self.samples += 1
        else:
            self.since, self.samples = None, 0
        return self._look(event.now)

    def _device_side(self, since: float | None = None) -> bool:
        return (self.suspect() and self.cause != UPSTREAM and self.probe_at is not None
                and (since is None or self.probe_at > since))

    def _look(self, now: float) -> list:
        if not self.policy.enabled:
            return []
        if self.state in (WATCHING, CONFIRMING, HELD):
            if not self._device_side():
                if self.state == CONFIRMING:
                    self.state = HELD if self.tried else WATCHING
                return []
            self.state = CONFIRMING
            if self.samples < 2 or now - self.since < self._confirm_s(now):
                return []
            if not self.tried:
                self.episodes.append(now)
            self.episode_cause = self.cause
            return self._next(now)
        if self.state == WAITING and now >= self.wait_until:
            if self._device_side(since=self.rung_at):
                self.episode_cause = self.cause
                return self._next(now)
            if self.suspect() and self.probe_at is not None and self.probe_at > self.rung_at:
                self.state = HELD     # upstream now: nothing more unless it turns again
                self.since, self.samples = None, 0
        return []

    def _confirm_s(self, now: float) -> float:
        self.episodes = [t for t in self.episodes if now - t < HOUR]
        before = len(self.episodes) - (1 if self.tried and self.episodes else 0)
        # an episode going on (held, or a restart's) is not one more of the hour
        return ceiling(self.policy.confirm_s, self.policy.confirm_s * MAX_BACKOFF, before)

    def _next(self, now: float) -> list:
        for rung in RUNGS:
            if rung in self.considered:
                continue
            budget = self.budgets.get(rung)
            if budget is not None and budget.limit and not budget.left(now) \
                    and self._refusal(rung, now, budgets=False) == "":
                # spent for the hour: wait for it, never a harsher rung in its place (a
                # flapping cause would otherwise climb to a reboot on spent budgets)
                self.state, self.wait_until = WAITING, min(budget.times) + budget.window_s
                self.last_outcome = (f"{rung}: done {budget.limit} times in the hour; "
                                     "it waits for the hour to pass")
                return []
            self.considered.append(rung)
            refusal = self._refusal(rung, now)
            if refusal:
                self.passed.append(refusal)
                continue
            self.tried.append(rung)
            self.taken[rung] += 1
            if rung in self.budgets:
                self.budgets[rung].spend(now)
            self.state = ACTING
            return [Act(rung, self.episode_cause, self.interface,
                        self.probe.manager if self.probe else None)]
        return self._exhaust()

    def _refusal(self, rung: str, now: float, budgets: bool = True) -> str:
        manager = self.probe.manager if self.probe else None
        if rung == BOUNCE and (manager is None or self.interface is None):
            return f"{rung}: no manager of the interface is known"
        if rung == RESTART_MANAGER and manager is None:
            return f"{rung}: no network manager is known"
        if budgets and rung in self.budgets and not self.budgets[rung].left(now):
            return f"{rung}: done {self.budgets[rung].limit} times in the hour"
        if rung == REBOOT and not self.policy.reboot:
            return (f"{rung}: not allowed ([commands] allow does not list it, or no reboot "
                    "a day is allowed)")
        return ""

    def _fields(self, rung: str | None, outcome: str, said: str = "") -> dict:
        return {"rung": rung, "outcome": outcome, "cause": self.episode_cause,
                "reason": self.reason, "interface": self.interface,
                "manager": self.probe.manager if self.probe else None, "said": said,
                "tried": list(self.tried)}

    def _done(self, event: RungDone) -> list:
        if self.state != ACTING or not self.tried or event.rung != self.tried[-1]:
            return []
        said = " ".join(str(event.said).split())[:MAX_SAID]
        self.last_outcome = f"{event.rung} {'done' if event.ok else 'failed'}: {said}"
        report = Report(EVENT, self._fields(event.rung, "done" if event.ok else "failed",
                                            said))
        if not event.ok:
            if event.rung == REBOOT:
                self.passed.append(f"{REBOOT}: {said}")
                return [report, *self._exhaust()]
            return [report, *self._next(event.now)]
        self.state, self.rung_at = WAITING, event.now
        self.wait_until = event.now + self.policy.wait_s
        self._next_probe = min(self._next_probe, self.wait_until)
        return [report]

    def _exhaust(self) -> list:
        self.state = EXHAUSTED
        return [Report(EVENT, {**self._fields(None, "exhausted"),
                               "passed_over": list(self.passed)})]

    def _healed(self) -> list:
        report = ([Report(EVENT, self._fields(None, "healed"))]
                  if self.tried and self.state != WATCHING else [])
        self.state, self.since, self.samples = WATCHING, None, 0
        self.episode_cause = ""
        self.tried, self.considered, self.passed = [], [], []
        return report
