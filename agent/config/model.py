"""The configuration as the parts take it: a Config of sections, one for each part, so
that a part's shell is handed its own section and never the whole. Plain data: what
the values mean is each part's; which values are allowed is the schema's (schema.py),
which takes the defaults written here."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlparse

from ..base.backoff import BackoffPolicy
from ..base import status_file
from ..base.egress import Egress
from .policies import IdlePolicy, KeepalivePolicy, LivenessPolicy, UploadPolicy

# in the state directory: the command ledger and the upload queue, each this screen's own
# (a card copied to another board sets them aside with its identity: identity/board.py)
COMMANDS_FILE, QUEUE_DIR = "commands.json", "queue"




@dataclass(frozen=True)
class Server:
    """[server]: the fleet server, its profile, and how a connect to it is bounded."""
    url: str
    profile: str
    connect_timeout_s: float
    egress: Egress

    @property
    def display(self) -> str:
        """The URL for logs and the world-readable status file: without any
        user:password a URL may carry."""
        return redact_url(self.url)


@dataclass(frozen=True)
class Identity:
    """[identity]: the device id and token, and where the state is kept."""
    device_id: str | None
    token: str | None = field(repr=False)
    state_dir: str
    show_code_on_console: bool


@dataclass(frozen=True)
class Runtime:
    """[runtime]: the directory on tmpfs (the status file, the pairing code)."""
    dir: str


@dataclass(frozen=True)
class Link:
    """[link]: the heartbeat's liveness, the reconnect backoff, TCP's keepalive, the idle limit."""
    liveness: LivenessPolicy
    backoff: BackoffPolicy
    keepalive: KeepalivePolicy
    idle: IdlePolicy
    stable_after_s: float
    wake_min_interval_s: float


@dataclass(frozen=True)
class Events:
    """[events]: the device's events (udev, netlink), their settling and telemetry's pace."""
    enabled: bool
    settle_s: float
    fallback_interval_s: float
    udev_source: str
    telemetry_every_s: float


@dataclass(frozen=True)
class Watchdog:
    """[watchdog]: what systemd's watchdog pets stand for."""
    require_link: bool


@dataclass(frozen=True)
class Commands:
    """[commands]: the commands allowed, the ones configured to run them, their bound."""
    allow: frozenset
    screenshot_command: str | None
    display_on_command: str | None
    display_off_command: str | None
    timeout_s: float


@dataclass(frozen=True)
class Hours:
    """[hours]: the working hours, their exceptions, timezone and clock."""
    week: tuple = ()
    exceptions: tuple = ()
    timezone: str | None = None
    clock: str = "synchronised"


@dataclass(frozen=True)
class Screen:
    """[screen]: the display's checks, the player and its recovery ladder."""
    settle_s: float = 10.0
    x_display: str | None = None
    cec_device: str = "/dev/cec0"
    picture_every_s: float = 900.0
    capture_command: str | None = None
    black_luma: float = 16.0
    black_contrast: float = 4.0
    content_moves: bool = False
    frozen_after_s: float = 300.0
    upload_pictures: bool = False
    player_unit: str | None = None
    recovery: bool = False
    player_restarts_per_hour: int = 3
    reboots_per_day: int = 1
    recovery_wait_s: float = 60.0
    brightness_via: str = "auto"
    volume_via: str = "auto"
    mixer_control: str = "Master"
    display_every_s: float = 60.0


@dataclass(frozen=True)
class Update:
    """[update]: how a self-update is proven and whether it may go back."""
    proof_timeout_s: float
    allow_downgrade: bool


@dataclass(frozen=True)
class Fleet:
    """[fleet]: which settings the fleet's overlay may change, and its proof's bound."""
    proof_timeout_s: float = 120.0
    manage_commands_allow: bool = False
    manage_server_url: bool = False


@dataclass(frozen=True)
class Log:
    """[log]: the journal's level."""
    level: str


@dataclass(frozen=True)
class Metrics:
    """[metrics]: the textfile for node_exporter, where asked for."""
    enabled: bool
    textfile: str | None
    every_s: float


