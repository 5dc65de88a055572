"""The link thread's sleep (agent/link/wakeup.py), on real time with short intervals."""
import threading
import time

import pytest

from agent.link.wakeup import Wakeup


@pytest.fixture
def wakeup():
    w = Wakeup()
    assert w.cancellable, "no timerfd on this Linux"
    yield w
    w.close()


def slept(wakeup, timeout_s):
    t0 = time.monotonic()
    wakeup.wait(timeout_s)
    return time.monotonic() - t0


def test_an_event_from_another_thread_wakes_it_and_a_quiet_one_waits(wakeup):
    threading.Timer(0.05, wakeup.put, args=("loud",)).start()
    assert slept(wakeup, 5.0) < 1.0
    wakeup.put("quiet", wake=False)
    assert slept(wakeup, 0.2) >= 0.2
    assert wakeup.take_all() == ["loud", "quiet"]
    assert wakeup.take_all() == []


def test_an_armed_deadline_wakes_it_unless_called_off(wakeup):
    wakeup.arm("a", time.monotonic() + 0.05)
    assert 0.04 < slept(wakeup, 5.0) < 1.0
    wakeup.arm("b", time.monotonic() + 0.05)
    threading.Thread(target=wakeup.call_off, args=("b",)).start()
    assert slept(wakeup, 0.3) >= 0.3


def test_only_the_armed_key_calls_it_off(wakeup):
    wakeup.arm("b", time.monotonic() + 0.05)
    wakeup.call_off("a")          # a late ACK of an earlier heartbeat
    assert slept(wakeup, 5.0) < 1.0


def test_a_call_off_before_the_arming_counts(wakeup):
    """On a short round trip the ACK comes back before the link thread goes to sleep."""
    wakeup.call_off("c")
    wakeup.arm("c", time.monotonic() + 0.05)
    assert slept(wakeup, 0.3) >= 0.3
    wakeup.arm("b", time.monotonic() + 60)   # a deadline still armed for an earlier key
    wakeup.call_off("c2")
    wakeup.arm("c2", time.monotonic() + 0.05)
    assert slept(wakeup, 0.3) >= 0.3
    wakeup.arm("d", time.monotonic() + 0.05)
    assert slept(wakeup, 5.0) < 1.0


def test_a_deadline_already_past_wakes_it_at_once(wakeup):
    wakeup.arm("e", time.monotonic() - 1.0)
    assert slept(wakeup, 5.0) < 0.5
