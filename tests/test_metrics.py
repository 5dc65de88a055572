"""The metrics' core and shell: the link's journal read into counters and histograms once
each, the status document into gauges whatever it holds, a write on a change and at most
every every_s, and the textfile prometheus_client's own parser reads back."""
from __future__ import annotations

import math
import os
import stat

import pytest

from agent.link.journal import ConnectionJournal
from agent.metrics import service
from agent.metrics.core import MetricsCore, gauges_of

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:   # not a skip: the test stacks install it
    raise ImportError("the metrics tests need prometheus_client: the test extras "
                      "(pip install -e .[test]) and requirements/bookworm.txt carry it") from None


def parsed(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} as Prometheus reads the file."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def render(core: MetricsCore) -> dict:
    return parsed(service.renderer()(core.families()).decode())


def a_heal(journal: ConnectionJournal, t: float) -> None:
    """Connection 1 with two acked heartbeats, lost to a silent drop; one attempt that
    met no DNS; connection 2."""
    journal.opened(t, 1e9, "10.0.0.2:4000", connect_s=0.3)
    journal.current.add_rtt(0.02)
    journal.current.add_rtt(0.04)
    journal.closed(t + 10, "ack-timeout")
    journal.attempt_failed(t + 11, "dns-failed")
    journal.opened(t + 12, 1e9, "10.0.0.2:4001", connect_s=1.5)


def test_the_journal_is_read_into_heals_losses_and_histograms_once_each():
    journal, core = ConnectionJournal(), MetricsCore(15.0)
    assert not core.link(journal)
    a_heal(journal, 100.0)
    assert core.link(journal)
    assert core.heals == {"ack-timeout": 1}
    assert core.losses == {"ack-timeout": 1, "dns-failed": 1}
    assert sum(core.connect.counts) == 2 and core.connect.total == pytest.approx(1.8)
    assert sum(core.rtt.counts) == 2 and core.rtt.total == pytest.approx(0.06)
    assert not core.link(journal), "read again: nothing new"
    assert core.heals == {"ack-timeout": 1} and sum(core.rtt.counts) == 2
    journal.current.add_rtt(0.5)
    assert core.link(journal) and sum(core.rtt.counts) == 3
    # two failures at one instant (a coarse clock): each counted, neither twice
    journal.closed(200.0, "server-disconnect")
    journal.attempt_failed(200.0, "server-disconnect")
    assert core.link(journal) and core.losses["server-disconnect"] == 2
    journal.attempt_failed(200.0, "connection-refused")
    assert core.link(journal) and core.losses["server-disconnect"] == 2
    assert core.losses["connection-refused"] == 1


def test_acks_between_two_reads_and_on_a_connection_already_ended_are_counted():
    journal, core = ConnectionJournal(), MetricsCore(15.0)
    journal.opened(0.0, 1e9, connect_s=0.1)
    journal.current.add_rtt(0.01)
    core.link(journal)
    journal.current.add_rtt(0.01)
    journal.current.add_rtt(0.03)   # the last ack before the loss, read after it
    journal.closed(5.0, "silence")
    core.link(journal)
    assert sum(core.rtt.counts) == 3


def test_a_reason_outside_the_vocabulary_is_said_as_other():
    journal, core = ConnectionJournal(), MetricsCore(15.0)
    journal.attempt_failed(1.0, "x" * 5000)
    core.link(journal)
    assert core.losses == {"other": 1}


def test_written_on_a_change_and_at_most_every_every_s():
    core = MetricsCore(15.0)
    doc = {"link": {"state": "online", "proven_live": True}}
    assert core.document(doc) and core.due(0.0)
    core.written(0.0)
    assert not core.document(doc), "the same numbers are no change"
    assert not core.due(100.0)
    assert core.document({"link": {"state": "waiting"}})
    assert not core.due(14.9) and core.due(15.0)
    core.written(15.0)
    assert core.counts({"ok": 1}, 0) and not core.due(29.0) and core.due(30.0)


