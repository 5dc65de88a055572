"""The agent's records as journald receives them: datagrams of the native protocol on a
real AF_UNIX socket standing in for /run/systemd/journal/socket, with the fields a log
pipeline selects by; stderr when the socket is missing or full; the catalog that
explains the moments, read by the real journalctl."""
import io
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent import __version__
from agent.base import logs
from agent.base.clock import FakeClock
from agent.base.journal_fields import FIELD_CHARS, MESSAGE_IDS, MessageId, datagram, journal
from agent.runtime import crashes

CATALOG = Path(__file__).resolve().parent.parent / "systemd" / "edge-agent.catalog"


def parse(data: bytes) -> dict[str, list[str]]:
    """The native protocol, read as journald reads it: KEY=VALUE lines, or KEY, a
    newline, a little-endian 64-bit length, the bytes and a newline."""
    fields: dict[str, list[str]] = {}
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            name, value = line.split(b"=", 1)
            i = end + 1
        else:
            name = line
            (size,) = struct.unpack("<Q", data[end + 1:end + 9])
            value = data[end + 9:end + 9 + size]
            assert data[end + 9 + size:end + 10 + size] == b"\n", data
            i = end + 10 + size
        fields.setdefault(name.decode(), []).append(value.decode())
    return fields


@pytest.fixture
def journald(tmp_path):
    """A datagram socket where journald's would be; what it received, parsed."""
    path = str(tmp_path / "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0)

    def received() -> list[dict]:
        out = []
        while True:
            try:
                out.append(parse(sock.recv(1 << 20)))
            except BlockingIOError:
                return out
    yield path, received, sock
    sock.close()


@pytest.fixture
def stamped(monkeypatch):
    monkeypatch.setattr(logs, "_STAMP", dict(logs._STAMP))
    logs.stamp(DEVICE_ID="ea-0123456789abcdef")


def native_logger(path: str, clock=None):
    stream = io.StringIO()
    handler = logs.JournalHandler(stream, native=logs.NativeJournal(path))
    if clock is not None:
        handler.repeats.clock = clock.monotonic
    handler.setFormatter(logs.JournalFormatter("%(message)s"))
    logger = logging.getLogger(f"edge_agent.native.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream, handler


def test_a_record_is_one_datagram_with_its_fields(journald, stamped):
    path, received, _ = journald
    log, stream, _ = native_logger(path)
    log.warning("link lost: %s, reconnecting in %.1fs", "tls-untrusted", 2.5,
                extra=journal(MessageId.LINK_LOST, REASON="tls-untrusted", CONNECTION=7))
    [record] = received()
    assert record == {
        "MESSAGE": ["link lost: tls-untrusted, reconnecting in 2.5s"],
        "PRIORITY": ["4"], "SYSLOG_IDENTIFIER": ["edge-agent"],
        "DEVICE_ID": ["ea-0123456789abcdef"], "VERSION": [__version__],
        "REASON": ["tls-untrusted"], "CONNECTION": ["7"],
        "MESSAGE_ID": [MessageId.LINK_LOST]}
    assert stream.getvalue() == ""   # nothing twice


def test_priorities_are_as_on_the_stream(journald, stamped):
    path, received, _ = journald
    log, _, _ = native_logger(path)
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                  logging.CRITICAL):
        log.log(level, "at %s", logging.getLevelName(level))
    assert [r["PRIORITY"] for r in received()] == [["7"], ["6"], ["4"], ["3"], ["2"]]


def test_words_from_outside_in_fields_are_one_clean_bounded_line(journald, stamped):
    """A command id is the server's: it must not start a field or a record of its own,
    nor forge journald's fields, nor grow without bound."""
    path, received, _ = journald
    log, _, _ = native_logger(path)
    hostile = "c-1\nPRIORITY=0\nMESSAGE_ID=forged\x00\x1b]52;c;eA==\x07" + "x" * 5000
    log.info("server command %s (reboot): ok", hostile,
             extra={"journal": {"COMMAND_ID": hostile, "PRIORITY": "0", "_PID": "1",
                                "SYSLOG_IDENTIFIER": "sshd", "lower": "x", "EVENT": None}})
    [record] = received()
    assert record["PRIORITY"] == ["6"] and record["SYSLOG_IDENTIFIER"] == ["edge-agent"]
    assert "_PID" not in record and "lower" not in record and "EVENT" not in record
    assert "MESSAGE_ID" not in record
    [command_id] = record["COMMAND_ID"]
    assert command_id.startswith("c-1\\nPRIORITY=0\\nMESSAGE_ID=forged\\x00\\x1b]52")
    assert len(command_id) == FIELD_CHARS + 3 and command_id.endswith("...")
    [message] = record["MESSAGE"]
    assert "\n" not in message and "\x00" not in message and len(message) <= logs.LINE_CHARS + 3


def test_a_traceback_keeps_its_lines_in_one_record(journald, stamped):
    path, received, _ = journald
    log, _, _ = native_logger(path)
    try:
        raise RuntimeError("a bug of ours\x1b[2J")
    except RuntimeError:
        log.exception("thread %s died", "link")
    [record] = received()
    [message] = record["MESSAGE"]
    lines = message.split("\n")
    assert lines[0] == "thread link died" and lines[1].startswith("Traceback")
    assert lines[-1] == "RuntimeError: a bug of ours\\x1b[2J"
    assert record["PRIORITY"] == ["3"]


def test_the_line_rate_limit_holds_on_the_socket_too(journald, stamped):
    path, received, _ = journald
    clock = FakeClock()
    log, stream, handler = native_logger(path, clock)
    for _ in range(1000):
        log.warning("link lost: %s", "silence", extra=journal(REASON="silence"))
    assert len(received()) == 1
    clock.advance(61)
    log.warning("link lost: %s", "silence", extra=journal(REASON="silence"))
    [record] = received()
    assert record["MESSAGE"] == ["link lost: silence (999 more like this in the last 61s)"]
    assert record["REASON"] == ["silence"]
    handler.close()
    assert stream.getvalue() == ""


CONNECT_FAILED = "connect to %s failed (%s: %s), retrying in %.1fs (attempt %d)"


def test_a_reason_held_back_is_counted_on_the_next_record_of_that_reason(journald, stamped):
    """`journalctl REASON=proxy-unreachable` listed 1 of 3 failures: the link's connect
    line was one kind whatever its reason, so another reason's record passed where this
    one's were held back, and no record of this reason ever said how many."""
    path, received, _ = journald
    clock = FakeClock()
    log, stream, handler = native_logger(path, clock)
    for attempt, reason in enumerate(("proxy-unreachable", "dns-failed", "proxy-unreachable",
                                      "proxy-unreachable")):
        log.warning(CONNECT_FAILED, "https://fleet.example.org", reason, "no answer", 2.0,
                    attempt + 1, extra=journal(REASON=reason))
    first = received()
    assert [r["REASON"] for r in first] == [["proxy-unreachable"], ["dns-failed"]]
    assert not [r for r in first if "HELD_BACK" in r]
    clock.advance(61)
    log.warning(CONNECT_FAILED, "https://fleet.example.org", "proxy-unreachable", "no answer",
                2.0, 5, extra=journal(REASON="proxy-unreachable"))
    [record] = received()
    assert record["REASON"] == ["proxy-unreachable"] and record["HELD_BACK"] == ["2"]
    assert record["MESSAGE"][0].endswith("(attempt 5) (2 more like this in the last 61s)")
    handler.close()
    assert stream.getvalue() == ""


def test_what_is_held_back_at_the_stop_is_said_with_its_reason(journald, stamped):
    """The agent stops with a burst of one reason held back: the line that says so is
    found by the same REASON= and carries the count as a field."""
    path, received, _ = journald
    clock = FakeClock()
    log, stream, handler = native_logger(path, clock)
    for attempt in range(3):
        log.warning(CONNECT_FAILED, "https://fleet.example.org", "proxy-unreachable",
                    "no answer", 2.0, attempt + 1, extra=journal(REASON="proxy-unreachable"))
    assert len(received()) == 1
    clock.advance(5)
    handler.close()
    [said] = received()
    assert said["REASON"] == ["proxy-unreachable"] and said["HELD_BACK"] == ["2"]
    assert said["MESSAGE"][0].startswith("held back 2 more like this in the last 5s: "
                                         "connect to https://fleet.example.org failed")
    assert said["PRIORITY"] == ["4"] and said["DEVICE_ID"] == ["ea-0123456789abcdef"]


def test_no_socket_means_the_line_goes_to_stderr_with_its_priority(tmp_path, stamped):
    log, stream, _ = native_logger(str(tmp_path / "no-journald-here"))
    log.warning("link lost: %s", "silence", extra=journal(REASON="silence"))
    assert stream.getvalue() == "<4>link lost: silence\n"


def test_a_full_socket_never_blocks_and_loses_no_line(journald, stamped):
    """journald's queue full: the send would wait; EAGAIN sends the line to stderr."""
    path, received, _ = journald
    log, stream, handler = native_logger(path)
    handler.native._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sent = [f"line {chr(65 + i % 26) * (i // 26 + 1)} " + "y" * 900 for i in range(100)]
    began = time.monotonic()
    for text in sent:
        log.info("%s", text)   # each its own kind: none held back by the rate limit
    assert time.monotonic() - began < 2
    spilled = [line[3:] for line in stream.getvalue().splitlines()]
    assert spilled, "the socket never filled: the test proved nothing"
    got = [r["MESSAGE"][0] for r in received()]
    assert sorted(got + spilled) == sorted(sent)
    assert all(line.startswith("<6>") for line in stream.getvalue().splitlines())


def test_setup_uses_the_socket_when_stderr_is_the_journal(journald, tmp_path, monkeypatch):
    """As systemd starts the agent: JOURNAL_STREAM names stderr's device and inode."""
    path, received, _ = journald
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in ("edge_agent", "socketio",
                                                                    "engineio", "websocket",
                                                                    "urllib3")}
    hook = threading.excepthook
    monkeypatch.setattr(logs, "_STAMP", dict(logs._STAMP))
    err = open(tmp_path / "stderr", "w")
    st = os.fstat(err.fileno())
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    try:
        logs.setup("info", journal_socket=path)
        names = iter(["ea-first", "ea-renamed"])
        logs.stamp(DEVICE_ID=lambda: next(names))
        logging.getLogger("edge_agent").info("edge-agent %s starting", __version__)
        logging.getLogger("engineio").error("a library's line")
        records = received()
        assert [r["DEVICE_ID"] for r in records] == [["ea-first"], ["ea-renamed"]]
        assert records[1]["MESSAGE"] == ["a library's line"]
        err.flush()
        assert (tmp_path / "stderr").read_text() == ""
        # without the socket: the stream, as before
        logs.setup("info", journal_socket=str(tmp_path / "absent"))
        logging.getLogger("edge_agent").warning("no journald socket")
        err.flush()
        assert (tmp_path / "stderr").read_text() == "<4>no journald socket\n"
    finally:
        err.close()
        threading.excepthook = hook
        for name, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)


