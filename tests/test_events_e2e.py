"""Events through the real agent and server: network-up wakes the link at once, events
raised while the server is down arrive after it returns, in order, ACKed."""
import subprocess
import time

import pytest

from devtools.harness import agent_config, wait_for
from tests.test_events import pi_tree, write

pytestmark = pytest.mark.netns


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def add_cable():
    # a veth pair: the kernel here may lack the dummy driver; veth has a real carrier
    ip("link", "add", "eth-test", "type", "veth", "peer", "name", "eth-peer")


def cable(up: bool):
    """Carrier up or down on eth-test, as plugging a cable in or out does."""
    state = "up" if up else "down"
    ip("link", "set", "eth-test", "up")
    ip("link", "set", "eth-peer", state)


def test_carrier_up_during_backoff_connects_within_a_second(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    port = server.port
    server.kill()  # the network is "down": nothing answers
    cfg = agent_config(server, tmp_path, link={"backoff": {"base_s": 30.0, "cap_s": 30.0,
                                                           "jitter": "none"}})
    agent = spawn_agent(agent_python, cfg)
    wait_for(lambda: agent.link().get("state") == "waiting" and agent.link().get("attempts", 0) >= 1,
             10, what="the agent backing off 30 s")
    time.sleep(1.0)
    server.port = port
    server.start()
    add_cable()
    cable(True)   # a real rtnetlink event in the test namespace
    t_up = time.time()
    new = wait_for(lambda: [t for t in server.device().get("connect_times", []) if t > t_up - 0.5],
                   5, what="a connect attempt after network-up")
    assert new[0] - t_up < 1.0, f"connected {new[0] - t_up:.2f}s after carrier up"
    print(f"\nconnect attempt {new[0] - t_up:.3f}s after carrier up (backoff had 30 s to go)")
    assert "network is back" in agent.log_text()
    wait_for(lambda: any(e["type"] == "network.up" for e in server.device().get("events", [])),
             10, what="the network.up event at the server")


def test_events_raised_while_the_server_is_down_arrive_in_order_after_it_returns(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    root = str(tmp_path / "sys")
    pi_tree(root)
    write(root, "class/hwmon/hwmon1/name", "cpu_thermal")
    write(root, "class/hwmon/hwmon1/temp1_input", "47500")
    add_cable()
    server = fleet()
    cfg = agent_config(server, tmp_path, events={"settle_s": 0.2},
                       debug={"sysfs_root": root})
    agent = spawn_agent(agent_python, cfg)
    agent.wait_live(15)
    # sampled on a turn of the link loop, sent as an event like the others
    telemetry = wait_for(lambda: [e for e in server.device().get("events", [])
                                  if e["type"] == "device.telemetry"], 10, what="telemetry")
    assert telemetry[0]["soc_temp_c"] == 47.5 and telemetry[0]["mem_total_mb"] > 0
    port = server.port
    server.kill()
    raised = []
    for status in ("disconnected", "connected", "disconnected"):
        write(root, "class/drm/card1-HDMI-A-1/status", status)
        raised.append(time.time())
        cable(len(raised) % 2 == 1)                                   # the trigger
        time.sleep(1.2)                                   # well past the 0.2 s settle window
    write(root, "class/hwmon/hwmon0/in0_lcrit_alarm", "1")
    cable(False)
    time.sleep(1.2)
    wait_for(lambda: agent.status()["events"]["pending"] >= 4, 5, what="events held while down")
    server.port = port
    server.start()
    agent.wait_live(15)
    wait_for(lambda: agent.status()["events"]["pending"] == 0 or None, 10,
             what=f"all events ACKed: {agent.status()['events']} server {server.device()['events']}")
    events = server.device()["events"]
    display = [e for e in events if e["type"].startswith("display.")]
    assert [e["type"] for e in display] == ["display.disconnected", "display.connected",
                                            "display.disconnected"]
    assert all(abs(e["ts"] - t) < 1.0 for e, t in zip(display, raised)), "original timestamps"
    assert [e["type"] for e in events].count("power.undervoltage") == 1
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