def test_the_status_document_becomes_gauges_whatever_it_holds():
    doc = {"version": "0.2.2", "link": {"state": "online", "proven_live": True},
           "uploads": {"items": 3, "bytes": 300, "dead_letter": 1, "oldest_at": 1.7e9},
           "update": {"pending": [], "last": {"outcome": "rolled-back"}},
           "settings": {"revision": 7, "state": "trial", "last": {"result": "kept"}},
           "storage": {"state": "read-only"}}
    g = {(name, labels): value for name, labels, value in gauges_of(doc)}
    assert g[("link_up", ())] == 1 and g[("link_proven_live", ())] == 1
    assert g[("queue_items", ())] == 3 and g[("queue_dead_letters", ())] == 1
    assert g[("queue_oldest_item_timestamp_seconds", ())] == 1.7e9
    assert g[("update_last_outcome", (("outcome", "rolled-back"),))] == 1
    assert g[("update_last_outcome", (("outcome", "committed"),))] == 0
    assert g[("settings_state", (("state", "trial"),))] == 1 and g[("settings_revision", ())] == 7
    assert g[("settings_last_result", (("result", "kept"),))] == 1
    assert g[("storage_state", (("state", "read-only"),))] == 1
    assert g[("info", (("version", "0.2.2"),))] == 1
    hostile = {"version": "1\n# TYPE x counter", "link": "online", "uploads": {"items": "3",
               "bytes": float("inf"), "oldest_at": True}, "update": {"pending": "x", "last": 5},
               "settings": [], "storage": {"state": {"a": 1}}}
    g = {(name, labels): value for name, labels, value in gauges_of(hostile)}
    assert g[("link_up", ())] == 0 and math.isnan(g[("queue_items", ())])
    assert math.isnan(g[("queue_bytes", ())]) and math.isnan(g[("update_pending", ())])
    assert g[("info", (("version", "other"),))] == 1
    assert not any(v for (name, _), v in g.items() if name == "storage_state")


def test_the_text_is_what_prometheus_reads_back():
    journal, core = ConnectionJournal(), MetricsCore(15.0)
    a_heal(journal, 100.0)
    core.link(journal)
    core.counts({"ok": 2, "error": 1, "refused": 3}, 7)
    core.document({"link": {"state": "online", "proven_live": True},
                   "uploads": {"items": 0, "bytes": 0, "dead_letter": 0, "oldest_at": None}})
    m = render(core)
    assert m[("edge_agent_link_heals_total", frozenset({("reason", "ack-timeout")}))] == 1
    assert m[("edge_agent_link_losses_total", frozenset({("reason", "dns-failed")}))] == 1
    assert m[("edge_agent_link_connect_seconds_count", frozenset())] == 2
    assert m[("edge_agent_link_connect_seconds_bucket", frozenset({("le", "0.5")}))] == 1
    assert m[("edge_agent_link_connect_seconds_bucket", frozenset({("le", "+Inf")}))] == 2
    assert m[("edge_agent_link_heartbeat_rtt_seconds_count", frozenset())] == 2
    assert m[("edge_agent_link_heartbeat_rtt_seconds_sum", frozenset())] == pytest.approx(0.06)
    assert m[("edge_agent_commands_total", frozenset({("result", "refused")}))] == 3
    assert m[("edge_agent_watchdog_pets_total", frozenset())] == 7
    assert m[("edge_agent_link_up", frozenset())] == 1
    assert m[("edge_agent_queue_items", frozenset())] == 0
    assert math.isnan(m[("edge_agent_queue_oldest_item_timestamp_seconds", frozenset())])


def test_the_shell_writes_the_file_readable_by_node_exporter_and_empties_it_on_stop(tmp_path):
    old = os.umask(0o077)   # the unit's UMask=0077, for what the shell makes
    try:
        _writes_and_removes(tmp_path)
    finally:
        os.umask(old)


def _writes_and_removes(tmp_path):
    now = [0.0]
    journal = ConnectionJournal()
    path = str(tmp_path / "run" / "metrics" / "edge-agent.prom")
    metrics = service.Metrics(path, 15.0, journal=lambda: journal, counts=lambda: ({}, 0),
                              render=service.renderer(), clock=lambda: now[0])
    metrics.document({"link": {"state": "online", "proven_live": True}})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644, "node_exporter's user reads it"
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    assert parsed(open(path).read())[("edge_agent_link_up", frozenset())] == 1
    metrics.document({"link": {"state": "waiting"}})
    assert parsed(open(path).read())[("edge_agent_link_up", frozenset())] == 1, "not yet due"
    now[0] = 15.0
    metrics.turn(now[0])
    assert parsed(open(path).read())[("edge_agent_link_up", frozenset())] == 0
    assert not [n for n in os.listdir(os.path.dirname(path)) if n != "edge-agent.prom"], \
        "no temporary file left beside it"
    metrics.stop()
    assert os.path.getsize(path) == 0, "no series once the agent stops"
    # a text shorter than the file's: padded with blank lines, never the old one's tail
    open(path, "wb").write(b"x 1\n" * 100)
    metrics = service.Metrics(path, 15.0, journal=lambda: journal, counts=lambda: ({}, 0),
                              render=service.renderer(), clock=lambda: now[0])
    assert os.path.getsize(path) == 0, "what a killed process left is emptied at the start"
    open(path, "wb").write(b"x 1\n" * 1000)
    metrics.document({"link": {"state": "online", "proven_live": True}})
    text = open(path).read()
    assert "x 1" not in text and parsed(text)[("edge_agent_link_up", frozenset())] == 1
    # a FIFO or a link there is never written through nor waited on: said, not hung
    for plant in (os.mkfifo, lambda p: os.symlink("/etc/passwd", p)):
        os.unlink(path)
        plant(path)
        now[0] += 15.0
        metrics.document({"link": {"state": "online" if now[0] % 2 else "waiting"}})
    assert open("/etc/passwd").read().startswith("root:")


