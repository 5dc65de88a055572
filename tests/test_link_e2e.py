"""The live link against the real reference fleet server, with real network faults.

Everything runs inside a private network namespace; nftables DROP rules create true
half-open connections (no FIN, no RST). Intervals are short (heartbeat 2 s, ACK
timeout 1 s) so every bound is checked in seconds.
"""
import socket
import time

import pytest

from devtools import netns as N
from devtools.harness import AgentProcess, SocketSampler, agent_config, wait_for

pytestmark = pytest.mark.netns

HB, ACK = 2.0, 1.0


@pytest.fixture(params=["edge-agent", "screentinker"])
def profile(request):
    """The fault tests run on both server profiles: one link, two wire protocols."""
    return request.param


def start(fleet, profile):
    return fleet(*(["--profile", "screentinker"] if profile == "screentinker" else []))


def config(server, tmp_path, profile, /, **sections):
    return agent_config(server, tmp_path, server={"profile": profile,
                                                  **sections.pop("server", {})}, **sections)


def connect_times_after(server, t0):
    return [t for t in server.device().get("connect_times", []) if t > t0]


def test_silent_drop_of_the_live_connection_heals_within_one_heartbeat(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    with SocketSampler(agent, lambda: server.port) as sampler:
        link = agent.wait_live(15, connection=1)
        local_port = int(link["local_addr"].rsplit(":", 1)[1])
        time.sleep(0.7)  # put the drop somewhere inside a heartbeat cycle
        netns.drop_flow(local_port, server.port)
        t_drop = time.time()
        new = wait_for(lambda: connect_times_after(server, t_drop), HB + ACK + 5,
                       what="a new connection at the server")
        healed_s = new[0] - t_drop
        agent.wait_live(5, connection=2)
    assert healed_s < HB + ACK + 1.0, f"new connection {healed_s:.2f}s after the drop"
    assert sampler.max_seen == 1, f"the agent held two sockets at once: {sampler.worst}"
    # heartbeats are ACKed on the new connection, and the journal says why the old one ended
    before = server.device()["heartbeats"]
    wait_for(lambda: server.device()["heartbeats"] >= before + 2, 3 * HB, what="more heartbeats")
    reports = wait_for(lambda: server.device()["reports"], 3 * HB, what="a connection report")
    assert reports[0]["ended_reason"] == "ack-timeout"
    assert reports[0]["heartbeats_acked"] >= 1 and reports[0]["rtt_ms_avg"] is not None
    assert "link lost: no heartbeat ack" in agent.log_text()
    assert "s3cret-token" not in agent.log_text()


def test_drop_everything_then_restore_reconnects_within_a_backoff_step(
        netns, fleet, spawn_agent, agent_python, tmp_path, profile):
    server = start(fleet, profile)
    # the agent's own floor for a connect bound (link/connect_bound.py), not the harness's
    # 2 s: a handshake a loaded CI machine stalls for 2 s is no lost backoff step
    cap, connect_timeout = 2.0, 4.0
    agent = spawn_agent(agent_python, config(server, tmp_path, profile,
                                             server={"connect_timeout_s": connect_timeout}))
    agent.wait_live(15, connection=1)
    netns.drop_port(server.port)
    wait_for(lambda: agent.link().get("state") in ("waiting", "connecting"), HB + ACK + 2,
             what="the agent to notice the outage")
    # failed attempts while the network is gone, each growing the backoff to its cap
    # (the loss counts as the first)
    wait_for(lambda: (agent.link().get("attempts") or 0) >= 3, 2 * (connect_timeout + cap) + 1,
             what="two failed attempts")
    time.sleep(2)   # the restore falls in the next wait or early in the next attempt
    assert agent.link().get("connection") is None
    netns.restore()
    t_restore = time.time()
    # waited for longer than it may take, so that a late one says how late (the logs
    # beside a failure say why: tests/conftest.py)
    new = wait_for(lambda: connect_times_after(server, t_restore), 3 * (cap + connect_timeout),
                   what="reconnect after restore")
    late = new[0] - t_restore
    assert late <= cap + connect_timeout + 0.5, f"reconnected {late:.2f}s after the restore"
    agent.wait_live(5)


def test_the_servers_reconnect_window_spreads_a_lost_server_but_not_a_silent_drop(
        netns, fleet, agent_python, tmp_path):
    """Six screens on a node that sets a 12 s window: a silent drop on one site heals
    at once; the node's death brings them back over the window, not in one second."""
    window = 12.0
    server = fleet("--accept-any", "--reconnect-window", str(window))
    agents = []
    try:
        for i in range(1, 7):
            work = tmp_path / f"screen-{i}"
            work.mkdir()
            agents.append(AgentProcess(agent_python, agent_config(
                server, work, identity={"device_id": f"screen-{i}", "token": "t" * 24}),
                work).start())
        for a in agents:
            a.wait_live(15)
        assert all(a.link().get("reconnect_window_s") == window for a in agents)
        link = agents[0].link()
        netns.drop_flow(int(link["local_addr"].rsplit(":", 1)[1]), server.port)
        t_drop = time.time()
        new = wait_for(lambda: connect_times_after(server, t_drop), HB + ACK + 5,
                       what="screen-1 back after a silent drop")
        assert new[0] - t_drop < HB + ACK + 1.0   # the window is not for the site's losses
        agents[0].wait_live(5)
        server.kill()
        t_up = server.start().listening_at

        def back():
            firsts = [min((t for t in server.device(f"screen-{i}").get("connect_times", [])
                           if t > t_up), default=None) for i in range(1, 7)]
            return firsts if None not in firsts else None
        firsts = wait_for(back, 2 * window + 8, interval=0.2, what="all six back")
        delays = sorted(t - t_up for t in firsts)
        # without the window all six are back within the first backoff step (1 s);
        # six even draws over 12 s all under 2 s: 1 in 46656
        assert delays[-1] > 2.0, delays
    finally:
        for a in agents:
            a.proc.kill()
            a.proc.wait()


def test_server_sigkill_and_ten_restarts_never_stop_the_retries(
        netns, fleet, spawn_agent, agent_python, tmp_path, profile):
    server = start(fleet, profile)
    agent = spawn_agent(agent_python, config(server, tmp_path, profile))
    agent.wait_live(15, connection=1)
    with SocketSampler(agent, lambda: server.port) as sampler:
        server.kill()
        time.sleep(1.0)
        t_up = server.start().listening_at
        new = wait_for(lambda: connect_times_after(server, t_up), 2.0 + 3, what="reconnect")
        assert new[0] - t_up <= 2.0 + 0.5  # within one capped backoff step
        agent.wait_live(5)
        for _ in range(10):
            server.kill()
            time.sleep(0.3)
            server.start()
        t_last = server.listening_at
        wait_for(lambda: connect_times_after(server, t_last), 2.0 + 3, what="reconnect after the 10th restart")
        agent.wait_live(15)   # its proof after the reconnect bounded above: a wait, not a bound
    assert agent.alive()
    assert sampler.max_seen == 1 and sampler.samples > 50, sampler.worst


def test_keepalive_and_user_timeout_are_set_on_the_live_socket_after_reconnects_too(
        netns, fleet, spawn_agent, agent_python, tmp_path, profile):
    server = start(fleet, profile)
    agent = spawn_agent(agent_python, config(server, tmp_path, profile))

    def check_live_socket(connection):
        link = agent.wait_live(15, connection=connection)
        local_port = int(link["local_addr"].rsplit(":", 1)[1])
        [entry] = [s for s in agent.sockets(server.port) if s["local_port"] == local_port]
        with N.borrow_socket(agent.pid, entry["fd"]) as sock:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
            assert sock.getsockopt(socket.IPPROTO_TCP, N.TCP_USER_TIMEOUT) == 6500
            # Nagle off, as websocket-client sets it on sockets it dials: with it on, a
            # heartbeat waited for the server's delayed ACK of an upload written just
            # before, and the kernel's proof of delivery called the link dead
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        return local_port

    first = check_live_socket(1)
    netns.drop_flow(first, server.port)           # a silent drop: watchdog reconnect
    second = check_live_socket(2)
    server.kill()
    server.start()                                # a hard server restart: transport error
    third = check_live_socket(3)
    assert len({first, second, third}) == 3


def test_slow_namespace_connect_still_succeeds(netns, fleet, spawn_agent, agent_python, tmp_path):
    """Trap: python-socketio's reconnects use wait_timeout=1, so a CONNECT slower than 1 s
    never succeeds. The agent passes its own connect timeout on every attempt."""
    import socketio
    server = fleet("--connect-delay", "1.5")
    stock = socketio.Client(reconnection=False)
    with pytest.raises(socketio.exceptions.ConnectionError):
        stock.connect(server.url, auth={"device_id": "screen-1", "token": "s3cret-token"},
                      transports=["websocket"], wait_timeout=1)
    stock.disconnect()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path, server={"connect_timeout_s": 4.0}))
    agent.wait_live(15, connection=1)


