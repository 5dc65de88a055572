"""The demo: a local fleet server, one agent, and a silent drop healed, end to end.

Runs in a private network namespace (root needed, as for the tests), so the forced
drop is a real nftables DROP of the live TCP flow: no FIN, no RST, the kind of
failure a firewall or DPI box inflicts on a signage player.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.harness import REPO, AgentProcess, FleetServerProcess, agent_config, wait_for
from devtools.netns import NetNS


def say(text: str) -> None:
    print(f"\033[1m[demo]\033[0m {text}" if sys.stdout.isatty() else f"[demo] {text}", flush=True)


def follow(path: Path, offset: int, prefix: str) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return offset
    for line in data[offset:].decode(errors="replace").splitlines():
        print(f"    {prefix} {line}", flush=True)
    return len(data)


def _write(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


def _pi_tree(root: Path) -> None:
    """The sysfs attribute files of a Raspberry Pi with one HDMI screen attached."""
    for rel, value in (("class/drm/card1-HDMI-A-1/status", "connected"),
                       ("class/hwmon/hwmon0/name", "rpi_volt"),
                       ("class/hwmon/hwmon0/in0_lcrit_alarm", "0"),
                       ("class/net/lo/operstate", "unknown"), ("class/net/lo/carrier", "1"),
                       ("class/net/eth0/operstate", "down"), ("class/net/eth0/carrier", "0")):
        _write(root / rel, value)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="demo", description=__doc__)
    p.add_argument("--heartbeat", type=float, default=3.0, help="heartbeat_interval_s for the demo")
    p.add_argument("--ack-timeout", type=float, default=1.5)
    p.add_argument("--agent-python", default=sys.executable)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        say("needs root: it makes a private network namespace to drop the link for real")
        return 1
    work = Path(tempfile.mkdtemp(prefix="edge-agent-demo-"))
    with NetNS() as ns:
        server = FleetServerProcess(work, "--ping-interval", "25", "--ping-timeout", "20",
                                    devices={}).start()
        say(f"reference fleet server on {server.url} (Engine.IO ping 25 s / timeout 20 s, "
            "the stock defaults)")
        fake_sys = work / "sys"
        _pi_tree(fake_sys)
        cfg = agent_config(server, work, identity={"device_id": None, "token": None},
                           events={"settle_s": 1.0}, debug={"sysfs_root": str(fake_sys)},
                           link={"heartbeat_interval_s": args.heartbeat,
                                               "ack_timeout_s": args.ack_timeout,
                                               "backoff": {"base_s": 1.0, "cap_s": 60.0}})
        agent = AgentProcess(args.agent_python, cfg, work).start()
        say(f"agent started: heartbeat every {args.heartbeat:g} s, ACK timeout {args.ack_timeout:g} s "
            f"(config {cfg})")
        offsets = {"agent": 0, "server": 0}

        def pump(seconds: float, show_rtt: bool = True) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                offsets["agent"] = follow(agent.log_path, offsets["agent"], "agent  |")
                offsets["server"] = follow(work / "server.log", offsets["server"], "server |")
                link = agent.link()
                if show_rtt and link.get("proven_live"):
                    dev = server.device(agent.status().get("device_id"))
                    say(f"online: connection {link['connection']}, heartbeats ACKed "
                        f"{dev.get('heartbeats')}, last seq {dev.get('last_seq')}, "
                        f"rtt {link.get('rtt_ms')} ms")
                time.sleep(1.0)

        try:
            say("a fresh screen: no device id, no token; it enrolls and shows a pairing code")
            code = wait_for(lambda: (agent.status().get("pairing") or {}).get("code"), 20,
                            what="a pairing code")
            pump(0.1, show_rtt=False)
            say(f"the screen shows pairing code {code}; the operator types it into the fleet "
                f"server: scripts/fleet-server pair {code}")
            paired = subprocess.run([str(REPO / "scripts" / "fleet-server"), "pair", code,
                                     "--url", server.url], capture_output=True, text=True,
                                    env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
            say(f"fleet-server: {(paired.stdout or paired.stderr).strip()}")
            link = agent.wait_live(20, connection=1)
            say(f"paired and online; the token is stored 0600 in {work / 'state'}")
            pump(2 * args.heartbeat)
            link = agent.link()
            local_port = int(link["local_addr"].rsplit(":", 1)[1])
            say(f"forcing a SILENT drop: nftables DROP on 127.0.0.1:{local_port} <-> "
                f"127.0.0.1:{server.port}, both directions; new connections still pass")
            ns.drop_flow(local_port, server.port)
            t_drop = time.monotonic()
            pump(0.1, show_rtt=False)
            agent.wait_live(args.heartbeat + args.ack_timeout + 65, connection=2)
            healed = time.monotonic() - t_drop
            pump(0.5, show_rtt=False)
            say(f"healed: heartbeats ACKed on a fresh connection {healed:.1f} s after the drop "
                f"(bound {args.heartbeat + args.ack_timeout:g} s + backoff jitter); a stock "
                "python-socketio client on these server settings notices only at its ping "
                "timeout, 20-45 s after the drop")
            pump(args.heartbeat)
            say("simulating hardware: HDMI-A-1 unplugged and eth0 getting carrier (a Pi's "
                "sysfs files in a temp tree; a veth link change is the real kernel trigger)")
            _write(fake_sys / "class/drm/card1-HDMI-A-1/status", "disconnected")
            _write(fake_sys / "class/net/eth0/operstate", "up")
            _write(fake_sys / "class/net/eth0/carrier", "1")
            subprocess.run(["ip", "link", "add", "demo0", "type", "veth", "peer", "name", "demo1"],
                           check=True)
            subprocess.run(["ip", "link", "set", "demo0", "up"], check=True)
            device_id = agent.status().get("device_id")
            wanted = {"display.disconnected", "network.up"}
            wait_for(lambda: {e["type"] for e in server.device(device_id).get("events", [])} >= wanted,
                     15, what="both events")
            for e in server.device(device_id)["events"]:
                if e["type"] in wanted:
                    say(f"the server got {e['type']} {e.get('connector', '')} (count {e['count']})")
            reports = server.device(agent.status().get("device_id")).get("reports") or []
            if reports:
                r = reports[-1]
                say(f"the server got the agent's journal: connection {r['n']} ended by "
                    f"{r['ended_reason']} after {r['lived_s']} s, rtt avg {r['rtt_ms_avg']} ms")
            say(f"a remote operation: the operator asks the screen for its last log lines: "
                f"scripts/fleet-server command {device_id} logs --since 10m")
            asked = subprocess.run([str(REPO / "scripts" / "fleet-server"), "command", device_id,
                                    "logs", "--since", "10m", "--url", server.url, "--wait", "30"],
                                   capture_output=True, text=True,
                                   env={**os.environ, "EDGE_AGENT_PYTHON": sys.executable})
            pump(0.1, show_rtt=False)
            printed = [line for line in asked.stdout.splitlines() if line.startswith(tuple("012"))]
            say(f"the result came back ({'ok' if asked.returncode == 0 else asked.stderr.strip()}); "
                f"the bundle travelled through the upload queue; its last lines:")
            for line in printed[-6:]:
                print("    " + line)
            say("edge-agent status:")
            status = subprocess.run([args.agent_python, "-m", "agent", "status", "--config",
                                     str(cfg)], cwd=REPO, capture_output=True, text=True,
                                    env={**os.environ, "PYTHONPATH": str(REPO)})
            for line in status.stdout.splitlines():
                print("    " + line)
        finally:
            agent.stop()
            server.stop()
            offsets["agent"] = follow(agent.log_path, offsets["agent"], "agent  |")
    say(f"done; logs in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
