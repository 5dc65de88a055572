"""Command line: `edge-agent run`, `status`, `enqueue`, `unpair`, `check-config`, `doctor`,
`configured`."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from . import __version__
from .config import files as cfgfiles
from .app import status
from .base import status_file
from .base.fsutil import UnsafePath, drop_to_owner
from .base.upload_kinds import KINDS
from .base.text import clean
# Each command imports what it runs: `status`, run by every operator and monitoring
# script, reads a file and loads none of the link, the parts or their libraries, nor
# the configuration's schema and records (it finds its file with config/files.py).
if TYPE_CHECKING:
    from .config.model import Config

EXIT_OK, EXIT_DEGRADED, EXIT_USAGE, EXIT_NOT_RUNNING = 0, 1, 2, 3
# status: running, and no operator has claimed the screen yet (it shows a pairing code)
EXIT_UNCLAIMED = 4
STATUS_EXITS = """exit status:
  0  online and claimed
  1  degraded: claimed, but the link is not online, or storage is read-only or failed,
     or the token is only in memory
  3  not running (or no status file)
  4  running but unclaimed: waiting for an operator to enter the pairing code"""
EXIT_CRASHED = 70   # EX_SOFTWARE: a bug; systemd restarts the agent (Restart=always)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        sys.stderr.write(f"edge-agent: {message} (see edge-agent --help)\n")
        raise SystemExit(EXIT_USAGE)

    def format_help(self):
        if callable(self.epilog):   # read where it is shown: its module is not `status`'s
            self.epilog = self.epilog()
        return super().format_help()


def doctor_exits() -> str:
    """The doctor's exit statuses, as app/doctor.py holds them."""
    from .app.doctor import DOCTOR_EXITS
    return DOCTOR_EXITS


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="edge-agent",
                description="Keeps this screen linked to its fleet server and heals the link "
                            "when the network silently drops it.")
    p.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    conf_help = f"configuration file (default {cfgfiles.DEFAULT_PATH})"

    run = sub.add_parser("run", help="run the agent in the foreground (what systemd starts)")
    run.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)

    st = sub.add_parser("status", help="show the running agent's link state and whether the "
                                       "screen is claimed; exit 0 online, 1 degraded, "
                                       "3 not running, 4 unclaimed",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=STATUS_EXITS)
    st.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)
    st.add_argument("--json", action="store_true", help="print the raw status as JSON")

    enq = sub.add_parser("enqueue", help="queue a file for upload to the fleet server",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=ENQUEUE_EXITS)
    enq.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)
    enq.add_argument("--kind", required=True, choices=list(KINDS))
    enq.add_argument("--key", help="idempotency key (1 to 64 of A-Z a-z 0-9 . _ : -): an item "
                                   "whose key is queued or was sent in the last dedupe window "
                                   "is a duplicate; a proof-of-play record's \"play_id\" is its "
                                   "key; without one, every item is queued")
    enq.add_argument("file", help="the file to upload, or - for standard input")

    for name, text in (("unpair", "forget this device's credentials; the agent shows a new pairing code"),
                       ("enroll", "enroll again now: same as unpair, for a screen moved to another fleet")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)

    chk = sub.add_parser("check-config", help="validate the configuration, say what is in force "
                                              "(profile, proxy, CA) and where each value comes "
                                              "from, and check that the agent's user can read "
                                              "every file it names; exit 0 ok, 2 not")
    chk.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)

    # said by --help's list and by doctor --help (which keeps its line breaks, for the epilog)
    doctor_said = ("check each step now, in order (configuration, clock, DNS, route, TCP,\n"
                   "proxy, TLS, the upgrade, the server's kind, the token, the card's clone\n"
                   "check, storage, the display, the screen's means, the package repository):\n"
                   "what fails and what to do")
    doc = sub.add_parser("doctor", help=" ".join(doctor_said.split()), description=doctor_said,
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog=doctor_exits)
    doc.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)
    doc.add_argument("--json", action="store_true", help="print the steps as JSON, for scripts")

    cnd = sub.add_parser("configured", help="exit 0 if a fleet server url is set, 1 if not "
                                            "(systemd's ExecCondition: a fresh install waits "
                                            "for its configuration instead of failing)")
    cnd.add_argument("--config", default=cfgfiles.DEFAULT_PATH, help=conf_help)
    return p