def test_device_id_is_one_id_for_the_process_and_the_servers_has_its_own_field(
        journald, stamped, tmp_path):
    """A first run against ScreenTinker: DEVICE_ID changed in the middle of it from this
    screen's own id to the id the server assigned at registration. One id for the whole
    process in DEVICE_ID; the server's id in SERVER_DEVICE_ID once there is one."""
    from agent.identity.credentials import Credentials
    from agent.identity.service import IdentityService
    path, received, _ = journald
    log, _, _ = native_logger(path)
    ids = IdentityService.load("ea-0123456789abcdef", Credentials(str(tmp_path)), None,
                               device_id_configured=False, pairs_in_link=True)
    logs.stamp_ids(ids.core.local_device_id, ids.device_id)
    log.info("edge-agent starting")
    ids.registered("st-token-0123456789", "st-4242", "123456")
    assert ids.device_id() == "st-4242"   # what the link now says to the server
    log.info("link up")
    before, after = received()
    assert before["DEVICE_ID"] == after["DEVICE_ID"] == ["ea-0123456789abcdef"]
    assert "SERVER_DEVICE_ID" not in before and after["SERVER_DEVICE_ID"] == ["st-4242"]
    # the next process starts with the server's id as its current one: the same fields
    again = IdentityService.load("ea-0123456789abcdef", Credentials(str(tmp_path)), None,
                                 device_id_configured=False, pairs_in_link=True)
    assert again.device_id() == "st-4242"
    logs.stamp_ids(again.core.local_device_id, again.device_id)
    log.info("edge-agent starting")
    [record] = received()
    assert (record["DEVICE_ID"], record["SERVER_DEVICE_ID"]) == (["ea-0123456789abcdef"],
                                                                 ["st-4242"])


