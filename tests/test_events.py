"""Events from device state: debounce, latch, network edges, telemetry, outbox; the
watcher on a fake sysfs tree with the attribute files a Raspberry Pi has."""
import os

from agent.events.debounce import Debouncer
from agent.events.model import Event, NetworkState, UndervoltageLatch
from agent.events.outbox import Outbox
from agent.events.telemetry import TelemetryGate, TelemetrySampler
from agent.events.watcher import EventWatcher, SysfsState
from devtools.harness import TurnRecorder


def test_a_burst_of_50_hotplugs_in_one_second_is_one_event_with_count_50():
    d = Debouncer(settle_s=2.0)
    for i in range(50):
        kind = "display.connected" if i % 2 == 0 else "display.disconnected"
        d.feed("display:HDMI-A-1", Event(kind, 1000.0 + i * 0.02, {"connector": "HDMI-A-1"}), 10.0 + i * 0.02)
    assert d.due(11.0) == []
    [event] = d.due(10.98 + 2.0)
    assert event.count == 50 and event.ts == 1000.0
    assert event.type == "display.disconnected"  # the state it settled in


def test_undervoltage_is_latched_once_per_boot():
    latch = UndervoltageLatch()
    seen = [latch.feed(v) for v in ["0", "1", "1", "0", "1", "0", "1"]]
    assert seen.count("power.undervoltage") == 1
    assert seen[1] == "power.undervoltage" and seen[3] == "power.restored"


def test_network_edges_ignore_loopback_and_the_first_look():
    n = NetworkState()
    assert n.feed({"lo": ("unknown", "1")}) is None
    assert n.feed({"lo": ("unknown", "1"), "eth0": ("up", "1")}) == "network.up"
    assert n.feed({"eth0": ("up", "1"), "wlan0": ("down", "")}) is None
    assert n.feed({"eth0": ("down", "0")}) == "network.down"


def test_telemetry_only_when_it_moved_or_periodically():
    g = TelemetryGate(every_s=300)
    v = {"cpu_percent": 10.0, "mem_percent": 40.0}
    assert g.should_send(v, 0.0)
    g.sent(v, 0.0)
    assert not g.should_send({"cpu_percent": 80.0, "mem_percent": 40.0}, 30.0)  # too soon
    assert not g.should_send({"cpu_percent": 20.0, "mem_percent": 42.0}, 60.0)
    assert g.should_send({"cpu_percent": 80.0, "mem_percent": 40.0}, 61.0)
    assert g.should_send(v, 300.0)


def test_the_soc_temperature_is_read_from_its_one_hwmon_file(tmp_path):
    for n, (chip, millidegrees) in enumerate([("acpitz", "30000"), ("coretemp", "61000"),
                                               ("cpu_thermal", "48312")]):
        write(tmp_path, f"class/hwmon/hwmon{n}/name", chip)
        write(tmp_path, f"class/hwmon/hwmon{n}/temp1_input", millidegrees)
    sampler = TelemetrySampler(str(tmp_path), str(tmp_path))
    values = sampler.sample()
    assert values["soc_temp_c"] == 48.3 and values["uptime_s"] > 0 and values["disk_total_mb"] > 0
    write(tmp_path, "class/hwmon/hwmon2/temp1_input", "52000")
    assert sampler.sample()["soc_temp_c"] == 52.0
    os.remove(os.path.join(tmp_path, "class/hwmon/hwmon2/temp1_input"))
    assert "soc_temp_c" not in sampler.sample()   # gone; looked for again minutes later
    assert "soc_temp_c" not in TelemetrySampler(str(tmp_path), str(tmp_path / "none")).sample()


def test_outbox_is_bounded_ordered_and_counts_what_it_drops():
    box = Outbox(capacity=3)
    events = [Event("network.up", float(i)) for i in range(5)]
    for e in events:
        box.put(e)
    assert [e.ts for e in box.pending()] == [2.0, 3.0, 4.0] and box.dropped == 2
    box.ack(events[3].id)
    assert [e.ts for e in box.pending()] == [2.0, 4.0] and box.delivered == 1


def write(root, rel, value):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(value + "\n")


def pi_tree(root):
    write(root, "class/drm/card1-HDMI-A-1/status", "connected")
    write(root, "class/drm/card1-HDMI-A-2/status", "disconnected")
    write(root, "class/hwmon/hwmon0/name", "rpi_volt")
    write(root, "class/hwmon/hwmon0/in0_lcrit_alarm", "0")
    write(root, "class/power_supply/usb/online", "1")
    write(root, "class/net/lo/operstate", "unknown")
    write(root, "class/net/lo/carrier", "1")
    write(root, "class/net/eth0/operstate", "down")
    write(root, "class/net/eth0/carrier", "0")


def test_watcher_turns_pi_sysfs_changes_into_events(tmp_path):
    root = str(tmp_path)
    pi_tree(root)
    box = Outbox()
    woken = []
    w = EventWatcher(box, on_network_up=lambda: woken.append(1), sysfs=SysfsState(root), settle_s=2.0)
    w.scan(0.0, baseline=True)
    assert box.pending() == []
    write(root, "class/drm/card1-HDMI-A-1/status", "disconnected")
    write(root, "class/hwmon/hwmon0/in0_lcrit_alarm", "1")
    write(root, "class/power_supply/usb/online", "0")
    write(root, "class/net/eth0/operstate", "up")
    write(root, "class/net/eth0/carrier", "1")
    w.scan(1.0)
    assert woken == [1], "network back must wake the link at once, not after the settle window"
    w.scan(3.1)
    types = sorted(e.type for e in box.pending())
    assert types == ["display.disconnected", "network.up", "power.supply-offline", "power.undervoltage"]
    display = next(e for e in box.pending() if e.type.startswith("display"))
    assert display.details == {"connector": "HDMI-A-1"}


