"""The baselines: a stock python-socketio client, as signage players use it today.

Default: library defaults (automatic reconnection, polling then websocket upgrade)
and an app-level heartbeat every 15 s, fire-and-forget and guarded by
``sio.connected``, like the field reports' players. SIGUSR1 raises a device event,
sent the same way. ``--acked`` is the footprint baseline: websocket only, the
heartbeat with an ACK callback and nothing else; with ``--card`` it imports the design
card's other packages too (requests, sdnotify, psutil, pyudev: issue #51's bare client).
``--count N``: N such players in one process (a fleet for the cluster bench), each its
own socketio.Client and device id (DEVICE-ID-0000 on), nothing shared but the process.
Prints one JSON line per link event.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

import socketio

_print = threading.Lock()


class Player:
    """One stock player: its own client, heartbeat thread and events."""

    def __init__(self, args, device_id: str):
        self.args, self.device_id = args, device_id
        self.sio = socketio.Client()
        self.seq = 0
        self.events = 0
        self.sio.on("connect", lambda: (self.say("connect"), self.beat()))
        self.sio.on("disconnect", lambda *_: self.say("disconnect"))

    def say(self, event, **kw):
        line = json.dumps({"event": event, "t": time.time(), "device": self.device_id, **kw})
        with _print:
            print(line, flush=True)

    def beat(self):
        if self.sio.connected:
            self.seq += 1
            callback = (lambda *_: None) if self.args.acked else None
            self.sio.emit("device:heartbeat", {"seq": self.seq, "ts": time.time()},
                          callback=callback)

    def raise_event(self):
        self.events += 1
        self.say("raised", id=self.events)
        if self.sio.connected:
            threading.Thread(target=self.sio.emit, args=("device:event", {
                "id": self.events, "type": "display.disconnected", "ts": time.time()})).start()

    def heartbeat_loop(self):
        while True:
            time.sleep(self.args.heartbeat)
            try:
                self.beat()
            except Exception:
                pass

    def run(self):
        threading.Thread(target=self.heartbeat_loop, daemon=True).start()
        transports = ["websocket"] if self.args.acked else None
        while True:
            try:
                self.sio.connect(self.args.url, auth={"device_id": self.device_id,
                                                      "token": self.args.token},
                                 transports=transports)
                break
            except socketio.exceptions.ConnectionError:
                time.sleep(1)
        self.sio.wait()


def raise_on(raise_file: str | None) -> set | None:
    """The device ids a SIGUSR1 raises an event on: the lines of ``raise_file``, or
    None (every one) where there is no such file."""
    if raise_file:
        try:
            return set(Path(raise_file).read_text().split())
        except OSError:
            pass
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--device-id", default="stock-1")
    p.add_argument("--token", default="t")
    p.add_argument("--heartbeat", type=float, default=15.0)
    p.add_argument("--acked", action="store_true", help="websocket, heartbeat with an ACK")
    p.add_argument("--card", action="store_true",
                   help="import the design card's packages too (requests, sdnotify, psutil, pyudev)")
    p.add_argument("--count", type=int, default=1,
                   help="players in this process; above 1 their ids are DEVICE-ID-0000 on")
    p.add_argument("--ramp-s", type=float, default=0.0, help="spread the first connects over this")
    p.add_argument("--raise-file", metavar="FILE",
                   help="SIGUSR1 raises an event on the players whose ids are lines of FILE "
                        "(every player where FILE is absent)")
    args = p.parse_args(argv)
    if args.card:
        import psutil, pyudev, requests, sdnotify  # noqa: F401,E401
    ids = ([args.device_id] if args.count == 1
           else [f"{args.device_id}-{n:04d}" for n in range(args.count)])
    players = [Player(args, d) for d in ids]

    def raise_events(*_):
        chosen = raise_on(args.raise_file)
        for player in players:
            if chosen is None or player.device_id in chosen:
                player.raise_event()

    signal.signal(signal.SIGUSR1, raise_events)
    for player in players[1:]:
        threading.Thread(target=player.run, daemon=True, name=player.device_id).start()
        time.sleep(args.ramp_s / len(players))
    players[0].run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
