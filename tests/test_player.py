"""The player's unit read and restarted (agent/screen/player.py), and the thread that
watches it and runs the ladder (agent/screen/mender.py).

A real unit in a real systemd is the booted tier's (tests/test_booted_systemd.py); here
systemd does not run, so `systemctl show`'s output is the format systemd documents and
prints (Name=value lines, service properties before the unit's, whatever order they were
asked in), and the runs are a fake unit that answers as systemctl does. The real
systemctl is run once, through the real runner, to prove the bounded path."""
import logging
import time

import pytest

from agent.base.fsutil import loads
from agent.config.model import Screen
from agent.screen import ladder as L
from agent.screen import mender as mender_mod
from agent.screen import reboots
from agent.screen.ladder import Ladder, Policy
from agent.screen.mender import Mender
from agent.screen.player import (PROPERTIES, Player, PlayerState, PlayerWatch, parse_show)
from agent.screen.reboots import DAY, RebootBook

UNIT = "kiosk.service"

# `systemctl show --property=LoadState,ActiveState,SubState,NRestarts,Result,
# ExecMainStatus,ActiveEnterTimestampMonotonic kiosk.service` (systemd 252, bookworm)
RUNNING = b"""Result=success
NRestarts=0
ExecMainStatus=0
LoadState=loaded
ActiveState=active
SubState=running
ActiveEnterTimestampMonotonic=8123456
"""
FAILED = b"""Result=exit-code
NRestarts=5
ExecMainStatus=1
LoadState=loaded
ActiveState=failed
SubState=failed
ActiveEnterTimestampMonotonic=8123456
"""
AUTO_RESTART = b"""Result=signal
NRestarts=2
ExecMainStatus=9
LoadState=loaded
ActiveState=activating
SubState=auto-restart
ActiveEnterTimestampMonotonic=8123456
"""
NOT_FOUND = b"""Result=success
NRestarts=0
ExecMainStatus=0
LoadState=not-found
ActiveState=inactive
SubState=dead
ActiveEnterTimestampMonotonic=0
"""


def test_systemctls_answers_read():
    s = parse_show(UNIT, RUNNING)
    assert s == PlayerState(UNIT, "loaded", "active", "running", 0, "success", 0, 8123456)
    assert s.up and s.known and s.said() == "active (running)"
    s = parse_show(UNIT, FAILED)
    assert not s.up and s.said() == "failed (exit-code, status 1)" and s.restarts == 5
    s = parse_show(UNIT, AUTO_RESTART)
    assert not s.up and s.said() == "activating (signal, status 9)"
    s = parse_show(UNIT, NOT_FOUND)
    assert not s.up and s.said() == "not-found (inactive)"


@pytest.mark.parametrize("raw, expected", [
    (b"", "systemctl show said nothing of the unit's state"),
    (b"\x00\xff" * 1000, "systemctl show said nothing of the unit's state"),
    (b"ActiveState=active\n" * 1000, "systemctl show said more than 4096 bytes"),
    (b"ActiveState=active\x1b[31m\nLoadState=loaded\n", None),
])
def test_what_systemctl_says_is_bounded_and_checked(raw, expected):
    s = parse_show(UNIT, raw)
    assert s.error == (expected or "")
    if expected is None:
        assert s.active is None and s.load == "loaded" and not s.up


def test_only_the_properties_asked_for_each_by_its_rule_the_first_of_each():
    raw = (b"ActiveState=active\nActiveState=failed\nNRestarts=99999999999999999999\n"
           b"ExecMainStatus=-1\nSubState=" + b"r" * 40 + b"\nEvil=rm -rf /\n"
           b"Result=exit code\nLoadState=loaded\n" + b"X=" + b"y" * 3000 + b"\n")
    s = parse_show(UNIT, raw)
    assert (s.active, s.restarts, s.exit_status, s.sub, s.result) == ("active", None, None,
                                                                      None, None)
    assert s.load == "loaded"
    assert parse_show(UNIT, b"X" * 4096 + b"\nActiveState=active\n").error  # past the bound