def test_server_throttle_holds_off_the_next_connect(netns, fleet, spawn_agent, agent_python, tmp_path, profile):
    server = start(fleet, profile)
    agent = spawn_agent(agent_python, config(server, tmp_path, profile))
    agent.wait_live(15, connection=1)
    t0 = time.time()
    server.admin("/admin/throttle", {"device_id": "screen-1", "retry_after_s": 3, "disconnect": True})
    new = wait_for(lambda: connect_times_after(server, t0), 8, what="reconnect after throttle")
    assert new[0] - t0 >= 3.0
    assert new[0] - t0 < 3.0 + 2.0 + 1.0
    assert "hold off" in agent.log_text()


def test_hostile_server_messages_cost_a_log_line_not_the_agent(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15, connection=1)
    for event, data in [("server:throttle", "soon"), ("server:throttle", {"retry_after_s": "x"}),
                        ("server:throttle", [1, 2, 3]), ("no:such-event", {"a": 1}),
                        ("device:heartbeat", None)]:
        server.admin("/admin/emit", {"device_id": "screen-1", "event": event, "data": data})
    server.admin("/admin/emit", {"device_id": "screen-1", "event": "huge", "pad_bytes": 1_000_000})
    time.sleep(HB)
    assert agent.alive()
    assert agent.link()["connection"] == 1, "hostile messages must not cost the link"
    server.admin("/admin/behaviour", {"ack_mode": "wrong-seq"})
    agent.wait_live(HB + ACK + 8, connection=None)  # still live from its last ACK, or:
    wait_for(lambda: agent.link().get("connection") not in (None, 1), HB + ACK + 5,
             what="reconnect after ACKs for the wrong seq")
    server.admin("/admin/behaviour", {"ack_mode": "garbage"})
    time.sleep(HB * 2)
    assert agent.alive()
    server.admin("/admin/behaviour", {"ack_mode": "ok"})
    agent.wait_live(HB * 4)
    log = agent.log_text()
    assert "ignoring malformed server:throttle" in log
    assert "ignoring unknown server event 'no:such-event'" in log
    assert "ignoring malformed heartbeat ack" in log
    assert "Traceback" not in log
