import io
import logging
import re
import sys
import threading

import pytest
import socketio

from agent.base import logs
from agent.base.clock import FakeClock
from agent.base.logs import JournalFormatter, RepeatFilter


def make_logger(clock):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatFilter(window_s=60, clock=clock.monotonic))
    handler.setFormatter(JournalFormatter("%(message)s"))
    logger = logging.getLogger(f"edge_agent.test.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_a_flapping_link_writes_one_line_per_kind_per_window():
    clock = FakeClock()
    log, out = make_logger(clock)
    for _ in range(1000):
        log.warning("link lost: %s, reconnecting in %.1fs", "ack-timeout", 1.5)
        log.warning("link lost: %s, reconnecting in %.1fs", "transport-error", 0.7)
        clock.advance(0.5)
    lines = out.getvalue().splitlines()
    # 500 s of flapping: each kind once per 60 s window
    assert 16 <= len(lines) <= 20
    assert all(line.startswith("<4>") for line in lines)
    assert "more like this in the last" in lines[2]


def test_info_lines_pass_in_a_burst_per_kind_then_are_held_back():
    clock = FakeClock()
    log, out = make_logger(clock)
    for i in range(50):
        log.info("link up: connection %d", i)
    lines = out.getvalue().splitlines()
    assert len(lines) == RepeatFilter.INFO_BURST
    assert lines[0] == "<6>link up: connection 0"
    clock.advance(61)
    log.info("link up: connection %d", 50)
    assert out.getvalue().splitlines()[-1] == \
        "<6>link up: connection 50 (40 more like this in the last 61s)"


def test_kinds_without_end_meet_one_budget_of_lines():
    """A server can make every line a kind of its own (its text in the first argument
    without numbers): the window's budget holds them all."""
    clock = FakeClock()
    log, out = make_logger(clock)
    for i in range(5000):
        log.warning("the server refused the token: %s", "x" * (i % 97) + chr(97 + i % 26) * 3)
    assert len(out.getvalue().splitlines()) == RepeatFilter.LINES_PER_WINDOW
    clock.advance(61)
    log.warning("link lost: %s", "silence")
    assert "lines of other kinds held back in the last window" in out.getvalue().splitlines()[-1]


FORGERIES = ["id\x00<0>forged emergency", "id\n<1>forged alert", "id\r<2>over the line",
             "\x1b]52;c;aGVsbG8=\x07clipboard", "id\x9b31mred", "line\u2028separator"]


@pytest.mark.parametrize("text", FORGERIES)
def test_text_from_outside_is_one_entry_at_its_own_priority(text):
    clock = FakeClock()
    log, out = make_logger(clock)
    handler = log.handlers[0]
    handler.addFilter(logs.OneLine())
    log.info("command %s: done", text)
    written = out.getvalue()
    assert written.count("\n") == 1 and written.endswith("\n")
    assert written.startswith("<6>command ")
    assert not any(c in written[:-1] for c in "\x00\r\x1b\x9b\u2028\x07")
    assert "\\x" in written or "\\n" in written or "\\r" in written or "\\u" in written


def test_every_line_is_bounded_in_length():
    clock = FakeClock()
    log, out = make_logger(clock)
    log.handlers[0].addFilter(logs.OneLine())
    log.info("paired: an operator added this screen as %r", "n" * 900_000)
    assert len(out.getvalue()) < logs.LINE_CHARS + 20


def test_an_early_line_is_cleaned_too():
    out = io.StringIO()
    logs.early("edge-agent-update: refused: order\x00<0>forged", 4, out)
    assert out.getvalue() == "edge-agent-update: refused: order\\x00<0>forged\n"


LIBRARY_LOGGERS = ("edge_agent", "socketio", "engineio", "websocket", "urllib3",
                   "socketio.client", "engineio.client")


@pytest.fixture
def agent_logging(monkeypatch):
    """logs.setup() as the agent runs it, writing to a buffer; the logging of the test
    process put back afterwards."""
    saved = {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level,
                    logging.getLogger(name).propagate) for name in LIBRARY_LOGGERS}
    hook = threading.excepthook
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.setup("info")
    yield out, logging.getLogger("edge_agent").handlers[0]
    threading.excepthook = hook
    for name, (handlers, level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)