def _load(path: str, env: dict | None = None) -> Config:
    from .base import logs
    from .config import load as cfgmod
    try:
        return cfgmod.load(path, env=env)
    except cfgmod.ConfigError as e:
        logs.early(f"edge-agent: config error: {e}")
        raise SystemExit(EXIT_USAGE)


def cmd_run(args) -> int:
    import gc
    import logging
    from .base import logs
    from .base.journal_fields import MessageId, journal
    from .identity.credentials import CredentialsUnreadable
    from .runtime import crashes
    from .settings.service import FleetSettings
    config = _load(args.config)
    logs.setup(config.log.level)
    crashes.prepare()
    settings = FleetSettings(config.identity.state_dir, config.fleet.proof_timeout_s)
    try:
        ended = settings.begin()
        if ended is not None:   # a revision the agent keeps dying on
            # a fresh start, so that root's ExecStartPre grants what the good one allows
            logging.getLogger("edge_agent").warning(
                "fleet settings revision %d rolled back: %s; restarting", ended.revision,
                ended.why, extra=journal(MessageId.SETTINGS_ROLLED_BACK, REVISION=ended.revision,
                                         EVENT="config.rolled-back"))
            return EXIT_DEGRADED
    except OSError as e:   # the count is lost, the deadline still holds
        logging.getLogger("edge_agent").error("cannot count this start on fleet settings "
                                              "on trial: %s", e.strerror)
    # No collection while the agent's modules and parts are made: all of it lives as long
    # as the process, so a collection then only walks it again and again (a tenth of a
    # start: scripts/bench, the startup row). Frozen after: later ones skip it too.
    gc.disable()
    try:
        from .app.daemon import Agent  # imports socketio; keep `status` light
        from .uploads.store import QueueUnavailable  # likewise
        try:
            agent = Agent(config, settings=settings)
        except QueueUnavailable as e:
            # not a configuration error: systemd restarts the agent, the queue is untouched
            logging.getLogger("edge_agent").error("upload queue unavailable: %s", e)
            return EXIT_DEGRADED
        except CredentialsUnreadable as e:
            # a failing card, not an unpaired screen: no new code, no pairing lost; systemd
            # starts the agent again (RestartSec) and the read is tried again
            logging.getLogger("edge_agent").error("%s: the card is failing; not pairing "
                                                  "again, trying again at the next start",
                                                  e.strerror)
            return EXIT_DEGRADED
    finally:
        gc.enable()
    gc.freeze()
    # DEVICE_ID fixed for the process; the id a server assigns, read per record, beside it
    logs.stamp_ids(agent.identity.ids.core.local_device_id, agent.identity.device_id)
    with crashes.watched_run(config.runtime.dir):
        code = agent.run()
    if agent.kind.restarting:   # built again for the server's kind: a fresh image, same process
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)
    return code


def cmd_doctor(args) -> int:
    import logging
    from .app import doctor, doctor_probes   # the link's libraries: off `status`'s path
    # the probes' own warnings (a screen source's, the link's) are for the agent's journal
    logging.getLogger("edge_agent").addHandler(logging.NullHandler())
    logging.getLogger("edge_agent").propagate = False
    steps, notes = doctor_probes.examine(args.config)
    if args.json:
        print(json.dumps(doctor.as_json(steps, notes), indent=1))
    else:
        print(doctor.render(steps, notes))
    return doctor.exit_status(steps)


def cmd_configured(args) -> int:
    """Only "no server url" means not configured. Any other problem is left to `run`,
    which fails the unit with the error in the journal: a typo must not pass for a
    screen that is merely waiting to be set up."""
    from .base import logs
    from .config import load as cfgmod
    try:
        cfgmod.load(args.config)
    except cfgmod.ConfigMissing as e:
        if e.key == "server.url":
            logs.early(f"edge-agent: not configured yet: set [server] url in {args.config} "
                       f"(or {cfgfiles.env_name('server', 'url')}), then "
                       f"systemctl restart edge-agent", priority=5)
            return EXIT_DEGRADED
    except Exception:  # a config error or a bug: `run` says which, loudly, not a skip
        pass
    return EXIT_OK


