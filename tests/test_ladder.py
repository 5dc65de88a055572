"""The recovery ladder (agent/screen/ladder.py) on a fake clock: it acts on a bad screen
that persists, never on one sample nor while the display is meant dark, climbs restart,
wake, reboot within each rung's budget, says exhaustion once, and starts again only once
the screen is seen ok. The reboot budget (agent/screen/reboots.py) on real files, across
a day and across simulated reboots: never beyond it."""
import json
import logging
import os
import random

import pytest

from agent.screen import ladder as L
from agent.screen.ladder import (DisplayMeant, Ladder, PictureSeen, PlayerSeen, Policy,
                                 Report, Rung, RungDone, Tick)
from agent.screen import reboots
from agent.screen.reboots import DAY, RebootBook

WAIT = 60.0


def policy(**kw):
    base = dict(enabled=True, player=True, restarts_per_hour=3, reboot=True, wait_s=WAIT)
    return Policy(**{**base, **kw})


def rungs(effects):
    return [e.rung for e in effects if isinstance(e, Rung)]


def reports(effects, kind=None):
    return [e for e in effects if isinstance(e, Report) and (kind is None or e.event_type == kind)]


class Drive:
    """A ladder and its clock: every call moves the clock, feeds one input, keeps the
    effects."""

    def __init__(self, **kw):
        self.ladder = Ladder(policy(**kw))
        self.now = 1000.0
        self.effects = []

    def at(self, dt, event_type, *args):
        self.now += dt
        out = self.ladder.handle(event_type(*args, self.now))
        self.effects += out
        return out

    def picture(self, verdict, dt=60.0):
        return self.at(dt, PictureSeen, verdict)

    def player(self, active, dt=10.0):
        return self.at(dt, PlayerSeen, active)

    def tick(self, dt):
        return self.at(dt, Tick)

    def done(self, rung, ok=True, said="done", dt=1.0):
        self.now += dt
        out = self.ladder.handle(RungDone(rung, ok, said, self.now))
        self.effects += out
        return out


def test_off_it_never_acts_whatever_it_sees():
    d = Drive(enabled=False)
    for _ in range(100):
        d.picture("black", dt=30)
        d.player(False, dt=5)
        d.tick(300)
    assert d.effects == []


def test_one_bad_sample_is_not_acted_on_and_an_ok_between_two_resets_it():
    d = Drive(player=False)
    assert d.picture("black") == [] and d.tick(3000) == []   # one picture, however long
    d = Drive(player=False)
    d.picture("black")
    d.picture("ok")
    assert d.picture("black") == [] and d.tick(20) == []     # a slide caught black, twice
    assert rungs(d.picture("black")) == [L.WAKE_DISPLAY]     # black, black: acted on


def test_a_crashed_player_is_restarted_and_the_screen_said_recovered():
    d = Drive()
    d.player(False)
    assert d.player(False) == [] and d.player(False) == []     # 20 s: not yet
    out = d.player(False)                                       # 30 s, said 4 times
    assert out == [Rung(L.RESTART_PLAYER, "player down")]
    out = d.done(L.RESTART_PLAYER, said="kiosk.service restarted: active (running)")
    assert out == [Report("screen.recovery", {"rung": L.RESTART_PLAYER, "why": "player down",
                                              "ok": True,
                                              "said": "kiosk.service restarted: active (running)"})]
    assert d.ladder.snapshot(d.now)["state"] == L.WAITING
    assert d.player(True) == [Report("screen.recovered", {"after": [L.RESTART_PLAYER],
                                                          "why": "player down"})]
    assert d.ladder.snapshot(d.now)["state"] == L.WATCHING


