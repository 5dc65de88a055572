"""A fleet-server deploy nobody notices (#54, make before break), with the real agent and
two real reference servers: the old one listens with SO_REUSEPORT, the new one takes
over the port beside it, and the old one is SIGTERMed with a 3 s drain window. It closes
its listener (every new connection now reaches the new server), tells the screen
server:drain, and serves on until the screen has moved: the screen opens its new
connection at a jittered moment within the window, proves it with an ACKed heartbeat,
and only then closes the old one. Events raised all along (a display flipping) cross the
switch; none is lost, none stored twice by a node, and the servers never hold two live
sessions of the screen."""
import json
import signal
import threading
import time

import pytest

from devtools.harness import FleetServerProcess, agent_config, wait_for
from tests.test_events import pi_tree, write
from tests.test_events_e2e import add_cable, cable

pytestmark = pytest.mark.netns

HB, ACK, WINDOW = 1.5, 1.0, 3.0
MARGIN_S = 2.0   # fleet_server/sessions.py DRAIN_MARGIN_S


def _drain_and_watch(node, agent):
    """SIGTERM to ``node``; until it is gone, the screen's link every 20 ms: (seconds
    since, state, proven, connection), and how long the node took to stop."""
    node.proc.send_signal(signal.SIGTERM)
    t_term = time.monotonic()
    samples = []
    while node.proc.poll() is None and time.monotonic() < t_term + WINDOW + MARGIN_S + 5:
        link = agent.link()
        samples.append((round(time.monotonic() - t_term, 2), link.get("state"),
                        link.get("proven_live"), link.get("connection")))
        time.sleep(0.02)
    return samples, time.monotonic() - t_term


def _keys(events):
    return [(e.get("id"), e.get("ts")) for e in events]


def test_a_draining_server_hands_its_screen_to_the_new_one_proven_first_nothing_missed(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    root = str(tmp_path / "sys")
    pi_tree(root)
    add_cable()
    record = tmp_path / "old-node.json"
    old = fleet("--reuse-port", "--drain-window", str(WINDOW), "--record", str(record))
    cfg = agent_config(old, tmp_path, link={"heartbeat_interval_s": HB, "ack_timeout_s": ACK},
                       events={"settle_s": 0.2}, debug={"sysfs_root": root})
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    work = tmp_path / "new-node"
    work.mkdir()
    new = FleetServerProcess(work, "--reuse-port")
    new.port = old.port
    new.start()   # after the screen connected: the kernel now shares new connections
    stop = threading.Event()
    flips = []

    def flip():   # events in flight across the switch
        while not stop.is_set():
            status = "disconnected" if len(flips) % 2 == 0 else "connected"
            write(root, "class/drm/card1-HDMI-A-1/status", status)
            flips.append(status)
            cable(len(flips) % 2 == 1)   # the trigger
            time.sleep(0.35)

    flipper = threading.Thread(target=flip, daemon=True)
    try:
        flipper.start()
        time.sleep(1.0)
        samples, gone_after = _drain_and_watch(old, agent)
        assert old.proc.poll() == 0, "the old node did not stop after its drain"
        time.sleep(1.5)
        stop.set()
        flipper.join(5)
        wait_for(lambda: agent.status()["events"]["pending"] == 0 or None, 10,
                 what=f"every event ACKed: {agent.status().get('events')}")
        a = json.loads(record.read_text())["screen-1"]
        b = new.device()
        log = agent.log_text()   # before the new node stops
    finally:
        stop.set()
        new.stop()
    print(f"\nold node gone {gone_after:.2f}s after SIGTERM (window {WINDOW}s); "
          f"connections seen by the screen {sorted({s[3] or 0 for s in samples})}")
    # the old node stopped as soon as the screen had moved, within the window
    assert gone_after < WINDOW + 1.0, gone_after
    assert "drained: 0 connections left" in (tmp_path / "server.log").read_text()
    # the link was online and proven at every look, and never lost
    unproven = [s for s in samples if s[1] != "online" or not s[2]]
    assert not unproven, unproven[:5]
    assert "link moved: the server drained" in log and "link lost" not in log, log[-3000:]
    # one session on the new node, never two, made once
    assert (b["connects"], b["sockets"], b["max_concurrent"]) == (1, 1, 1), b
    assert a["sockets"] == 0 and a["max_concurrent"] == 1, a
    # no heartbeat missed: across both nodes, never a gap longer than hb + ack
    beats = sorted(t for t in a["heartbeat_times"] + b["heartbeat_times"])
    gaps = [later - earlier for earlier, later in zip(beats, beats[1:])]
    print(f"heartbeats: {len(a['heartbeat_times'])} on the old node, "
          f"{len(b['heartbeat_times'])} on the new; widest gap {max(gaps):.2f}s")
    assert max(gaps) <= HB + ACK, gaps
    # the old connection is reported as drained, not as a loss
    assert any(r.get("ended_reason") == "drained" for r in b["reports"]), b["reports"]
    # events: none lost (all ACKed, above), none stored twice by a node, in order
    for node in (a, b):
        keys = _keys(node["events"])
        assert len(keys) == len(set(keys)), node["events"]
    moved = [e for e in b["events"] if e["type"].startswith("display.")]
    assert moved, "no display event crossed to the new node"
    union = {k: e for node in (a, b) for k, e in zip(_keys(node["events"]), node["events"])}
    ids = sorted(k[0] for k in union)
    assert ids == list(range(ids[0], ids[0] + len(ids))), f"an event is missing: {ids}"
    both = set(_keys(a["events"])) & set(_keys(b["events"]))
    print(f"events: {len(a['events'])} on the old node, {len(b['events'])} on the new, "
          f"{len(both)} sent again across the switch (a fleet's store keeps each id once)")


def test_a_drain_with_nowhere_to_go_keeps_the_old_link_until_the_drains_end(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """No other node: the new connection is refused (the draining node closed its
    listener). The screen keeps its live link, proven, until the drain's end cuts it,
    then reconnects as after any server loss."""
    old = fleet("--drain-window", str(WINDOW))
    agent = spawn_agent(agent_python, agent_config(
        old, tmp_path, link={"heartbeat_interval_s": HB, "ack_timeout_s": ACK}))
    agent.wait_live(15)
    samples, _ = _drain_and_watch(old, agent)
    assert old.proc.poll() == 0
    log = agent.log_text()
    assert "drain: the new connection failed" in log, log[-2000:]
    # the old link carried on, proven, through the whole window
    early = [s for s in samples if s[0] < WINDOW]
    assert early and all(s[1:] == ("online", True, 1) for s in early), early[:5]
    old.start()   # the node back on its port: the usual reconnect
    agent.wait_live(15, connection=2)