def test_a_value_with_a_newline_takes_the_binary_safe_form():
    data = datagram([("MESSAGE", "one\ntwo"), ("PRIORITY", "6")])
    assert data == b"MESSAGE\n" + struct.pack("<Q", 7) + b"one\ntwo\nPRIORITY=6\n"
    with pytest.raises(ValueError):
        datagram([("BAD=NAME", "x")])


def test_the_catalog_explains_exactly_the_agents_message_ids(tmp_path):
    """The shipped catalog and the code agree, and journalctl itself reads the catalog
    into its database as Debian's systemd trigger will on the screen."""
    ids = re.findall(r"^-- ([0-9a-f]{32})$", CATALOG.read_text(), re.M)
    assert sorted(ids) == sorted(MESSAGE_IDS.values())
    assert len(set(MESSAGE_IDS.values())) == len(MESSAGE_IDS)
    journalctl = shutil.which("journalctl")
    assert journalctl, "journalctl is missing: .ci/run must install systemd"
    catalog_dir = tmp_path / "usr/lib/systemd/catalog"
    catalog_dir.mkdir(parents=True)
    shutil.copy(CATALOG, catalog_dir)
    subprocess.run([journalctl, f"--root={tmp_path}", "--update-catalog"], check=True,
                   timeout=30)
    listed = subprocess.run([journalctl, f"--root={tmp_path}", "--list-catalog"], check=True,
                            capture_output=True, text=True, timeout=30).stdout
    assert sorted(line.split()[0] for line in listed.splitlines()) == sorted(ids), listed
    assert re.search(rf"^{MessageId.LINK_LOST} edge-agent: Link to the fleet server lost: "
                     r"@REASON@$", listed, re.M), listed


def test_a_killed_run_is_said_at_the_next_start_and_a_stopped_one_is_not(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edge_agent")
    with crashes.watched_run(str(tmp_path)):
        assert (tmp_path / crashes.RUN_MARK).read_text() == str(os.getpid())
    assert not (tmp_path / crashes.RUN_MARK).exists()
    with crashes.watched_run(str(tmp_path)):
        pass
    assert not [r for r in caplog.records if getattr(r, "journal", None)]
    # what a SIGKILL leaves: the mark of a process that never unmarked
    (tmp_path / crashes.RUN_MARK).write_text("4242")
    with crashes.watched_run(str(tmp_path)):
        pass
    [said] = [r for r in caplog.records if getattr(r, "journal", None)]
    assert said.levelno == logging.WARNING and "pid 4242" in said.getMessage()
    assert said.journal == {"MESSAGE_ID": MessageId.RESTARTED_AFTER_KILL}
