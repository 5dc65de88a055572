"""systemd integration against a fake NOTIFY_SOCKET and the real reference server."""
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from agent.link.upgrade import ABORT_JOIN_S
from devtools.harness import REPO, FakeSystemd, agent_config, wait_for

pytestmark = pytest.mark.netns

HB, ACK = 2.0, 1.0
WATCHDOG_S = 1.0  # pets every 0.5 s
LINK_MAX_WAIT_S = 5.0   # [debug] link_max_wait_s: the stalled loop is found sooner


@pytest.fixture
def systemd(tmp_path):
    fake = FakeSystemd(tmp_path / "notify.sock", WATCHDOG_S)
    yield fake
    fake.close()


def test_ready_then_pets_only_while_the_link_is_proven_live(
        netns, fleet, spawn_agent, agent_python, tmp_path, systemd):
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path), env=systemd.env())
    wait_for(lambda: systemd.times("READY=1"), 10, what="READY=1")
    agent.wait_live(15, connection=1)
    wait_for(lambda: len(systemd.times("WATCHDOG=1")) >= 3, 5, what="pets while online")
    assert any(s.startswith("online rtt=") for s in systemd.statuses())

    netns.drop_port(server.port)  # silent, and no way back until restored
    t_drop = time.monotonic()
    time.sleep(HB + ACK + 3 * WATCHDOG_S)
    last_pet = max(systemd.times("WATCHDOG=1"))
    stopped_after = last_pet - t_drop
    print(f"\nlast WATCHDOG=1 {stopped_after:.2f}s after the silent drop "
          f"(bound {HB + ACK + WATCHDOG_S / 2:.1f}s)")
    assert stopped_after <= HB + ACK + WATCHDOG_S / 2 + 0.3, f"pets went on {stopped_after:.2f}s"
    assert any(s.startswith("reconnecting in") for s in systemd.statuses())

    netns.restore()
    t_restore = time.monotonic()
    wait_for(lambda: [t for t in systemd.times("WATCHDOG=1") if t > t_restore], 10,
             what="pets to resume after relink")
    assert agent.alive()


def test_a_stalled_loop_stops_the_pets_even_when_the_link_is_not_required(
        netns, fleet, spawn_agent, agent_python, tmp_path, systemd):
    server = fleet()
    cfg = agent_config(server, tmp_path, server={"connect_timeout_s": 1.0},
                       watchdog={"require_link": False},
                       debug={"stall_link_after_s": 3.0, "link_max_wait_s": LINK_MAX_WAIT_S})
    agent = spawn_agent(agent_python, cfg, env=systemd.env())
    wait_for(lambda: systemd.times("READY=1"), 10, what="READY=1")
    t_start = systemd.times("READY=1")[0]
    wait_for(lambda: "stalling on purpose" in agent.log_text(), 10, what="the stall")
    # link loop's allowance: connect 1 s + 2 x 2 s abort + its longest wait + 2 s margin
    allowance = 1.0 + 2 * ABORT_JOIN_S + LINK_MAX_WAIT_S + 2.0
    time.sleep(allowance + 2 * WATCHDOG_S)
    pets = systemd.times("WATCHDOG=1")
    assert pets, "it petted while healthy"
    assert time.monotonic() - max(pets) >= WATCHDOG_S, "pets went on with a wedged loop"
    assert max(pets) - t_start <= 3.0 + allowance + WATCHDOG_S + 1.0
    assert "withholding pets (stalled: link)" in agent.log_text()
    agent.proc.kill()   # its link thread is wedged on purpose: SIGTERM would wait it out


def test_sigterm_says_stopping_exits_cleanly_and_loses_no_queued_upload(
        netns, fleet, spawn_agent, agent_python, tmp_path, systemd):
    server = fleet()
    cfg = agent_config(server, tmp_path, uploads={"base_s": 1.0, "cap_s": 2.0})
    agent = spawn_agent(agent_python, cfg, env=systemd.env())
    agent.wait_live(15)
    server.admin("/admin/behaviour", {"upload_mode": "hang"})  # an upload in flight at stop
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    for i in range(3):
        subprocess.run([agent_python, "-m", "agent", "enqueue", "--config", str(cfg), "--kind",
                        "log", "-"], input=f"log-{i}".encode(), env=env, check=True, timeout=30)
    wait_for(lambda: server.device()["upload_requests"], 5, what="an upload in flight")
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(10) == 0
    assert time.monotonic() - t0 < 6.0
    assert systemd.times("STOPPING=1")
    wait_for(lambda: server.device()["online"] is False, 5, what="server to see the goodbye")
    server.admin("/admin/behaviour", {"upload_mode": "ok"})
    again = spawn_agent(agent_python, cfg)
    wait_for(lambda: server.device()["uploads"] == 3, 10, what="the queued uploads after restart")
    again.stop()


