"""The metrics of a real agent against the real reference fleet server: a silent drop
healed, a command run and one refused, and the textfile in the runtime directory read
back with prometheus_client's own parser (what node_exporter's textfile collector
checks it against)."""
import time

import pytest

from devtools.harness import agent_config, wait_for

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:   # not a skip: the test stacks install it
    raise ImportError("the metrics tests need prometheus_client: the test extras "
                      "(pip install -e .[test]) and requirements/bookworm.txt carry it") from None

pytestmark = pytest.mark.netns

HB, ACK = 2.0, 1.0


def read(path) -> dict:
    """{(sample name, frozenset(labels)): value}, or {} before the first write."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_textfile_of_a_running_agent_says_its_link_heals_and_commands(
        netns, fleet, spawn_agent, agent_python, tmp_path):
    server = fleet()
    agent = spawn_agent(agent_python, agent_config(
        server, tmp_path, metrics={"enabled": True, "every_s": 1.0}))
    textfile = tmp_path / "run-metrics" / "edge-agent.prom"
    link = agent.wait_live(15, connection=1)
    up = wait_for(lambda: read(textfile).get(("edge_agent_link_proven_live", frozenset())) == 1,
                  10, what="the textfile to say the link is proven live")
    assert up
    ran = server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "diagnostics",
                                            "args": {}})
    refused = server.admin("/api/v1/commands", {"device_id": "screen-1", "name": "reboot",
                                                "args": {}})
    assert ran and refused
    local_port = int(link["local_addr"].rsplit(":", 1)[1])
    netns.drop_flow(local_port, server.port)
    agent.wait_live(HB + ACK + 10, connection=2)

    def healed():
        m = read(textfile)
        return m if (m.get(("edge_agent_link_heals_total", frozenset({("reason", "ack-timeout")})))
                     == 1 and m.get(("edge_agent_link_proven_live", frozenset())) == 1
                     and m.get(("edge_agent_commands_total", frozenset({("result", "ok")}))) == 1
                     and m.get(("edge_agent_commands_total",
                                frozenset({("result", "refused")}))) == 1) else None
    m = wait_for(healed, 35, interval=0.2, what="the textfile to say the heal and the commands")
    assert m[("edge_agent_link_up", frozenset())] == 1
    assert m[("edge_agent_link_losses_total", frozenset({("reason", "ack-timeout")}))] == 1
    assert m[("edge_agent_link_connections_total", frozenset())] == 2
    assert m[("edge_agent_link_connect_seconds_count", frozenset())] == 2
    assert 0 < m[("edge_agent_link_connect_seconds_sum", frozenset())] < 2 * 2.0
    rtts = m[("edge_agent_link_heartbeat_rtt_seconds_count", frozenset())]
    assert rtts >= 2, "heartbeats acked on both connections"
    assert 0 < m[("edge_agent_link_heartbeat_rtt_seconds_sum", frozenset())] / rtts < ACK
    assert m[("edge_agent_commands_total", frozenset({("result", "error")}))] == 0
    assert m[("edge_agent_queue_items", frozenset())] == 0
    assert m[("edge_agent_queue_dead_letters", frozenset())] == 0
    assert m[("edge_agent_storage_state", frozenset({("state", "ok")}))] == 1
    assert m[("edge_agent_settings_state", frozenset({("state", "none")}))] == 1
    assert ("edge_agent_watchdog_pets_total", frozenset()) in m
    # written on a change and at most every second, never per heartbeat for nothing
    writes, t_end = set(), time.time() + 3 * HB
    while time.time() < t_end:
        writes.add(textfile.stat().st_mtime_ns)
        time.sleep(0.05)
    assert len(writes) <= 3 * HB / 1.0 + 1
    assert "metrics:" in agent.log_text()
    agent.stop()
    assert textfile.stat().st_size == 0, "the numbers end with the process"