def test_a_black_screen_climbs_every_rung_then_is_exhausted_once_until_seen_ok():
    d = Drive()
    d.player(True)
    d.picture("black")
    assert rungs(d.picture("black")) == [L.RESTART_PLAYER]
    d.done(L.RESTART_PLAYER)
    d.player(True)       # the player is up, but the picture taken before says nothing
    assert d.tick(WAIT) == []                         # no verdict since the restart
    assert rungs(d.picture("black", dt=5)) == []      # a fresh black, within the wait...
    assert rungs(d.tick(WAIT)) == [L.WAKE_DISPLAY]    # ...at the wait's end: the next rung
    d.done(L.WAKE_DISPLAY, said="display on: confirmed by X11 DPMS (On)")
    d.picture("frozen", dt=30)
    assert rungs(d.tick(WAIT)) == [L.REBOOT]
    d.done(L.REBOOT, said="reboot 1 of 1 a day: asked")
    d.picture("black", dt=30)
    out = d.tick(WAIT)
    assert out == [Report("screen.recovery_exhausted", {
        "why": "picture black", "tried": [L.RESTART_PLAYER, L.WAKE_DISPLAY, L.REBOOT],
        "passed_over": []})]
    for _ in range(50):          # said once: nothing more until the screen is seen ok
        assert d.picture("black") == [] and d.player(False) == [] and d.tick(600) == []
    d.player(True)
    assert d.picture("ok") == [Report("screen.recovered", {
        "after": [L.RESTART_PLAYER, L.WAKE_DISPLAY, L.REBOOT], "why": "picture black"})]
    assert len(reports(d.effects, "screen.recovery_exhausted")) == 1


def test_a_verdict_from_before_the_rung_never_proves_it_failed_for_ever():
    """No verdict after the rung: the wait is drawn out twice, then the last one seen
    stands (the picture check may have stopped speaking)."""
    d = Drive(player=False)
    d.picture("black")
    d.picture("black")
    d.done(L.WAKE_DISPLAY)
    assert d.tick(WAIT) == [] and d.tick(WAIT) == []
    assert rungs(d.tick(WAIT)) == [L.REBOOT]


def test_the_player_budget_per_hour_and_the_backoff_between_episodes():
    d = Drive(restarts_per_hour=3)
    restarted_at, confirm_took = [], []
    for _ in range(4):
        began = d.now
        while True:
            out = d.player(False)
            if rungs(out):
                break
        confirm_took.append(d.now - began)
        if rungs(out) == [L.RESTART_PLAYER]:
            restarted_at.append(d.now)
        d.done(rungs(out)[0])
        d.player(True)                   # back: the episode ends
    assert len(restarted_at) == 3, "a fourth restart within the hour"
    assert rungs(out) == [L.WAKE_DISPLAY]   # the fourth episode passed the restart over
    # each episode within the hour waits twice as long as the one before
    assert confirm_took == [40.0, 70.0, 130.0, 250.0]
    # an hour after the first, a restart is allowed again
    d.tick(L.HOUR)
    d.player(False)
    d.player(False)
    d.player(False)
    assert rungs(d.player(False)) == [L.RESTART_PLAYER]


def test_a_failed_rung_is_said_and_the_next_one_tried_at_once():
    d = Drive(reboot=False)
    d.player(False)
    d.player(False)
    d.player(False)
    d.player(False)
    out = d.done(L.RESTART_PLAYER, ok=False, said="kiosk.service not restarted: systemctl "
                                                   "exited 1: Access denied")
    assert out[0].fields["ok"] is False and rungs(out) == [L.WAKE_DISPLAY]
    d.done(L.WAKE_DISPLAY)
    out = d.player(False, dt=WAIT - 1) + d.tick(1)
    assert reports(out, "screen.recovery_exhausted")[0].fields["passed_over"] == [
        "reboot: not allowed ([commands] allow does not list it, or [screen] "
        "reboots_per_day = 0)"]


def test_a_refused_reboot_ends_the_ladder():
    d = Drive(player=False)
    d.picture("black")
    d.picture("black")
    d.done(L.WAKE_DISPLAY)
    d.picture("black", dt=WAIT)
    out = d.done(L.REBOOT, ok=False, said="not rebooted: 1 of 1 reboots a day spent")
    assert [r.event_type for r in reports(out)] == ["screen.recovery",
                                                   "screen.recovery_exhausted"]
    assert out[1].fields["passed_over"] == ["reboot: not rebooted: 1 of 1 reboots a day spent"]