@dataclass(frozen=True)
class Device:
    """[device]: the card's and firmware's reads, the system's watchdog, the network's healer."""
    enabled: bool
    every_s: float
    hardware_watchdog: bool
    hardware_watchdog_s: int
    heal_network: bool
    heal_probe_s: float
    heal_confirm_s: float
    heal_wait_s: float

    @property
    def watchdog_s(self) -> int | None:
        """The system watchdog's period asked for, or None (off)."""
        return self.hardware_watchdog_s if self.hardware_watchdog else None

    @property
    def heals_network(self) -> bool:
        """The network's healer runs (device/heal.py): the part on, with heal_network."""
        return bool(self.enabled and self.heal_network)


@dataclass(frozen=True)
class Debug:
    """[debug]: what tests put in place (a stalled link, a sysfs of their own)."""
    stall_link_after_s: float | None
    link_max_wait_s: float | None
    sysfs_root: str | None

    @property
    def sysfs(self) -> str:
        return self.sysfs_root or "/sys"


# the section classes, by the name Config knows them by, and the policies inside them
SECTIONS = {"server": Server, "identity": Identity, "runtime": Runtime, "link": Link,
            "uploads": UploadPolicy, "events": Events, "watchdog": Watchdog,
            "commands": Commands, "hours": Hours, "screen": Screen, "update": Update,
            "fleet": Fleet, "log": Log, "metrics": Metrics, "device": Device,
            "debug": Debug}
POLICIES = {"link.liveness": LivenessPolicy, "link.backoff": BackoffPolicy,
            "link.keepalive": KeepalivePolicy, "link.idle": IdlePolicy}


@dataclass(frozen=True)
class Config:
    """What load() validated; the schema says where each value comes from and its default."""
    server: Server
    identity: Identity
    runtime: Runtime
    link: Link
    uploads: UploadPolicy
    events: Events
    watchdog: Watchdog
    commands: Commands
    hours: Hours
    screen: Screen
    update: Update
    fleet: Fleet
    log: Log
    metrics: Metrics
    device: Device
    debug: Debug
    source: str = ""
    # where each key's value came from: default (the schema), package (the package's
    # file), file (the operator's), fleet or env; load.ORIGINS says each in words
    origins: dict = field(default_factory=dict, compare=False, repr=False)
    fleet_revision: int | None = None      # the fleet's revision in force, if any
    fleet_problem: str | None = None       # why the overlay in the state directory was not used
    # numbers an earlier release took, moved to today's bounds: ((key, given, used), ...)
    adjusted: tuple = field(default=(), compare=False)

    @property
    def state_dir(self) -> str:
        """The agent's durable files, whichever part keeps them ([identity] state_dir)."""
        return self.identity.state_dir

    @property
    def status_path(self) -> str:
        return os.path.join(self.runtime.dir, status_file.NAME)

    @property
    def commands_path(self) -> str:
        return os.path.join(self.state_dir, COMMANDS_FILE)

    @property
    def queue_path(self) -> str:
        return os.path.join(self.state_dir, QUEUE_DIR)

    @property
    def schedule_path(self) -> str:
        return os.path.join(self.runtime.dir, "backoff.json")

    @property
    def metrics_path(self) -> str:
        """[metrics] textfile, or the runtime directory's sibling, <dir>-metrics
        (/run/edge-agent-metrics: root's, a small tmpfs of its own under systemd,
        programs/grants.py)."""
        return self.metrics.textfile or metrics_home(self.runtime.dir)


def metrics_home(runtime_dir: str) -> str:
    """The default textfile: edge-agent.prom in <runtime dir>-metrics, which root's start
    step alone makes, mounts and links (programs/grants.py)."""
    return os.path.join(runtime_dir.rstrip("/") + "-metrics", "edge-agent.prom")


def redact_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.username is None and parsed.password is None:
        return url
    host = parsed.hostname or ""
    if parsed.port:
        host += f":{parsed.port}"
    return parsed._replace(netloc=f"***@{host}").geturl()