def test_watcher_falls_back_to_sysfs_reads_without_netlink(tmp_path, monkeypatch, caplog):
    root = str(tmp_path)
    pi_tree(root)
    box = Outbox()
    w = EventWatcher(box, sysfs=SysfsState(root), settle_s=0.1, fallback_interval_s=0.2)
    monkeypatch.setattr(w, "_open_udev", lambda: None)
    monkeypatch.setattr(w, "_open_rtnetlink", lambda: None)
    w.start()
    try:
        import time
        time.sleep(0.3)
        write(root, "class/drm/card1-HDMI-A-2/status", "connected")
        deadline = time.monotonic() + 3
        while not box.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.mode == "sysfs-poll"
        assert [e.type for e in box.pending()] == ["display.connected"]
    finally:
        w.stop()
        w.join(2)


class FakeNetlink:
    """A netlink source the test makes readable: a socketpair end, drained as the
    watcher drains udev (poll) and rtnetlink (recv)."""

    def __init__(self):
        import socket
        self.sock, self.peer = socket.socketpair()
        self.sock.setblocking(False)

    def fileno(self):
        return self.sock.fileno()

    def poll(self, timeout=0):
        try:
            return self.sock.recv(1) or None
        except BlockingIOError:
            return None

    def recv(self, n):
        return self.sock.recv(n)


def test_the_watcher_waits_untimed_and_off_the_watchdog_gate_while_idle(tmp_path, monkeypatch):
    import threading
    import time
    root = str(tmp_path)
    pi_tree(root)
    box = Outbox()
    log, idle = [], threading.Event()
    udev, rtnl = FakeNetlink(), FakeNetlink()
    w = EventWatcher(box, sysfs=SysfsState(root), settle_s=0.2,
                     gate=TurnRecorder(on_turn=lambda: log.append("tick"),
                                       on_idle=lambda: (log.append("idle"), idle.set())))
    monkeypatch.setattr(w, "_open_udev", lambda: udev)
    monkeypatch.setattr(w, "_open_rtnetlink", lambda: rtnl)
    w.start()
    try:
        assert idle.wait(3) and w.mode == "netlink"
        time.sleep(0.5)
        assert log == ["tick", "idle"], "an idle watcher woke on a timer"
        idle.clear()
        write(root, "class/drm/card1-HDMI-A-2/status", "connected")
        udev.peer.send(b"x")                       # the kernel's uevent
        assert idle.wait(3), "back to idle once the settle window flushed"
        assert [e.type for e in box.pending()] == ["display.connected"]
        assert log[2:] == ["tick", "tick", "idle"], "timed (on the gate) while settling"
    finally:
        w.stop()
        w.join(2)


def test_telemetry_is_sampled_at_most_once_a_minute_and_optional(tmp_path, monkeypatch, caplog):
    from agent.events import telemetry as T
    now = [0.0]
    source = T.TelemetrySource(str(tmp_path), str(tmp_path), clock=lambda: now[0])
    first = source.get()
    assert first["mem_total_mb"] > 0
    monkeypatch.setattr(T.TelemetrySampler, "sample", lambda self: {"cpu_percent": 99.0})
    now[0] = 59.0
    assert source.get() == first
    now[0] = 60.0
    assert source.get() == {"cpu_percent": 99.0}
    broken = T.TelemetrySource(str(tmp_path), clock=lambda: now[0])
    monkeypatch.setattr(T.TelemetrySampler, "__init__", lambda *a: (_ for _ in ()).throw(
        ImportError("No module named 'psutil'")))
    assert broken.get() == {} and "telemetry unavailable (ImportError" in caplog.text
    now[0] = 1000.0
    caplog.clear()
    assert broken.get() == {} and caplog.text == "", "said once"
    w = EventWatcher(Outbox(), sysfs=SysfsState(str(tmp_path)))
    w.telemetry_sampled({}, 0.0)
    w.telemetry_sampled({"cpu_percent": 3.0}, 0.0)
    assert [e.type for e in w.outbox.pending()] == ["device.telemetry"]


def test_repeated_warnings_with_changing_numbers_are_one_kind():
    import logging
    from agent.base.logs import RepeatFilter
    now = [0.0]
    f = RepeatFilter(window_s=60.0, clock=lambda: now[0])

    def record(*args):
        return logging.LogRecord("edge_agent.link", logging.WARNING, __file__, 1,
                                 "link lost: %s, reconnecting in %.1fs", args, None)
    assert f.filter(record("no heartbeat ack for 5.0s (seq 41, 1 missed)", 3.2))
    now[0] = 10.0
    assert not f.filter(record("no heartbeat ack for 5.0s (seq 57, 1 missed)", 1.1))
    assert f.filter(record("server-disconnect", 1.0)), "another kind still gets through"
    now[0] = 70.0
    r = record("no heartbeat ack for 5.0s (seq 99, 1 missed)", 2.0)
    assert f.filter(r) and "1 more like this" in r.getMessage()