def test_dark_never_acts_and_holds_a_wait_until_the_display_is_meant_on():
    d = Drive()
    for _ in range(200):       # a night: the display off by the hours, the player dead
        assert d.picture("dark") == [] and d.player(False) == [] and d.tick(30) == []
    d = Drive()
    d.picture("black")
    d.picture("black")
    d.done(L.RESTART_PLAYER)
    d.picture("dark", dt=5)
    for _ in range(20):
        assert d.tick(WAIT) == [] and d.player(True) == []
    assert d.ladder.snapshot(d.now)["state"] == L.HELD
    # on again and black: judged afresh, a whole wait, then the next rung
    d.picture("black", dt=1)
    assert d.tick(WAIT - 2) == []
    assert rungs(d.tick(2)) == [L.WAKE_DISPLAY]


def test_a_display_meant_off_holds_it_where_no_picture_is_checked():
    """No picture check: the hours' word alone keeps a dead player at night from being
    restarted and the display from being woken against them."""
    d = Drive()
    d.at(1, DisplayMeant, True)
    for _ in range(100):
        assert d.player(False) == [] and d.tick(60) == []
    d.at(1, DisplayMeant, False)          # morning: the dead player is seen afresh
    assert d.player(False) == [] and d.player(False) == []
    assert rungs(d.player(False)) == [L.RESTART_PLAYER]       # 31 s, said three times
    d.done(L.RESTART_PLAYER)
    d.at(1, DisplayMeant, True)           # off again, before the restart was judged
    assert d.tick(3 * WAIT) == [] and d.player(False) == [] and d.tick(WAIT) == []
    d.at(1, DisplayMeant, False)
    d.player(False)
    assert rungs(d.tick(WAIT)) == [L.WAKE_DISPLAY]


def test_an_answer_to_nothing_asked_is_not_the_ladders():
    d = Drive()
    assert d.done(L.REBOOT) == [] and d.done(L.RESTART_PLAYER, ok=False) == []
    with pytest.raises(ValueError):
        d.picture("grey")
    with pytest.raises(TypeError):
        d.ladder.handle("black")


def test_without_a_player_unit_the_player_is_not_asked_and_not_restarted():
    d = Drive(player=False)
    assert d.player(False) == [] and d.player(False) == [] and d.tick(600) == []
    d.picture("frozen")
    assert rungs(d.picture("frozen")) == [L.WAKE_DISPLAY]
    assert d.ladder.snapshot(d.now)["player_restarts_left"] is None


@pytest.mark.parametrize("seed", range(40))
def test_whatever_it_sees_it_never_storms_and_never_acts_in_the_dark(seed):
    """Random verdicts, player states and rung answers over two days: the budgets hold
    in every hour, nothing is asked while the last verdict is dark, and exhaustion is
    said at most once an episode."""
    rnd = random.Random(seed)
    d = Drive(restarts_per_hour=rnd.randint(0, 4), player=rnd.random() < 0.8)
    asked, exhausted_since_ok = [], 0
    pending = None
    while d.now < 1000 + 2 * DAY:
        roll = rnd.random()
        if roll < 0.02:
            out = d.at(1, DisplayMeant, rnd.random() < 0.3)
        elif pending and roll < 0.5:
            out = d.done(pending, ok=rnd.random() < 0.7, dt=rnd.uniform(0, 20))
        elif roll < 0.75:
            out = d.picture(rnd.choice(["black", "black", "frozen", "ok", "dark"]),
                            dt=rnd.uniform(0, 90))
        elif roll < 0.95:
            out = d.player(rnd.random() < 0.4, dt=rnd.uniform(0, 20))
        else:
            out = d.tick(rnd.uniform(0, 400))
        for e in out:
            if isinstance(e, Rung):
                assert d.ladder.picture is None or d.ladder.picture.value != "dark"
                assert not d.ladder.meant_dark
                asked.append((d.now, e.rung))
                pending = e.rung
            elif e.event_type == "screen.recovery_exhausted":
                exhausted_since_ok += 1
                assert exhausted_since_ok == 1
                pending = None
            elif e.event_type == "screen.recovered":
                exhausted_since_ok = 0
        if pending and d.ladder.state != L.ACTING:
            pending = None
    limits = {L.RESTART_PLAYER: d.ladder.policy.restarts_per_hour,
              L.WAKE_DISPLAY: d.ladder.policy.wakes_per_hour}
    for t, rung in asked:
        if rung in limits:
            in_hour = [a for a, r in asked if r == rung and t - L.HOUR < a <= t]
            assert len(in_hour) <= limits[rung], (rung, t)
    assert asked, "the random screen was never mended: the test proves nothing"