def test_what_the_libraries_log_about_500_bad_packets_is_a_few_short_lines(agent_logging):
    out, handler = agent_logging
    client = socketio.Client(logger=False, engineio_logger=False)  # as the transport makes it
    for i in range(500):
        # the library decodes each message on a thread of its own; a bad one kills it
        t = threading.Thread(target=client._handle_eio_message, args=('2["x",{' + str(i),))
        t.start()
        t.join()
        try:
            raise ValueError(f"bad packet {i}")
        except ValueError:
            client.eio.logger.exception("message handler error")
    handler.close()  # as at exit: what was held back is counted
    lines = out.getvalue().splitlines()
    assert len(out.getvalue()) < 2000, out.getvalue()[:3000]
    assert "Traceback" not in out.getvalue()
    died = [line for line in lines if "died" in line]
    assert "JSONDecodeError" in died[0] and "(at json/" in died[0]
    assert re.search(r"held back 499 more like this in the last \d+s: thread .* died: "
                     r"JSONDecodeError$", died[-1])
    handler_errors = [line for line in lines if "message handler error" in line]
    assert "ValueError: bad packet 0" in handler_errors[0]
    assert "held back 499 more like this" in handler_errors[-1]


def test_a_library_line_is_cut_to_a_bound(agent_logging):
    out, _ = agent_logging
    logging.getLogger("engineio.client").error('Unexpected packet: "%s"', "x" * 100_000)
    assert len(out.getvalue()) < 600


def test_an_agent_thread_that_dies_keeps_its_whole_traceback(agent_logging):
    out, _ = agent_logging

    def agent_code():
        raise RuntimeError("a bug of ours")

    t = threading.Thread(target=agent_code, name="link")
    t.start()
    t.join()
    text = out.getvalue()
    assert "ERROR thread link died" in text
    assert "Traceback" in text and "in agent_code" in text and "a bug of ours" in text


def test_a_library_line_is_one_kind_whatever_the_server_put_in_it():
    clock = FakeClock()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatFilter(window_s=60, clock=clock.monotonic))
    log = logging.getLogger("socketio.test-kinds")
    log.handlers[:], log.propagate = [handler], False
    for i in range(300):
        # letters, not numbers: the agent's own kinds already ignore numbers
        log.warning("Unknown namespace %s", "/" + "".join(chr(97 + int(d)) for d in str(i)))
    assert len(stream.getvalue().splitlines()) == 1


def test_a_flood_at_one_level_never_holds_back_the_agents_own_errors():
    """A server varying a name in an info line (a device id per device:registered) spends
    the info budget; the agent's own warnings and errors are written all the same."""
    clock = FakeClock()
    log, out = make_logger(clock)
    for i in range(700):
        log.info("%s", f"registered with the server as st-{'abcdefghij'[i % 10] * (1 + i // 10)}")
    log.error("the link thread died: %s", "a bug of ours")
    log.warning("link lost: %s", "silence")
    lines = out.getvalue().splitlines()
    assert sum(l.startswith("<6>") for l in lines) == RepeatFilter.LINES_PER_WINDOW
    assert "<3>the link thread died: a bug of ours" in lines
    assert "<4>link lost: silence" in lines


def test_debug_lines_meet_a_budget_of_their_own():
    clock = FakeClock()
    log, out = make_logger(clock)
    log.setLevel(logging.DEBUG)
    for i in range(1000):
        log.debug("link news: %s", f"kind-{i}")
    assert len(out.getvalue().splitlines()) == RepeatFilter.LINES_PER_WINDOW


def test_no_bidirectional_or_invisible_character_reaches_a_line():
    text = logs.clean("name \u202eredliated\u202c \u200b\ufeff\u2066x\u2069")
    assert text == "name \\u202eredliated\\u202c \\u200b\\ufeff\\u2066x\\u2069"