def test_the_watch_tells_each_change_once():
    w = PlayerWatch()
    assert w.seen(parse_show(UNIT, RUNNING)) == []
    crashed = w.seen(parse_show(UNIT, FAILED))
    assert crashed == [("player.crashed", {"unit": UNIT, "state": "failed", "sub": "failed",
                                           "result": "exit-code", "restarts": 5,
                                           "exit_status": 1})]
    assert w.seen(parse_show(UNIT, FAILED)) == []               # still failed: nothing
    assert w.seen(PlayerState(UNIT, error="systemctl timed out after 5 s")) == []
    back = w.seen(parse_show(UNIT, RUNNING.replace(b"8123456", b"9123456")))
    assert [k for k, _ in back] == ["player.restarted"] and back[0][1]["by"] == "systemd"
    # systemd restarted it between two reads: a crash and its restart, at once
    grew = RUNNING.replace(b"NRestarts=0", b"NRestarts=1")
    assert [k for k, _ in w.seen(parse_show(UNIT, grew))] == ["player.crashed",
                                                             "player.restarted"]
    assert w.seen(parse_show(UNIT, RUNNING)) == []              # the count reset: no crash
    w.restarted_by_agent()
    assert w.seen(parse_show(UNIT, RUNNING))[0][1]["by"] == "the agent"
    assert w.crashes == 2


# an operator's `systemctl stop kiosk.service` of a player that ends on SIGTERM
STOPPED = b"""Result=success
NRestarts=0
ExecMainStatus=0
LoadState=loaded
ActiveState=inactive
SubState=dead
ActiveEnterTimestampMonotonic=8123456
"""
# `kill -9` of its main process, no Restart= of its own
KILLED = STOPPED.replace(b"Result=success", b"Result=signal").replace(
    b"ExecMainStatus=0", b"ExecMainStatus=9").replace(b"ActiveState=inactive",
                                                      b"ActiveState=failed").replace(
    b"SubState=dead", b"SubState=failed")


def test_a_clean_stop_is_player_stopped_never_a_crash_and_a_kill_is_a_crash():
    w = PlayerWatch()
    w.seen(parse_show(UNIT, RUNNING))
    stopped = w.seen(parse_show(UNIT, STOPPED))
    assert [k for k, _ in stopped] == ["player.stopped"], stopped
    assert stopped[0][1]["result"] == "success" and w.crashes == 0
    assert w.seen(parse_show(UNIT, STOPPED)) == []               # still stopped: nothing
    back = w.seen(parse_show(UNIT, RUNNING))                     # started again
    assert [k for k, _ in back] == ["player.restarted"], back
    killed = w.seen(parse_show(UNIT, KILLED))
    assert [k for k, _ in killed] == ["player.crashed"] and killed[0][1]["result"] == "signal"
    assert w.crashes == 1
    # an agent that starts to a player already stopped has seen no stop
    assert PlayerWatch().seen(parse_show(UNIT, STOPPED)) == []


class FakeUnit:
    """The player's unit as systemctl shows and restarts it."""

    def __init__(self):
        self.active, self.sub, self.result, self.restarts, self.status = (
            "active", "running", "success", 0, 0)
        self.entered = 5_000_000
        self.calls = []
        self.refuse = None          # systemctl's failure, in children.failure's words
        self.comes_up = True

    def show(self, argv):
        self.calls.append(argv)
        return (f"Result={self.result}\nNRestarts={self.restarts}\nExecMainStatus="
                f"{self.status}\nLoadState=loaded\nActiveState={self.active}\nSubState="
                f"{self.sub}\nActiveEnterTimestampMonotonic={self.entered}\n").encode(), ""

    def act(self, argv):
        self.calls.append(argv)
        if self.refuse:
            return b"", self.refuse
        if self.comes_up:
            self.active, self.sub, self.result, self.status = "active", "running", "success", 0
            self.entered += 1_000_000
        return b"", ""

    def crash(self):
        self.active, self.sub, self.result, self.status = "failed", "failed", "exit-code", 1


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def player(unit, clock=None, confirm_s=3.0):
    return Player(UNIT, show=unit.show, act=unit.act, clock=clock or Clock(),
                  confirm_s=confirm_s)


def test_restart_asks_systemd_for_that_unit_without_a_password_and_reads_it_back():
    unit = FakeUnit()
    unit.crash()
    p = player(unit)
    assert p.restart() == (True, "kiosk.service restarted: active (running)")
    assert ["systemctl", "restart", "--no-ask-password", "--", UNIT] in unit.calls
    assert unit.calls[0] == ["systemctl", "show", "--property=" + ",".join(PROPERTIES),
                             "--", UNIT]


def test_a_refused_restart_says_why_in_systemctls_words():
    unit = FakeUnit()
    unit.refuse = "systemctl exited 4: Failed to restart kiosk.service: Access denied"
    assert Player(UNIT, show=unit.show, act=unit.act).restart() == (
        False, "kiosk.service not restarted: systemctl exited 4: Failed to restart "
               "kiosk.service: Access denied")