def cmd_status(args) -> int:
    # the runtime directory alone, from the layers the agent read it from; status must
    # work for an operator even if the configuration is unreadable to them
    path = cfgfiles.status_path(args.config)
    try:
        doc = status_file.read(path)
    except status_file.StatusFileError as e:
        sys.stderr.write(f"edge-agent: {clean(str(e))}\n")   # a path from the configuration
        return EXIT_NOT_RUNNING
    running, online = status.verdict(doc)
    if args.json:
        # the file's own figures are as of its updated_at; as_read, as of now
        print(json.dumps({**doc, "running": running, "claimed": status.claimed(doc),
                          "as_read": status.as_read(doc, running)}, indent=1, sort_keys=True))
    else:
        print(status.render(doc, running))
    if not running:
        return EXIT_NOT_RUNNING
    if status.claimed(doc) is False:
        return EXIT_UNCLAIMED
    return EXIT_OK if online else EXIT_DEGRADED


# enqueue: 0 means stored (on the card, synced); every refusal has its own status
EXIT_UNAVAILABLE, EXIT_TOO_LARGE, EXIT_DISK_LOW, EXIT_QUEUE_FULL, EXIT_DUPLICATE = 1, 4, 5, 6, 7
# a refusal's reason (uploads/store.py, QueueRefused.reason) -> its status and its words
ENQUEUE_REFUSALS = {"too-large": (EXIT_TOO_LARGE, "too large"),
                    "disk-low": (EXIT_DISK_LOW, "disk low"),
                    "full": (EXIT_QUEUE_FULL, "queue full"),
                    "duplicate": (EXIT_DUPLICATE, "duplicate")}
ENQUEUE_EXITS = """exit status:
  0  queued: on the card, kept through restarts and power cuts
  1  the queue is unavailable (locked, unreadable, a link in its place, a failing card)
  2  usage: a bad argument or key, an unreadable file, a shape the server would drop
  4  too large for one upload
  5  the state partition is (nearly) full
  6  the queue is full of items that outrank this kind
  7  a duplicate: an item with this key is queued or was sent recently"""


def _profile_text(config, came: str) -> str:
    """The profile, and where it came from: the file, or the server's own answers."""
    from .identity import kind_record
    choice = kind_record.chosen(config.server, config.identity.state_dir)
    if choice.how == "configured":
        return f"{choice.profile} ({came})"
    if choice.how == "recorded":
        return f"auto ({came}): {choice.profile}, detected at an earlier start ({choice.why})"
    return (f"auto ({came}): not known yet for this url; the agent asks the server at its "
            f"start (GET /api/version, POST /api/v1/enroll) and keeps the answer")


