"""The server's kind from its own answers (identity/server_kind.py), on a fake clock: the
answers are the real servers' (measured against ScreenTinker 1.2, 1.9 and fleet_server/;
tests/test_server_kind_real.py asks the servers themselves)."""
from __future__ import annotations

import json

from agent.base.clock import FakeClock
from agent.identity import kind_record
from agent.identity.server_kind import (AUTO, Answer, KindCore, Probe, Verdict, choose, judge,
                                        needs_enroll_question, record_of)

ST_12 = Answer(200, b'{"hash":"7ceb282e","version":"1.2.0"}')
ST_19 = Answer(200, b'{"hash":"8a56b1cf","version":"1.9.33","latest_version":null,'
                    b'"update_available":false}')
CANNOT_POST = Answer(404, b"<!DOCTYPE html><html><body><pre>Cannot POST /api/v1/enroll</pre>")
FLEET_VERSION = Answer(404, b"404: Not Found")
FLEET_ENROLL = Answer(400, b"device_id required")


def test_the_real_servers_answers_tell_their_kind():
    for answer, version in ((ST_12, "1.2.0"), (ST_19, "1.9.33")):
        assert not needs_enroll_question(answer)
        verdict = judge(answer)
        assert verdict.profile == "screentinker" and version in verdict.why
    assert needs_enroll_question(FLEET_VERSION)
    verdict = judge(FLEET_VERSION, FLEET_ENROLL)
    assert verdict.profile == "edge-agent" and "400" in verdict.why


def test_answers_from_nothing_it_knows_are_not_recognised_and_no_answer_is_none():
    for version, enroll in ((Answer(404, b"{}"), Answer(404, b"{}")),
                            (Answer(200, b"<html>\x00"), Answer(200, b"<html>\x00")),
                            (Answer(200, b'{"version": 3}'), CANNOT_POST),
                            (Answer(302, b""), Answer(302, b""))):
        verdict = judge(version, enroll)
        assert verdict.profile is None and verdict.answered, verdict
        assert "not recognised" in verdict.why and "[server] profile" in verdict.why
    for version in (Answer(500, b"oops"), Answer(failure="ConnectTimeout"), Answer(429)):
        assert not needs_enroll_question(version)
        verdict = judge(version)
        assert verdict.profile is None and not verdict.answered and "no answer" in verdict.why
    # a version string with a terminal's escape is said, not obeyed
    assert "\x1b" not in judge(Answer(200, b'{"hash": "", "version": "1\\u001b[2J"}')).why


def test_asking_a_server_that_never_tells_stays_within_the_backoffs_cap():
    clock = FakeClock()
    core = KindCore()
    core.start(clock.now)
    asked, end = 0, clock.now + 3600
    while core.next_wakeup() <= end:
        clock.advance(max(0.0, core.next_wakeup() - clock.now))
        for action in core.poll(clock.now):
            assert action == Probe() and core.poll(clock.now) == []   # one at a time
            asked += 1
            core.on_verdict(clock.now, judge(Answer(404), Answer(404)))
    # 2 s doubling to 120 s, full jitter: about 60 an hour
    assert 20 <= asked <= 120, asked
    assert not core.settled and core.attempts == asked
    core.on_verdict(clock.now, judge(ST_19))
    assert core.settled and core.poll(clock.now + 1e6) == [] and core.next_wakeup() == float("inf")


def test_an_explicit_profile_wins_and_auto_keeps_what_it_found_for_this_url_only():
    url = "https://signage.example.org"
    found = record_of(url, Verdict("screentinker", "ScreenTinker 1.9.33 answered GET /api/version"))
    assert choose("edge-agent", url, found).profile == "edge-agent"
    assert choose("edge-agent", url, found).how == "configured"
    kept = choose(AUTO, url, found)
    assert (kept.profile, kept.how) == ("screentinker", "recorded") and "1.9.33" in kept.why
    moved = choose(AUTO, "https://other.example.org", found)
    assert moved.how == "detecting" and moved.profile == "edge-agent"   # provisional
    for bad in (None, [], {"url": url, "profile": "nonsense", "why": "x"},
                {"url": url, "profile": "screentinker", "why": 3}):
        assert choose(AUTO, url, bad).how == "detecting"


