"""The baselines: a stock python-socketio client, as signage players use it today.

Default: library defaults (automatic reconnection, polling then websocket upgrade)
and an app-level heartbeat every 15 s, fire-and-forget and guarded by
``sio.connected``, like the field reports' players. SIGUSR1 raises a device event,
sent the same way. ``--acked`` is the footprint baseline: websocket only, the
heartbeat with an ACK callback and nothing else; with ``--card`` it imports the design
card's other packages too (requests, sdnotify, psutil, pyudev: issue #51's bare client).
Prints one JSON line per link event.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import socketio


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--device-id", default="stock-1")
    p.add_argument("--token", default="t")
    p.add_argument("--heartbeat", type=float, default=15.0)
    p.add_argument("--acked", action="store_true", help="websocket, heartbeat with an ACK")
    p.add_argument("--card", action="store_true",
                   help="import the design card's packages too (requests, sdnotify, psutil, pyudev)")
    args = p.parse_args(argv)
    if args.card:
        import psutil, pyudev, requests, sdnotify  # noqa: F401,E401
    sio = socketio.Client()
    seq = [0]
    events = [0]

    def say(event, **kw):
        print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)

    def beat():
        if sio.connected:
            seq[0] += 1
            callback = (lambda *_: None) if args.acked else None
            sio.emit("device:heartbeat", {"seq": seq[0], "ts": time.time()}, callback=callback)

    def raise_event(*_):
        events[0] += 1
        say("raised", id=events[0])
        if sio.connected:
            threading.Thread(target=sio.emit, args=("device:event", {
                "id": events[0], "type": "display.disconnected", "ts": time.time()})).start()

    signal.signal(signal.SIGUSR1, raise_event)

    @sio.event
    def connect():
        say("connect")
        beat()

    @sio.event
    def disconnect(*_):
        say("disconnect")

    def heartbeat_loop():
        while True:
            time.sleep(args.heartbeat)
            try:
                beat()
            except Exception:
                pass

    threading.Thread(target=heartbeat_loop, daemon=True).start()
    transports = ["websocket"] if args.acked else None
    while True:
        try:
            sio.connect(args.url, auth={"device_id": args.device_id, "token": args.token},
                        transports=transports)
            break
        except socketio.exceptions.ConnectionError:
            time.sleep(1)
    sio.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