def test_a_textfile_that_cannot_be_written_is_said_once_and_the_agent_goes_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    now = [0.0]
    metrics = service.Metrics(str(blocker / "m" / "edge-agent.prom"), 1.0,
                              journal=ConnectionJournal, counts=lambda: ({}, 0),
                              render=service.renderer(), clock=lambda: now[0])
    for i in range(3):
        now[0] = float(i * 2)
        metrics.document({"link": {"state": "online" if i % 2 else "waiting"}})
    assert caplog.text.count("cannot write the metrics textfile") == 1


def test_off_by_default_and_the_path_from_the_runtime_directory(tmp_path):
    from agent.config import load
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[server]\nurl = "http://127.0.0.1:1"\n[identity]\ndevice_id = "s"\n'
                   'token = "t"\n')
    config = load.load(str(cfg), {})
    assert config.metrics.enabled is False
    assert service.from_config(config.metrics, "/run/x", journal=ConnectionJournal,
                               counts=lambda: ({}, 0)) is None
    assert load.load(str(cfg), {"EDGE_AGENT_RUNTIME_DIR": "/run/x"}).metrics_path == \
        "/run/x-metrics/edge-agent.prom"
    cfg.write_text(cfg.read_text() + '[metrics]\ntextfile = "/run/x/metrics.txt"\n')
    with pytest.raises(load.ConfigError, match="ending in .prom"):
        load.load(str(cfg), {})


def test_the_screen_and_the_package_are_series_an_alert_can_say():
    """What matters most on a screen: the picture's verdict, the player, the recovery
    ladder (its state, the rungs it ran), and whether apt offers a version the screen
    does not run; a value from outside the vocabulary is no series of its own."""
    doc = {"screen": {"picture": {"verdict": "frozen"},
                      "player": {"unit": "kiosk.service", "active": False, "restarts": 4},
                      "recovery": {"enabled": True, "state": "exhausted",
                                   "taken": {"restart-player": 2, "wake-display": 1}}},
           "update": {"installed": "0.3.0-1", "repository": {
               "newest": "0.3.1-1", "behind": True, "apt_success_at": 1.7e9}}}
    core = MetricsCore(15.0)
    core.document(doc)
    m = render(core)
    assert m[("edge_agent_screen_picture_verdict", frozenset({("verdict", "frozen")}))] == 1
    assert m[("edge_agent_screen_picture_verdict", frozenset({("verdict", "ok")}))] == 0
    assert m[("edge_agent_screen_player_up", frozenset())] == 0
    assert m[("edge_agent_screen_player_restarts", frozenset())] == 4
    assert m[("edge_agent_screen_recovery_state", frozenset({("state", "exhausted")}))] == 1
    assert m[("edge_agent_screen_recovery_state", frozenset({("state", "watching")}))] == 0
    assert m[("edge_agent_screen_recovery_rungs_total", frozenset({("rung", "restart-player")}))] == 2
    assert m[("edge_agent_screen_recovery_rungs_total", frozenset({("rung", "reboot")}))] == 0
    assert m[("edge_agent_package_info", frozenset({("installed", "0.3.0-1"),
                                                    ("newest", "0.3.1-1")}))] == 1
    assert m[("edge_agent_package_behind", frozenset())] == 1
    assert m[("edge_agent_apt_update_success_timestamp_seconds", frozenset())] == 1.7e9
    # held: the ladder's long words said short; a player unread: NaN; no apt: no series
    core.document({"screen": {"picture": {"verdict": "dark\n"}, "player": {"active": None},
                              "recovery": {"enabled": True,
                                           "state": "held: the display is meant dark"}},
                   "update": {"installed": "", "repository": None}})
    m = render(core)
    assert m[("edge_agent_screen_recovery_state", frozenset({("state", "held")}))] == 1
    assert not any(v for (name, _), v in m.items() if name == "edge_agent_screen_picture_verdict")
    assert math.isnan(m[("edge_agent_screen_player_up", frozenset())])
    assert not [name for name, _ in m if name.startswith(("edge_agent_package", "edge_agent_apt"))]
    # a screen without a player or a ladder: only the verdict's series, all 0
    core.document({})
    m = render(core)
    assert not [n for n, _ in m if n.startswith(("edge_agent_screen_player",
                                                 "edge_agent_screen_recovery"))]
    assert ("edge_agent_screen_picture_verdict", frozenset({("verdict", "ok")})) in m