def cmd_enqueue(args) -> int:
    import logging
    import signal
    from .identity import kind_record
    from .link.profiles import PROFILES, uncarried
    config = _load(args.config)
    profile = kind_record.chosen(config.server, config.identity.state_dir).profile
    refusal = uncarried(PROFILES[profile], args.kind)
    if refusal:
        sys.stderr.write(f"edge-agent: --kind: {refusal}\n")
        return EXIT_USAGE
    # the answer is the one line below; the store's own warnings are for the agent's journal
    logging.getLogger("edge_agent").addHandler(logging.NullHandler())
    # the queue's modules are heavy: imported here, off `status`'s path
    from .uploads.store import QueueDiskFull, QueueRefused, QueueStore, QueueUnavailable
    try:  # read as the caller (root may queue its own files), before dropping to the agent
        limit = min(config.uploads.max_bytes, config.uploads.max_item_bytes)
        if args.file == "-":
            payload = sys.stdin.buffer.read(limit + 1)
        else:
            with open(args.file, "rb") as f:
                payload = f.read(limit + 1)
    except OSError as e:
        sys.stderr.write(f"edge-agent: {args.file}: {e.strerror}\n")
        return EXIT_USAGE
    try:
        problem = PROFILES[profile].enqueue_problem(args.kind, payload)
    except RecursionError:   # JSON nested thousands deep: one line, not a traceback
        problem = "a JSON record nested too deeply to read"
    if problem:
        sys.stderr.write(f"edge-agent: {args.kind}: {problem} (the {profile} server "
                         f"would drop it unread); nothing was queued\n")
        return EXIT_USAGE
    try:
        # root writes nothing in the agent's directory that the agent's user could not
        drop_to_owner(config.identity.state_dir)
    except (UnsafePath, OSError) as e:
        sys.stderr.write(f"edge-agent: {e}; nothing was queued\n")
        return EXIT_UNAVAILABLE
    try:
        store = QueueStore(config.queue_path, config.uploads)
        try:
            item_id = store.add(args.kind, payload, key=args.key)
        finally:
            store.close()
    except ValueError as e:   # the key (--key, a record's play_id) breaks the key rule
        sys.stderr.write(f"edge-agent: {e}; nothing was queued\n")
        return EXIT_USAGE
    except QueueRefused as e:
        code, what = ENQUEUE_REFUSALS[e.reason]
        sys.stderr.write(f"edge-agent: not queued ({what}): {e}\n")
        return code
    except QueueDiskFull:
        sys.stderr.write("edge-agent: not queued (disk full): the state partition is full\n")
        return EXIT_DISK_LOW
    except QueueUnavailable as e:
        sys.stderr.write(f"edge-agent: the upload queue is unavailable ({e}); nothing was queued\n")
        return EXIT_UNAVAILABLE
    except OSError as e:
        sys.stderr.write(f"edge-agent: {config.queue_path}: {e.strerror}; nothing was queued\n")
        return EXIT_UNAVAILABLE
    print(item_id)
    # wake the running agent's worker; if none runs, it sends at its next start
    _signal_agent(config, signal.SIGUSR1)
    return EXIT_OK


def _signal_agent(config: Config, signum: int) -> bool:
    """``signum`` to the running agent (the pid in its status file); False: none runs."""
    try:
        pid = status_file.read(config.status_path).get("pid")
        if status.pid_alive(pid):
            os.kill(pid, signum)
            return True
    except (status_file.StatusFileError, OSError):
        pass
    return False


def cmd_unpair(args) -> int:
    import signal
    from .config import overlay as fleet_store
    from .identity.credentials import Credentials
    config = _load(args.config)
    if config.identity.token is not None:
        sys.stderr.write("edge-agent: this device has a pre-provisioned token in the "
                         "configuration ([identity] token); remove it to enroll\n")
        return EXIT_USAGE
    try:
        # as the agent's user: root deletes nothing there that it could not
        drop_to_owner(config.identity.state_dir)
        Credentials(config.identity.state_dir).clear()
        # the fleet's settings, and the revision numbers that are their floor, go with the
        # pairing: a number someone sent in the fleet's name cannot lock out the next fleet
        fleet_store.remove(config.identity.state_dir)
    except UnsafePath as e:
        sys.stderr.write(f"edge-agent: {e}; nothing was removed\n")
        return EXIT_UNAVAILABLE
    except OSError as e:
        sys.stderr.write(f"edge-agent: {config.identity.state_dir}: {e.strerror}\n")
        return EXIT_USAGE
    if _signal_agent(config, signal.SIGUSR2):
        print("credentials and the fleet's settings removed; the agent is requesting a "
              "new pairing code (the fleet's settings leave it at its next start)")
        return EXIT_OK
    print("credentials and the fleet's settings removed; the agent will enroll when it starts")
    return EXIT_OK


def cmd_check_config(args) -> int:
    from .app import unit_env
    from .config import load as cfgmod
    unit = unit_env.read()   # what systemd gives the agent, not this shell's (#50.2)
    config = _load(args.config, unit.over(os.environ))
    print(f"{config.source}: ok (device {config.identity.device_id or 'derived'}, server {config.server.display})")
    code = _say_in_force(config, unit)
    for adjusted in config.adjusted:
        print(f"{config.source}: adjusted: {cfgmod.adjustment_text(*adjusted)} "
              f"(a value an earlier release took; set it within today's bounds)")
    if config.fleet_problem:
        # the file is fine and runs alone; the overlay's damage is said, not a failure
        print(f"fleet settings not applied: {config.fleet_problem}; the local file alone "
              f"is in force")
    return code


