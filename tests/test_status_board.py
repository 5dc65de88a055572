"""The status board is refreshed from every thread: what the file, systemd's line and the
code board show last is what was read last, whichever refresh finishes last."""
from __future__ import annotations

import json
import threading
import time

from agent.app.board import StatusBoard
from agent.app.state_health import StorageHealth
from agent.runtime.systemd import Notifier

CONNECTING = {"state": "connecting", "proven_live": False}
LIVE = {"state": "online", "proven_live": True, "connection": 2}


def test_a_refresh_that_read_before_the_link_went_live_never_overwrites_the_live_one(tmp_path):
    """Seen on CI (a ScreenTinker unpair): the identity thread's refresh for 'credentials
    stored' read the link while it was connecting and wrote after the link thread's
    refresh for the first ACK; the file said 'connecting' until the next change, and the
    link changes nothing per heartbeat."""
    slow_reader_read = threading.Event()
    go_on = threading.Event()
    shown_codes = []
    pairings = iter([{"state": "registered-waiting-for-pairing", "code": "318589"},
                     {"state": "paired"}, {"state": "paired"}])

    def commands():   # the last part a refresh reads: a slow one
        if threading.current_thread().name == "slow-reader":
            slow_reader_read.set()
            assert go_on.wait(5)
        return []

    path = tmp_path / "status.json"
    board = StatusBoard(str(path), Notifier({}), device_id=lambda: "s", server="http://x",
                        storage=StorageHealth(str(tmp_path)), pairing=lambda: next(pairings), link_now=dict,
                        on_pairing=shown_codes.append)
    board.show({**{k: dict for k in ("credentials", "uploads", "events")},
                "journal": list, "commands": commands})
    board.link = CONNECTING
    slow = threading.Thread(target=board.refresh, name="slow-reader")
    slow.start()
    try:
        assert slow_reader_read.wait(5)
        board.link_changed(LIVE)
        live = json.loads(path.read_text())["link"]
        assert live["state"] == "online" and live["proven_live"]
    finally:
        go_on.set()
        slow.join(5)
    assert not slow.is_alive()
    shown = json.loads(path.read_text())
    assert shown["link"]["state"] == "online" and shown["link"]["proven_live"], shown["link"]
    assert shown["pairing"]["state"] == "paired"
    assert shown_codes == [{"state": "paired"}], "an older pairing was shown after a newer one"
    board.refresh()   # the next refresh is shown as ever
    assert shown_codes[-1] == {"state": "paired"} and len(shown_codes) == 2


class SaidLines:
    enabled = True

    def __init__(self):
        self.lines = []

    def status(self, line: str) -> None:
        self.lines.append(line)


def test_the_lines_own_refresh_that_read_before_a_change_never_says_it_after(tmp_path):
    """systemd's line is also said alone, now and then on the link thread (the RTT): a
    turn that read the link before it went live says nothing after the live line."""
    from agent.app import board as board_mod, status
    turn_read = threading.Event()
    go_on = threading.Event()

    def link_now():
        if threading.current_thread().name == "link-turn":
            turn_read.set()
            assert go_on.wait(5)
            return CONNECTING
        return LIVE

    said = SaidLines()
    storage = StorageHealth(str(tmp_path))
    board = StatusBoard(str(tmp_path / "status.json"), said, device_id=lambda: "s",
                        server="http://x", storage=storage, pairing=lambda: {"state": "paired"},
                        link_now=link_now)
    board.show({**{k: dict for k in ("credentials", "uploads", "events")},
                "journal": list, "commands": list})
    turn = threading.Thread(target=board.turn, name="link-turn",
                            args=(time.monotonic() + board_mod.STATUS_REFRESH_S + 1,))
    turn.start()
    try:
        assert turn_read.wait(5)
        board.link_changed(LIVE)
    finally:
        go_on.set()
        turn.join(5)
    assert not turn.is_alive()
    live_line = status.line(LIVE, {"state": "paired"}, storage.snapshot())
    assert said.lines[-1] == live_line, said.lines
    board.turn(time.monotonic() + 2 * board_mod.STATUS_REFRESH_S + 2)   # said again as ever
    assert len(said.lines) == 2 and said.lines[-1] == live_line