# -- the reboot budget, across reboots ---------------------------------------------------
class Machine:
    """A screen's clocks across boots: wall time, whether NTP has set it, a boot id."""

    def __init__(self, wall=1_750_000_000.0, synced=True):
        self.wall_now, self.is_synced, self.boots = wall, synced, 0

    def wall(self):
        return self.wall_now

    def synced(self):
        return self.is_synced

    def boot(self):
        return f"boot-{self.boots}"

    def book(self, state_dir, per_day):
        return RebootBook(str(state_dir), per_day, wall=self.wall, synced=self.synced,
                          boot=self.boot)


@pytest.mark.parametrize("per_day", [1, 3])
def test_never_more_reboots_in_any_day_across_reboots(tmp_path, per_day):
    """A screen that is black at every boot: each boot's agent starts with its budget
    read from the file, and asks to reboot ten minutes in. Over four days: never more
    than per_day in any 24 hours, and per_day a day are done (the budget is not merely
    never used)."""
    m = Machine()
    done = []
    start = m.wall_now
    while m.wall_now < start + 4 * DAY:
        book = m.book(tmp_path, per_day)       # a new boot, a new agent
        m.wall_now += 600
        ok, said = book.take()
        if ok:
            done.append(m.wall_now)
            m.boots += 1
            m.wall_now += 90                    # the reboot
        else:
            assert said.startswith(f"not rebooted: {per_day} of {per_day} reboots a day spent")
            m.wall_now += 3600                  # the agent lives on, restarted each hour
    for t in done:
        assert len([u for u in done if t - DAY < u <= t]) <= per_day
    assert len(done) >= 4 * per_day - 1 and len(done) <= 4 * per_day + per_day


def test_an_unsynchronised_clock_that_comes_back_at_each_boot_never_loops(tmp_path):
    """No RTC, no NTP: every boot starts at the same saved time. The clock cannot tell a
    day, so the budget is not given back, ever, until NTP answers; and then a day after
    it answered (the reboots before are placed at that moment)."""
    m = Machine(synced=False)
    saved = m.wall_now
    done = 0
    for boot in range(30):
        m.wall_now, m.boots = saved, boot      # the clock the Pi saved, again
        book = m.book(tmp_path, 2)
        m.wall_now += 600
        done += book.take()[0]
    assert done == 2
    m.wall_now, m.is_synced = saved + 10 * DAY, True  # NTP: days have passed
    book = m.book(tmp_path, 2)
    assert book.left() == 0
    m.wall_now += DAY
    assert book.left() == 2


def test_an_unsynchronised_clock_running_behind_still_counts_the_day(tmp_path):
    """Synced when it rebooted; the next boot's clock is hours behind (the saved time)."""
    m = Machine()
    assert m.book(tmp_path, 1).take()[0]
    m.wall_now -= 3 * 3600
    m.is_synced = False
    assert m.book(tmp_path, 1).left() == 0
    m.wall_now += DAY + 3 * 3600      # NTP set it: a day since the reboot
    m.is_synced = True
    assert m.book(tmp_path, 1).left() == 1


def test_the_file_is_written_durably_only_for_a_reboot_and_bounded(tmp_path):
    m = Machine()
    book = m.book(tmp_path, 10)
    assert os.listdir(tmp_path) == [] and book.left() == 10   # reading writes nothing
    for _ in range(40):
        m.wall_now += 3 * 3600
        assert m.book(tmp_path, 10).take()[0]
    doc = json.loads((tmp_path / reboots.FILE).read_text())
    assert len(doc["reboots"]) == 8         # those of the last day
    assert doc["reboots"][-1] == {"wall": m.wall_now, "synced": True, "boot": "boot-0", "why": ""}
    assert (tmp_path / reboots.FILE).stat().st_mode & 0o777 == 0o600
    assert os.path.getsize(tmp_path / reboots.FILE) < reboots.MAX_BYTES


