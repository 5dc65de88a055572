import io
import logging

from agent.clock import FakeClock
from agent.logs import JournalFormatter, RepeatFilter


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


def test_info_lines_are_not_rate_limited():
    clock = FakeClock()
    log, out = make_logger(clock)
    for i in range(50):
        log.info("link up: connection %d", i)
    assert len(out.getvalue().splitlines()) == 50
    assert out.getvalue().startswith("<6>link up")