def test_a_restart_that_does_not_bring_it_up_is_no_restart():
    """The same instance still active (the start never happened) is not a restart, and
    the read-back is bounded."""
    unit, clock = FakeUnit(), Clock()
    unit.comes_up = False
    p = player(unit, clock)
    p._stop.wait = lambda s: (setattr(clock, "now", clock.now + s), False)[1]
    ok, said = p.restart()
    assert not ok and said == ("kiosk.service restarted but not active within 3 s: "
                               "active (running)")
    assert sum(c[1] == "show" for c in unit.calls) == 5      # 0, 1, 2, 3 s and before


def test_the_real_systemctl_through_the_real_runner():
    """Bounded and told in systemctl's words: here systemd does not run; where it does,
    a unit nobody has reads not-found."""
    s = Player("edge-agent-test-no-such-unit.service").state()
    assert s.load == "not-found" or s.error.startswith("systemctl exited 1: "), s


# -- the mender: the player watched, the ladder run -------------------------------------
class Rig:
    """A mender on fake clocks over a fake unit: ``run(seconds)`` steps it as its thread
    would, every POLL_S."""

    def __init__(self, tmp_path, *, recovery=True, unit=True, allow=("reboot",),
                 per_day=1, wake_ok=False, wall=1_750_000_000.0, boot="boot-0"):
        self.clock, self.wall_now = Clock(), wall
        self.unit = FakeUnit() if unit else None
        self.events, self.wakes, self.reboots = [], [], []
        self.wake_ok = wake_ok
        section = Screen(player_unit=UNIT if unit else None, recovery=recovery,
                         reboots_per_day=per_day, recovery_wait_s=60.0)
        may_reboot = recovery and "reboot" in allow and per_day > 0
        policy = Policy(enabled=recovery, player=unit, restarts_per_hour=3,
                        reboot=may_reboot, wait_s=60.0)
        self.book = RebootBook(str(tmp_path), per_day, wall=lambda: self.wall_now,
                               synced=lambda: True, boot=lambda: boot) if may_reboot else None
        self.mender = Mender(Ladder(policy), self.events.append,
                             player=player(self.unit, self.clock) if unit else None,
                             book=self.book, wake=self.wake, reboot=self.reboot,
                             clock=self.clock, wall=lambda: self.wall_now)
        assert section.player_unit == (UNIT if unit else None)

    def wake(self):
        self.wakes.append(self.clock.now)
        return self.wake_ok, "display on: " + ("confirmed by X11 DPMS (On)" if self.wake_ok
                                               else "unconfirmed: no source read on")

    def reboot(self):
        self.reboots.append(self.wall_now)
        return True, "asked"

    def run(self, seconds, picture=None):
        end = self.clock.now + seconds
        while self.clock.now < end and not self.reboots:   # a reboot asked: it goes down
            if picture and int(self.clock.now) % 60 == 0:
                self.mender.on_picture(picture)
            self.mender.step()
            self.clock.now += mender_mod.POLL_S
            self.wall_now += mender_mod.POLL_S

    def kinds(self):
        return [e.type for e in self.events]


def test_a_player_that_crashes_is_restarted_by_the_ladder(tmp_path):
    rig = Rig(tmp_path)
    rig.run(60)
    assert rig.events == []
    rig.unit.crash()
    rig.run(120)
    assert rig.kinds() == ["player.crashed", "screen.recovery", "player.restarted",
                           "screen.recovered"]
    recovery = rig.events[1].details
    assert recovery == {"rung": "restart-player", "why": "player down", "ok": True,
                        "said": "kiosk.service restarted: active (running)"}
    assert rig.events[2].details["by"] == "the agent"
    assert rig.wakes == [] and rig.reboots == []
    snap = rig.mender.snapshot()
    assert snap["player"]["state"] == "active (running)" and snap["player"]["crashes_seen"] == 1
    assert snap["recovery"]["player_restarts_left"] == 2
    assert snap["recovery"]["state"] == L.WATCHING
    assert list(tmp_path.iterdir()) == []      # nothing written for the checks


def test_with_recovery_off_the_player_is_still_watched_and_never_touched(tmp_path):
    rig = Rig(tmp_path, recovery=False)
    rig.unit.crash()
    rig.run(3600, picture="black")
    assert rig.kinds() == ["player.crashed"]
    assert not any(c[1] == "restart" for c in rig.unit.calls)
    assert rig.wakes == [] and rig.reboots == []
    assert rig.mender.snapshot()["recovery"]["enabled"] is False


