"""Many agents in one process, for the fleet reconnect-storm benchmark.

Each is the agent's real link (LinkRunner: core, backoff, watchdog, Socket.IO
transport) with its own device id; only the daemon around it (systemd, uploads,
udev) is left out, as it plays no part in when a device reconnects.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import threading
import time

from agent.config import load as cfgmod
from agent.link.runner import LinkRunner


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
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(message)s")
    base = cfgmod.load(args.config, env={})
    runners = []
    for i in range(args.first, args.first + args.count):
        cfg = dataclasses.replace(base, identity=dataclasses.replace(
            base.identity, device_id=f"{args.prefix}{i:04d}", token="t"))
        runners.append(LinkRunner(cfg, race=not args.no_race))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for n, runner in enumerate(runners):
        threading.Thread(target=runner.run, daemon=True,
                         name=runner.config.identity.device_id).start()
        time.sleep(args.ramp_s / max(1, len(runners)))
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