@pytest.mark.parametrize("content", [b"{not json", b'{"reboots": [{"wall": "x"}]}', b"[]",
                                     b'{"reboots": ' + b"[" * 100000 + b"]",
                                     json.dumps({"reboots": [{"wall": 1.0, "synced": True}] * 17}).encode(),
                                     b'{"reboots": [{"wall": NaN, "synced": true}]}'])
def test_a_damaged_file_is_told_once_and_spends_the_day(tmp_path, caplog, content):
    m = Machine()
    (tmp_path / reboots.FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, "edge_agent.screen"):
        book = m.book(tmp_path, 2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the day's reboots count as spent" in lines[0], lines
    assert book.left() == 0
    ok, said = book.take()
    assert not ok and "2 of 2 reboots a day spent" in said
    assert (tmp_path / reboots.FILE).read_bytes() == content    # not rewritten
    m.wall_now += DAY
    assert book.left() == 2 and book.take()[0]                  # a day later: a good file
    assert len(reboots.parse(json.loads((tmp_path / reboots.FILE).read_bytes()))) == 1


def test_a_file_that_is_a_link_or_a_fifo_is_damaged_not_followed(tmp_path):
    m = Machine()
    target = tmp_path / "elsewhere.json"
    target.write_text('{"reboots": []}')
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(target, state / reboots.FILE)
    assert m.book(state, 1).left() == 0
    os.unlink(state / reboots.FILE)
    os.mkfifo(state / reboots.FILE)
    assert m.book(state, 1).left() == 0     # and not waited on


def test_a_reboot_that_cannot_be_counted_is_not_done(tmp_path):
    not_a_dir = tmp_path / "state"
    not_a_dir.mkdir()
    book = Machine().book(not_a_dir, 1)
    not_a_dir.rmdir()
    not_a_dir.write_text("")      # the state directory gone bad since the start
    ok, said = book.take()
    assert not ok and said.startswith(f"not rebooted: the reboot could not be counted in {not_a_dir}")


def test_a_screen_with_nothing_to_wake_its_display_passes_that_rung_over_saying_why():
    """No display_on_command: the wake would fail at once and hurry the ladder to a
    reboot; it is passed over, with its reason, as a missing player is."""
    ladder = Ladder(Policy(True, True, 3, True, 60.0, wake=False))
    assert not ladder._allowed(L.WAKE_DISPLAY, 0.0)[0]
    assert "display_on_command" in ladder._allowed(L.WAKE_DISPLAY, 0.0)[1]


def test_reboots_made_before_the_clock_was_synchronised_count_a_day_from_when_it_is(tmp_path):
    """A Pi boots on a saved clock that runs behind; NTP then jumps it forward by more
    than a day. The reboots made before are placed at the jump, not aged out by it."""
    clock = {"wall": 1_000_000.0, "synced": False}
    book = RebootBook(str(tmp_path), 1, wall=lambda: clock["wall"],
                      synced=lambda: clock["synced"], boot=lambda: "b")
    assert book.take()[0]
    clock.update(wall=1_000_000.0 + 3 * DAY, synced=True)   # NTP: three days later
    assert book.left() == 0 and not book.take()[0]
    clock["wall"] += DAY
    assert book.left() == 1


def test_why_the_ladder_rebooted_is_kept_with_the_count_and_told_after_the_reboot(tmp_path):
    """The event said before the reboot lives in memory and goes down with it: the reason
    is in the entry written just before, and the first start of the next boot tells it."""
    from agent.screen.mender import Mender
    m = Machine()
    book = m.book(tmp_path, 2)
    assert book.take("screen black")[0]
    m.boots += 1                        # the next boot
    book = m.book(tmp_path, 2)
    told = []
    mender = Mender(Ladder(Policy(True, False, 3, True, 60.0)), told.append, book=book)
    mender.start(cold_start=True)
    mender.stop()
    mender.join(5)
    assert [e.type for e in told] == ["screen.rebooted"]
    assert told[0].details["why"] == "screen black" and told[0].details["reboots_left"] == 1
    again = []                          # the agent restarted within the boot: told once
    mender = Mender(Ladder(Policy(True, False, 3, True, 60.0)), again.append, book=book)
    mender.start(cold_start=False)
    mender.stop()
    mender.join(5)
    assert again == []
