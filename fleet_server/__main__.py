"""`scripts/fleet-server`: run the reference fleet server on loopback."""
from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from fleet_server.behaviour import Behaviour
from fleet_server.cluster_node import WINDOW_MAX_S, RebalanceSettings
from fleet_server.rebalance import TOLERANCE
from fleet_server.server import FleetServer
from fleet_server.serving import serve_until_stopped


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="fleet-server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8470, help="0 picks a free port")
    p.add_argument("--port-file", help="write the bound port here once listening")
    p.add_argument("--device", action="append", default=[], metavar="ID:TOKEN",
                   help="a pre-provisioned device (repeatable)")
    p.add_argument("--accept-any", action="store_true", help="accept any device and token")
    p.add_argument("--ping-interval", type=float, default=25.0)
    p.add_argument("--ping-timeout", type=float, default=20.0)
    p.add_argument("--heartbeat-timeout", type=float, default=45.0)
    p.add_argument("--ack-delay", type=float, default=0.0)
    p.add_argument("--connect-delay", type=float, default=0.0)
    p.add_argument("--profile", default="edge-agent", choices=["edge-agent", "screentinker"],
                   help="screentinker emulates ScreenTinker's device protocol on /device")
    p.add_argument("--reconnect-window", type=float, default=0.0, metavar="SECONDS",
                   help="tell devices to spread their reconnects over this long after "
                        "losing this server (server:reconnect-window)")
    p.add_argument("--drain-window", type=float, default=0.0, metavar="SECONDS",
                   help="on SIGTERM, tell every device server:drain with this window, stop "
                        "taking connections, and serve on until each has moved (at most "
                        "the window and 2 s); 0: stop at once")
    p.add_argument("--reuse-port", action="store_true",
                   help="SO_REUSEPORT: another fleet-server may listen on the same port "
                        "(a deploy on one host: the new one takes over while this one drains)")
    p.add_argument("--record", metavar="FILE",
                   help="on exit, write the devices table as /admin/devices shows it here "
                        "(a node that stopped can still be read: the tests' deploys)")
    p.add_argument("--redis", metavar="URL",
                   help="run as one node of a cluster: Socket.IO emits go through this Redis "
                        "(redis://127.0.0.1:6379/0) to whichever node holds the device")
    p.add_argument("--rebalance", type=float, default=0.0, metavar="SECONDS",
                   help="with --redis: share this node's live device count with the other "
                        "nodes, and when it holds more than its fair share (beyond "
                        "--rebalance-tolerance) ask only the excess to move, make before "
                        "break, within this window (server:drain); 0: never")
    p.add_argument("--rebalance-settle", type=float, default=5.0, metavar="SECONDS",
                   help="a node newly seen is trusted after this long (the balancer's health "
                        "check must have taken it in), and after asking moves a node judges "
                        "again after the window and this")
    p.add_argument("--rebalance-tolerance", type=float, default=TOLERANCE, metavar="FRACTION",
                   help="how far above its fair share a node may be before it asks moves")
    p.add_argument("--ack-mode", default="ok", choices=["ok", "none", "wrong-seq", "garbage"],
                   help="how heartbeats are answered; none is an old server")
    args = p.parse_args(argv)
    tokens = {}
    for item in args.device:
        device_id, sep, token = item.partition(":")
        if not sep or not device_id or not token:
            p.error(f"--device: expected ID:TOKEN, got {item!r}")
        tokens[device_id] = token
    if args.rebalance:
        if not args.redis:
            p.error("--rebalance: needs --redis (the nodes share their counts there)")
        if args.profile != "edge-agent":
            p.error("--rebalance: the edge-agent profile only (ScreenTinker has no drain)")
        if not 0 < args.rebalance <= WINDOW_MAX_S:
            p.error(f"--rebalance: a window of 0 to {WINDOW_MAX_S:g} s, got {args.rebalance:g}")
        if not 0 <= args.rebalance_settle <= 3600:
            p.error(f"--rebalance-settle: 0 to 3600 s, got {args.rebalance_settle:g}")
        if not 0 <= args.rebalance_tolerance <= 1:
            p.error(f"--rebalance-tolerance: 0 to 1, got {args.rebalance_tolerance:g}")
    return args, tokens