def test_the_record_survives_a_restart_and_a_bad_one_is_asked_again(tmp_path):
    url = "http://127.0.0.1:1"
    kind_record.save(str(tmp_path), record_of(url, judge(FLEET_VERSION, FLEET_ENROLL)))
    assert json.loads((tmp_path / kind_record.RECORD).read_text())["profile"] == "edge-agent"
    assert kind_record.load(str(tmp_path))["url"] == url
    (tmp_path / kind_record.RECORD).write_bytes(b"\xff" * 10)
    assert kind_record.load(str(tmp_path)) is None
    (tmp_path / kind_record.RECORD).write_bytes(b" " * 10_000)
    assert kind_record.load(str(tmp_path)) is None


def test_doctor_and_status_say_what_the_answers_mean():
    from agent.app import doctor, status
    st = judge(ST_19)
    wrong = doctor.judge_profile("edge-agent", None, st)
    assert wrong.verdict == doctor.FAIL and doctor.exit_status([wrong]) == 6
    assert "does not enroll as edge-agent" in wrong.said and "ScreenTinker 1.9.33" in wrong.said
    assert 'profile = "screentinker"' in wrong.todo
    assert doctor.judge_profile("auto", None, st).verdict == doctor.OK
    assert doctor.judge_profile("screentinker", None, st).verdict == doctor.OK
    moved = doctor.judge_profile("auto", "edge-agent", st)
    assert moved.verdict == doctor.WARN and "server-kind.json" in moved.todo
    lost = doctor.judge_profile("auto", None, judge(Answer(404), Answer(404)))
    assert lost.verdict == doctor.FAIL and "not recognised" in lost.said
    base = {"pid": 1, "version": "x", "device_id": "d", "server": "http://s", "link": {}}
    asking = status.render({**base, "profile": {
        "profile": None, "how": "detecting", "why": lost.said, "attempts": 3,
        "next_try_in_s": 12.0}}, running=False)
    assert "profile     not known yet: the server's kind: not recognised" in asking, asking
    kept = status.render({**base, "profile": {"profile": "screentinker", "how": "recorded",
                                              "why": st.why}}, running=False)
    assert ("profile     screentinker (detected at an earlier start: ScreenTinker 1.9.33 "
            "answered GET /api/version)") in kept, kept


def test_only_a_stop_that_is_the_kinds_own_restart_is_carried_out_as_one(tmp_path):
    """A SIGTERM that came first is a stop, even if the kind is found while stopping."""
    from types import SimpleNamespace
    from agent.identity.kind_probe import ServerKind
    server = SimpleNamespace(profile="auto", url="http://127.0.0.1:9", egress=None)
    stops = []
    kind = ServerKind(server, str(tmp_path), restart=lambda why: stops.append(kind.stopping_for(why)))
    kind._settle(judge(ST_19))   # the provisional build was edge-agent
    assert stops == [True] and kind.restarting
    assert kind_record.load(str(tmp_path))["profile"] == "screentinker"
    late = ServerKind(server, str(tmp_path / "nothing"), restart=lambda why: None)
    assert not late.stopping_for("received SIGTERM")
    late._settle(judge(ST_19))   # the agent is already stopping: its _stop ignores this one
    assert not late.restarting


def test_a_kind_that_cannot_be_recorded_is_no_restart_until_it_is(tmp_path):
    """A restart into the kind found reads it from its record: unrecorded (a card gone
    read-only, a full one), the new process asks again, finds it again and restarts
    again, an exec and two questions to the server each round for as long as it lasts.
    Not restarted until recorded; the record tried again on the backoff."""
    from types import SimpleNamespace
    from agent.identity.kind_probe import ServerKind
    server = SimpleNamespace(profile="auto", url="http://127.0.0.1:9", egress=None)
    blocked = tmp_path / "state"
    blocked.write_text("a file where the state directory belongs")   # every write: ENOTDIR
    restarts = []
    kind = ServerKind(server, str(blocked), restart=restarts.append)
    assert not kind._settle(judge(ST_19))
    assert restarts == [] and "not recorded" in kind.record_error and kind.detecting
    blocked.unlink()
    blocked.mkdir()
    assert kind._settle(judge(ST_19))
    assert len(restarts) == 1 and kind_record.load(str(blocked))["profile"] == "screentinker"
