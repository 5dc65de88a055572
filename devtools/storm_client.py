"""Many agents in one process, for the fleet reconnect-storm benchmark.

Each is the agent's real link (LinkRunner: core, backoff, watchdog, Socket.IO
transport) with its own device id; only the daemon around it (systemd, uploads,
udev) is left out, as it plays no part in when a device reconnects. Each has the
daemon's events outbox and sender on the link's port, so a device event raised
(SIGUSR1) is held until the server ACKs it, as the daemon's are.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time

from agent.config import load as cfgmod
from agent.events.model import Event
from agent.events.outbox import Outbox
from agent.events.sender import EventSender
from agent.link import protocol
from agent.link.profiles import PROFILES, ProfileContext
from agent.link.runner import LinkRunner, Settings
from devtools.stock_client import raise_on


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="agent TOML: server url and [link] settings")
    p.add_argument("--first", type=int, required=True, help="number of the first device")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--ramp-s", type=float, default=5.0, help="spread the first connects over this")
    p.add_argument("--prefix", default="storm-", help="device ids are this and the number")
    p.add_argument("--log-level", default="ERROR")
    p.add_argument("--no-race", action="store_true",
                   help="never race a connect with a second dial (the behaviour before it)")
    p.add_argument("--no-drain", action="store_true",
                   help="ignore the server's server:drain (the behaviour before it: cut at "
                        "the drain's end, then the reconnect)")
    p.add_argument("--raise-file", metavar="FILE",
                   help="SIGUSR1 raises a device event on the screens whose ids are lines of "
                        "FILE (every screen where FILE is absent)")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(message)s")
    config = cfgmod.load(args.config, env={})
    runners, outboxes = [], {}
    for i in range(args.first, args.first + args.count):
        device = (f"{args.prefix}{i:04d}", "t")
        profile = PROFILES[config.server.profile](ProfileContext(
            device_id=lambda device=device: device[0], token=lambda device=device: device[1]))
        if args.no_drain:
            profile.handlers = _without_drain(profile.handlers)
        runners.append(LinkRunner(Settings(config.link, config.server, config.debug,
                                           race=not args.no_race), profile=profile,
                                  identity=lambda device=device: device))
        outboxes[device[0]] = _events(runners[-1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def raise_events(*_):
        chosen = raise_on(args.raise_file)
        now = time.time()
        for device_id, outbox in outboxes.items():
            if chosen is None or device_id in chosen:
                # put from a thread of its own: the sender's lock may be held by the
                # thread this handler interrupted
                threading.Thread(target=outbox.put,
                                 args=(Event("display.disconnected", now),)).start()
    signal.signal(signal.SIGUSR1, raise_events)
    for n, runner in enumerate(runners):
        threading.Thread(target=runner.run, daemon=True,
                         name=runner.identity()[0]).start()
        time.sleep(args.ramp_s / max(1, len(runners)))
    stop.wait()
    return 0


def _events(runner: LinkRunner) -> Outbox:
    """The daemon's events path (events/part.py) on one screen's link: an outbox whose
    events go once the link is proven and leave it only on the server's ACK."""
    sender: list[EventSender] = []
    outbox = Outbox(on_put=lambda: sender[0].flush())
    sender.append(EventSender(outbox, runner.pipe))
    return outbox


def _without_drain(handlers):
    def without(post):
        return {k: v for k, v in handlers(post).items() if k != protocol.DRAIN}
    return without


if __name__ == "__main__":
    sys.exit(main())