async def serve(args, tokens) -> None:
    server = FleetServer(tokens, accept_any=args.accept_any, ping_interval=args.ping_interval,
                         ping_timeout=args.ping_timeout, profile=args.profile,
                         behaviour=Behaviour(ack_mode=args.ack_mode, ack_delay_s=args.ack_delay,
                                             connect_delay_s=args.connect_delay,
                                             heartbeat_timeout_s=args.heartbeat_timeout,
                                             reconnect_window_s=args.reconnect_window,
                                             drain_window_s=args.drain_window),
                         redis_url=args.redis,
                         rebalance=RebalanceSettings(args.rebalance, args.rebalance_settle,
                                                     args.rebalance_tolerance)
                         if args.rebalance else None)
    await serve_until_stopped(
        server.app, args.host, args.port, args.port_file,
        lambda port: logging.getLogger("fleet_server").info(
            "fleet server listening on http://%s:%d", args.host, port),
        drain=server.drain, reuse_port=args.reuse_port)
    if args.record:
        now = time.monotonic()
        tmp = args.record + ".tmp"
        with open(tmp, "w") as f:
            json.dump({d: dev.view(now) for d, dev in server.registry.devices.items()}, f)
        os.replace(tmp, args.record)


def pair(argv) -> int:
    """`fleet-server pair CODE`: what an operator types after reading the screen."""
    p = argparse.ArgumentParser(prog="fleet-server pair")
    p.add_argument("code")
    p.add_argument("--url", default="http://127.0.0.1:8470")
    p.add_argument("--operator", default=os.environ.get("USER", "operator"))
    args = p.parse_args(argv)
    req = urllib.request.Request(args.url + "/api/v1/pair", data=json.dumps({"code": args.code}).encode(),
                                 headers={"Content-Type": "application/json", "X-Operator": args.operator})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        print(f"fleet-server pair: {json.loads(e.read() or b'{}').get('error', e.reason)}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"fleet-server pair: {e}", file=sys.stderr)
        return 1
    print(f"paired device {body['device_id']}")
    return 0


def _duration(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _revision(sets: list[str], expiries: list[str], revision: int | None) -> dict:
    settings: dict = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            settings[key] = json.loads(text)
        except ValueError:
            settings[key] = text
    for item in expiries:
        key, sep, text = item.partition("=")
        if key not in settings:
            raise ValueError(f"--expire: {key!r} is not a --set key")
        settings[key] = {"value": settings[key], "expires_in_s": _duration(text)}
    return {"settings": settings, **({"revision": revision} if revision else {})}


def command(argv) -> int:
    """`fleet-server command DEVICE NAME [...]`: ask a screen to act, wait, print the result."""
    p = argparse.ArgumentParser(prog="fleet-server command")
    p.add_argument("device_id")
    p.add_argument("name", help="diagnostics | logs | screenshot | display | restart-agent | reboot "
                                    "| configure | shell | set-time | set-timezone | ... "
                                    "(update has its own: fleet-server update)")
    p.add_argument("--since", type=_duration, help="logs: how far back (30m, 1h, 2d)")
    p.add_argument("--priority", type=int, help="logs: the least important priority (0-7)")
    p.add_argument("--state", choices=["on", "off"], help="display: on or off")
    p.add_argument("--cmd", help="shell: the one line to run")
    p.add_argument("--time", help="set-time: ISO 8601 with its offset, or epoch seconds")
    p.add_argument("--zone", help="set-timezone: an IANA zone such as Europe/Berlin")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="configure: a setting (the value as JSON, else a string), repeatable")
    p.add_argument("--expire", action="append", default=[], metavar="KEY=DURATION",
                   help="configure: that setting leaves after this long (1h, 30m)")
    p.add_argument("--revision", type=int, help="configure: the revision (default: the next)")
    p.add_argument("--expires-in", type=float, default=300.0)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the result")
    p.add_argument("--url", default="http://127.0.0.1:8470")
    a = p.parse_args(argv)
    when = a.time
    if when is not None and when.lstrip("-").replace(".", "", 1).isdigit():
        when = float(when)   # epoch seconds; anything else goes as text, checked by the screen
    args = {k: v for k, v in (("since_s", a.since), ("priority", a.priority),
                              ("state", a.state), ("cmd", a.cmd), ("time", when),
                              ("zone", a.zone)) if v is not None}
    if a.name == "configure":
        try:
            args = _revision(a.set, a.expire, a.revision)
        except ValueError as e:
            p.error(str(e))

    def call(path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(a.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.read()

    try:
        record = json.loads(call("/api/v1/commands", {"device_id": a.device_id, "name": a.name,
                                                      "args": args, "expires_in_s": a.expires_in}))
        deadline = time.monotonic() + a.wait
        result = None
        while time.monotonic() < deadline and result is None:
            time.sleep(0.2)
            result = json.loads(call(f"/api/v1/devices/{a.device_id}/commands"))[record["id"]]["result"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        print(f"fleet-server command: {e}", file=sys.stderr)
        return 1
    if result is None:
        print(f"fleet-server command: no result within {a.wait:.0f}s (command {record['id']} "
              "stays queued for the device)", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, sort_keys=True))
    if result.get("ok") and a.name == "logs" and result.get("upload_id"):
        path = f"/admin/uploads/{a.device_id}/{result['upload_id']}/content"
        while True:  # the bundle travels through the device's upload queue
            try:
                lines = gzip.decompress(call(path)).decode().splitlines()
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    print("fleet-server command: the log bundle has not arrived yet",
                          file=sys.stderr)
                    return 1
                time.sleep(0.2)
        for line in lines:
            entry = json.loads(line)
            stamp = time.strftime("%H:%M:%S", time.localtime(entry["ts"]))
            print(f"{stamp} <{entry['priority']}> {entry['message']}")
    return 0 if result.get("ok") else 2


def update(argv) -> int:
    """`fleet-server update DEVICE PACKAGE.deb --signature PACKAGE.deb.sig`: publish a
    signed package, ask the screen to install it, wait for the outcome."""
    p = argparse.ArgumentParser(prog="fleet-server update")
    p.add_argument("device_id")
    p.add_argument("package", help="the edge-agent .deb")
    p.add_argument("--signature", required=True,
                   help="its detached signature (gpg --detach-sign, by a key the screens trust)")
    p.add_argument("--window", type=_duration, default=0,
                   help="install at a random moment within this (30m, 2h): 0 is now")
    p.add_argument("--retry", action="store_true",
                   help="install even a version that was rolled back on this screen")
    p.add_argument("--expires-in", type=float, default=300.0)
    p.add_argument("--wait", type=_duration, default=900,
                   help="how long to wait for the outcome (the window, the download, the "
                        "install and the proof)")
    p.add_argument("--url", default="http://127.0.0.1:8470")
    a = p.parse_args(argv)
    try:
        with open(a.package, "rb") as f:
            package = f.read()
        with open(a.signature, "rb") as f:
            signature = f.read()
        version = subprocess.run(["dpkg-deb", "-f", a.package, "Version"], capture_output=True,
                                 text=True, check=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        print(f"fleet-server update: {e}", file=sys.stderr)
        return 1

    def call(path, body=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(a.url + path, data=data, headers={
            "Content-Type": "application/octet-stream" if raw is not None else "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    try:
        release = call("/api/v1/releases", raw=package)
        args = {"version": version, "url": release["url"], "size": release["size"],
                "sha256": release["sha256"], "signature": base64.b64encode(signature).decode(),
                "window_s": a.window, "retry": a.retry}
        record = call("/api/v1/commands", {"device_id": a.device_id, "name": "update",
                                           "args": args, "expires_in_s": a.expires_in})
        print(f"published {version} ({release['size']} bytes, sha256 {release['sha256'][:12]}); "
              f"asked {a.device_id} to install it (command {record['id']})", file=sys.stderr)
        deadline = time.monotonic() + a.wait
        result = None
        while time.monotonic() < deadline and result is None:
            time.sleep(0.5)
            result = call(f"/api/v1/devices/{a.device_id}/commands")[record["id"]]["result"]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        print(f"fleet-server update: {e}", file=sys.stderr)
        return 1
    if result is None:
        print(f"fleet-server update: no outcome within {a.wait}s (command {record['id']})",
              file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0 if result.get("ok") else 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "pair":
        return pair(argv[1:])
    if argv and argv[0] == "command":
        return command(argv[1:])
    if argv and argv[0] == "update":
        return update(argv[1:])
    args, tokens = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s fleet-server %(message)s")
    asyncio.run(serve(args, tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
