from agent.watchdog_gate import WatchdogGate


def test_pets_only_while_link_live_and_all_loops_tick():
    gate = WatchdogGate(require_link=True)
    gate.register("link", 5.0, now=0.0)
    gate.register("uploads", 60.0, now=0.0)
    assert gate.verdict(1.0, link_live=True) == (True, "")
    assert gate.verdict(1.0, link_live=False) == (False, "link not proven live")
    gate.tick("link", 4.0)
    assert gate.verdict(8.0, True) == (True, "")
    assert gate.verdict(9.5, True) == (False, "stalled: link")
    gate.tick("link", 9.6)
    assert gate.verdict(9.7, True) == (True, "")
    assert gate.verdict(61.0, True) == (False, "stalled: link, uploads")


def test_require_link_off_still_catches_stalls():
    gate = WatchdogGate(require_link=False)
    gate.register("link", 5.0, now=0.0)
    assert gate.verdict(3.0, link_live=False) == (True, "")
    assert gate.verdict(5.1, link_live=False)[0] is False


def test_ticks_never_go_backwards_and_unknown_loops_are_ignored():
    gate = WatchdogGate()
    gate.register("link", 5.0, now=10.0)
    gate.tick("link", 2.0)
    gate.tick("nonexistent", 100.0)
    assert gate.stalled(15.0) == []
    gate.unregister("link")
    assert gate.stalled(1000.0) == []
