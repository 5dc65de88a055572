"""The baseline: a stock python-socketio client, as signage players use it today.

Library defaults (automatic reconnection, polling then websocket upgrade) and an
app-level heartbeat every 15 s, fire-and-forget and guarded by ``sio.connected``,
like the field reports' players. Prints one JSON line per link event.
"""
from __future__ import annotations

import argparse
import json
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
    p.add_argument("--fixed-reconnect-delay", type=float, default=None,
                   help="no backoff, no jitter: the storm baseline")
    args = p.parse_args(argv)
    kw = {}
    if args.fixed_reconnect_delay is not None:
        kw = dict(reconnection_delay=args.fixed_reconnect_delay,
                  reconnection_delay_max=args.fixed_reconnect_delay, randomization_factor=0)
    sio = socketio.Client(**kw)
    seq = [0]

    def say(event):
        print(json.dumps({"event": event, "t": time.time()}), flush=True)

    def beat():
        if sio.connected:
            seq[0] += 1
            sio.emit("device:heartbeat", {"seq": seq[0], "ts": time.time()})

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
    while True:
        try:
            sio.connect(args.url, auth={"device_id": args.device_id, "token": args.token})
            break
        except socketio.exceptions.ConnectionError:
            time.sleep(1)
    sio.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