def test_a_black_screen_is_rebooted_once_a_day_across_reboots(tmp_path):
    """No player unit; the wake does not bring the picture back; reboot allowed once a
    day. Each boot is a new agent reading the count from the same state directory."""
    reboots_done = []
    wall = 1_750_000_000.0
    for boot in range(12):            # a boot every two hours or so, for a day and more
        rig = Rig(tmp_path, unit=False, per_day=1, wall=wall, boot=f"b{boot}")
        rig.run(1800, picture="black")
        reboots_done += rig.reboots
        kinds = rig.kinds()
        assert kinds.count("screen.recovery_exhausted") <= 1
        if rig.reboots:
            assert kinds[-1] == "screen.recovery" and rig.events[-1].details["rung"] == "reboot"
            assert rig.events[-1].details["said"] == "reboot 1 of 1 a day: asked"
        else:
            assert kinds[-1] == "screen.recovery_exhausted"
            assert rig.events[-1].details["passed_over"] == [
                "reboot: not rebooted: 1 of 1 reboots a day spent"]
        wall = rig.wall_now + 2 * 3600
    assert len(reboots_done) == 2 and reboots_done[1] - reboots_done[0] >= DAY
    assert len(reboots.parse(loads((tmp_path / reboots.FILE).read_bytes()))) == 1


def test_nothing_is_done_while_the_display_is_meant_off(tmp_path):
    rig = Rig(tmp_path)
    night = [True]
    rig.mender.meant_dark = lambda: night[0]
    rig.unit.crash()
    rig.run(3600)
    assert rig.kinds() == ["player.crashed"]              # told, not touched
    assert not any(c[1] == "restart" for c in rig.unit.calls)
    night[0] = False
    rig.run(120)
    assert "screen.recovered" in rig.kinds()


def test_no_reboot_where_the_allow_list_does_not_have_it(tmp_path):
    rig = Rig(tmp_path, unit=False, allow=())
    rig.run(3600, picture="frozen")
    assert rig.reboots == [] and rig.book is None and list(tmp_path.iterdir()) == []
    assert rig.kinds()[-1] == "screen.recovery_exhausted"


def test_a_verdict_that_is_none_tells_nothing_and_the_thread_starts_and_stops(tmp_path):
    rig = Rig(tmp_path)
    rig.mender.on_picture("capture failed")
    rig.mender.on_picture("dark")
    real = Mender(rig.mender.ladder, rig.events.append, player=rig.mender.player,
                  poll_s=0.05)
    real.on_picture("ok")
    real.start()
    deadline = time.monotonic() + 10
    while real.snapshot()["player"]["state"] is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert real.snapshot()["picture"]["verdict"] == "ok"
    real.stop()
    real.join(5)
    assert not real.loop._thread.is_alive()
    assert rig.mender._pictures[-1][0] == "dark" and len(rig.mender._pictures) == 1


def test_from_config_reads_the_budget_only_where_a_reboot_may_be_done(tmp_path, caplog):
    (tmp_path / reboots.FILE).write_text("damaged")
    with caplog.at_level(logging.WARNING):
        m = mender_mod.from_config(Screen(player_unit=UNIT, recovery=True), ["diagnostics"],
                                   str(tmp_path), publish=lambda e: None,
                                   reboot=lambda: (True, ""))
    assert m.book is None and m.player.unit == UNIT and not caplog.records
    assert m.ladder.policy == Policy(True, True, 3, False, 60.0, wake=False)   # no wake given
    with caplog.at_level(logging.WARNING):
        m = mender_mod.from_config(Screen(recovery=True), ["reboot"], str(tmp_path),
                                   publish=lambda e: None, reboot=lambda: (True, ""))
    assert m.book.left() == 0 and m.player is None and len(caplog.records) == 1
    assert m.ladder.policy.reboot
    m = mender_mod.from_config(Screen(), ["reboot"], str(tmp_path), publish=lambda e: None)
    assert not m.ladder.policy.enabled and m.book is None
    assert m.restart_player() == (False, "no player unit is set ([screen] player_unit)")


def test_a_player_unit_systemd_does_not_have_is_said_once_and_never_mended(tmp_path, caplog):
    """A typo in player_unit (LoadState=not-found, inactive): not a player down for the
    ladder, which would otherwise restart, wake and reboot once a day for ever."""
    rig = Rig(tmp_path)
    rig.mender.player.show = lambda argv: (NOT_FOUND, "")
    with caplog.at_level(logging.ERROR):
        rig.run(3 * 3600, picture="ok")
    assert rig.reboots == [] and rig.wakes == [] and rig.events == []
    said = [r.getMessage() for r in caplog.records if "not watched nor mended" in r.getMessage()]
    assert len(said) == 1 and "is not-found" in said[0]