# tgkill(2): a signal for one thread of a process, as the kernel may pick any thread
_TGKILL = {"x86_64": 234, "aarch64": 131, "armv7l": 268, "armv6l": 268, "i686": 270}


def _tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    number = _TGKILL.get(os.uname().machine)
    assert number is not None, f"tgkill's syscall number on {os.uname().machine} is unknown here"
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def test_a_sigterm_the_kernel_gives_to_any_thread_stops_the_agent(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    """The kernel hands a process-directed signal to any thread that does not block it
    (seen in CI: during a flood of commands, SIGTERM went to a library thread). Python
    runs handlers on the main thread only: one asleep in a lock never ran it, and the
    agent ignored systemd's stop."""
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(server, tmp_path))
    agent.wait_live(15)
    pid = agent.proc.pid
    others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert others, "the agent runs threads besides its main one"
    t0 = time.monotonic()
    _tgkill(pid, others[-1], signal.SIGTERM)   # the newest: a thread of the client library
    assert agent.proc.wait(5) == 0
    assert time.monotonic() - t0 < 2.0
    assert "received SIGTERM, stopping" in agent.log_text()


def test_backoff_schedule_survives_kill_9(netns, spawn_agent, agent_python, tmp_path):
    """A restarted agent continues its schedule instead of hitting the server at once."""
    accepts: list[float] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def refuse_forever():
        # accepts TCP, then hangs up: a server that is down behind a load balancer
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepts.append(time.monotonic())
            conn.close()

    threading.Thread(target=refuse_forever, daemon=True).start()

    class Down:
        url = f"http://127.0.0.1:{port}"
        devices = {"screen-1": "t"}

    cfg = agent_config(Down, tmp_path, link={"backoff": {"base_s": 0.5, "cap_s": 4.0,
                                                          "jitter": "none"}})
    first = spawn_agent(agent_python, cfg)
    # attempts at 0, 0.5, 1.5, 3.5 s; the fifth is due 4 s after the fourth
    wait_for(lambda: len(accepts) >= 4, 10, what="four failed attempts")
    fourth = accepts[3]
    # the server's accept comes before the agent has taken the failure in and kept its
    # schedule: a kill in between restarts from the third failure's (seen once in CI)
    wait_for(lambda: first.link().get("attempts", 0) >= 4, 5, what="the fourth failure kept")
    first.proc.kill()
    first.proc.wait(5)
    n_before = len(accepts)
    second = spawn_agent(agent_python, cfg)
    wait_for(lambda: len(accepts) > n_before, 10, what="the restarted agent's first attempt")
    resumed = accepts[n_before]
    listener.close()
    assert resumed - fourth >= 4.0 - 0.2, f"restarted agent tried {resumed - fourth:.2f}s after"
    assert resumed - fourth <= 4.0 + 1.5
    assert "continuing the reconnect schedule" in second.log_text()


def test_a_server_without_acks_is_proven_by_the_kernel_at_every_heartbeat(
        netns, fleet, spawn_agent, agent_python, tmp_path, systemd):
    """ScreenTinker before 1.9 ACKs no heartbeat. Its pings come every 25 s, so proof from
    pings alone left gaps a WatchdogSec under half a minute could not bear; the kernel's
    TCP acknowledgement of each heartbeat proves the link at every heartbeat, and its
    absence ends a silently dropped link at that heartbeat's ACK deadline."""
    server = fleet("--ack-mode", "none")   # pings every 25 s: none inside this test
    agent = spawn_agent(agent_python, agent_config(server, tmp_path), env=systemd.env())
    t_up = time.monotonic()
    link = agent.wait_live(HB + ACK + 5, connection=1)
    assert link["proof"] == "tcp-ack+ping", link
    assert time.monotonic() - t_up < HB + ACK + 5
    time.sleep(4 * HB)   # no ping arrives in this window, the pets go on
    pets = [t for t in systemd.times("WATCHDOG=1") if t > t_up]
    gaps = [b - a for a, b in zip(pets, pets[1:])]
    assert len(pets) >= 6 and max(gaps) < WATCHDOG_S, (len(pets), gaps)

    local_port = int(agent.link()["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(local_port, server.port)
    t_drop = time.monotonic()
    wait_for(lambda: agent.link().get("connection") == 2 and agent.link().get("proven_live"),
             HB + ACK + 8, what="a new, proven connection after the silent drop")
    healed_s = time.monotonic() - t_drop
    last_pet_on_old = max(t for t in systemd.times("WATCHDOG=1") if t < t_drop + HB + ACK + 0.5)
    assert healed_s < HB + ACK + 4, f"healed {healed_s:.1f}s after the drop (pings: 25 s)"
    assert last_pet_on_old - t_drop <= HB + ACK + WATCHDOG_S / 2 + 0.3
    assert "the server's TCP acknowledged no heartbeat" in agent.log_text()