def _say_in_force(config: Config, unit) -> int:
    """What is in force and where each value comes from; then whether the agent's user
    can read every file named. EXIT_OK or EXIT_USAGE."""
    from .config import load as cfgmod
    origins = config.origins

    def came(key: str) -> str:
        return cfgmod.ORIGINS[origins.get(key, "default")]

    egress = config.server.egress
    proxy = egress.proxy
    if proxy is None:
        proxy_text = "none: every connection goes direct"
    elif origins.get("network.proxy") not in (None, "default"):
        proxy_text = f"{proxy.display} ({came('network.proxy')}, network.proxy)"
    else:   # in no file: the environment the unit gives the agent
        name = proxy.source.split(' ')[0]
        proxy_text = f"{proxy.display} ({name}, from {unit.origin(name)})"
    if proxy is not None and egress.no_proxy:
        proxy_text += f"; direct to {', '.join(egress.no_proxy)}"
    if egress.ca_file:
        count = cfgmod.ca_certificates(egress.ca_file)
        ca_text = (f"{egress.ca_file} ({came('server.ca_file')}): {count} PEM "
                   f"certificate{'s' if count != 1 else ''}, in place of the system's CA "
                   f"store for every connection the agent makes")
    else:
        ca_text = "the system's CA store (server.ca_file unset)"
    print(f"  profile   {_profile_text(config, came('server.profile'))}")
    print(f"  server    {config.server.display} ({came('server.url')})")
    print(f"  proxy     {proxy_text}")
    print(f"  ca        {ca_text}")
    if egress.client_cert:
        print(f"  client    {egress.client_cert}"
              + (f" with {egress.client_key}" if egress.client_key else "")
              + f" ({came('network.client_cert')})")
    if "screenshot" in config.commands.allow:
        # as this shell's environment shows the screen (the unit's may name its display)
        from .screen.part import screenshot_means
        how, why = screenshot_means(config, dict(os.environ))
        print(f"  screenshot  {how}" if how else
              f"  screenshot  none (not offered to the server): {why}")
    set_here: dict[str, list[str]] = {}
    for key, origin in sorted(origins.items()):
        set_here.setdefault(origin, []).append(key)
    for origin in ("package", "file", "fleet", "env"):
        if set_here.get(origin):
            print(f"  from {cfgmod.ORIGINS[origin]}: {', '.join(set_here[origin])}")
    print(f"  every other key: its {cfgmod.ORIGINS['default']}")
    print(f"  environment  {unit.said()}")
    for note in unit.notes:
        print(f"  environment  {note}")
    return _check_readable(config)


def _check_readable(config: Config) -> int:
    """Every file the configuration names, as the agent's user opens it."""
    from .base import access
    named = {key: path for key, path in (
        ("the configuration", config.source),
        ("server.ca_file", config.server.egress.ca_file),
        ("network.client_cert", config.server.egress.client_cert),
        ("network.client_key", config.server.egress.client_key)) if path and path != "-"}
    if os.path.exists(cfgfiles.VENDOR_PATH):
        named["the package's defaults"] = cfgfiles.VENDOR_PATH
    try:
        how, problems = access.check(named)
    except LookupError as e:
        print(f"  readable  not checked: {e} (the package makes the user {access.AGENT_USER})")
        return EXIT_OK
    for key, why in problems.items():
        sys.stderr.write(f"edge-agent: config error: {key}: {named[key]}: {why} "
                         f"(checked {how})\n")
    if problems:
        return EXIT_USAGE
    print(f"  readable  by {access.AGENT_USER}: every file named here (checked {how})")
    return EXIT_OK


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    handlers = {"run": cmd_run, "status": cmd_status, "check-config": cmd_check_config,
                "enqueue": cmd_enqueue, "unpair": cmd_unpair, "enroll": cmd_unpair,
                "configured": cmd_configured, "doctor": cmd_doctor}
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        # a bug: one line a person (and `journalctl -p err`) can act on, the exception
        # and where it was raised, never a traceback on the terminal; the installer
        # tells the fleet this line when a release crash-loops
        from .base import logs
        logs.early(f"edge-agent {args.command}: crashed: {logs.crash_line(e)}", 3)
        return EXIT_CRASHED


if __name__ == "__main__":
    raise SystemExit(main())
