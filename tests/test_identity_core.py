"""Identity, sans I/O: every way the token, the server's id and the claim change, and the
shell that puts them on disk, and keeps them in use while the disk refuses them."""
import logging
import random
import threading
import time

import pytest

from agent.base.clock import FakeClock
from agent.identity import core as C
from agent.identity.credentials import Credentials
from agent.identity.service import Hooks, IdentityService

TOKEN, OTHER = "t" * 32, "u" * 32


def native(token=None, preprovisioned=False):
    return C.IdentityCore("local-1", C.Identity("local-1", token, bool(token), None),
                          preprovisioned, pairs_in_link=False)


def screentinker(token=None, claimed=False):
    return C.IdentityCore("local-1", C.Identity("local-1", token, claimed, None), False,
                          pairs_in_link=True)


def kinds(effects):
    return [type(e).__name__ for e in effects]


def test_a_revoke_during_an_enrollment_poll_cannot_be_undone_by_its_answer():
    core = native()
    assert kinds(core.handle(C.Revoked())) == ["RestartEnrollment", "Forget", "PauseLink",
                                               "StatusChanged"]
    late = core.handle(C.Enrolled(TOKEN, generation=0))   # the poll that started before
    assert kinds(late) == ["Note"] and "not keeping" in late[0].message
    assert core.current.token is None
    effects = core.handle(C.Enrolled(OTHER, generation=1))
    assert kinds(effects)[0] == "Store" and effects[0].token == OTHER, "stored before used"
    assert "ResumeLink" in kinds(effects) and core.current.token == OTHER


def test_a_refused_token_is_dropped_but_a_preprovisioned_one_never():
    core = native(TOKEN)
    effects = core.handle(C.Refused("HTTP 401"))
    assert kinds(effects)[:2] == ["Note", "RestartEnrollment"] and core.current.token is None
    assert effects[0].level == logging.WARNING
    assert core.handle(C.Refused("HTTP 401")) == [], "nothing left to drop"
    fixed = native(TOKEN, preprovisioned=True)
    for event in (C.Refused("HTTP 401"), C.Revoked(), C.UnpairedByServer()):
        assert kinds(fixed.handle(event)) == ["Note"]
    assert fixed.current.token == TOKEN


def test_screentinker_registration_claim_and_unpairing():
    core = screentinker()
    effects = core.handle(C.Registered(TOKEN, "srv-9", "123456"))
    assert effects[0] == C.Store(TOKEN, "srv-9", "123456", claimed=False)
    assert core.current == C.Identity("srv-9", TOKEN, False, "123456")
    assert core.handle(C.Registered(TOKEN, "srv-9", "123456")) == [], "the same again: no write"
    effects = core.handle(C.Claimed("Lobby"))
    assert effects[0] == C.Store(TOKEN, "srv-9", None, claimed=True)
    assert "ResumeUploads" in kinds(effects) and "'Lobby'" in effects[1].message
    assert core.current == C.Identity("srv-9", TOKEN, True, None)
    assert core.handle(C.Claimed("Lobby")) == []
    assert kinds(core.handle(C.UnpairedByServer())) == ["Forget", "StatusChanged"]
    assert core.current == C.Identity("local-1", None, False, None)
    assert core.handle(C.Claimed("x")) == [], "no token: nothing to claim"


def test_screentinker_revoke_registers_anew_under_our_own_id():
    core = screentinker(TOKEN, claimed=True)
    core.current = C.Identity("srv-9", TOKEN, True, None)
    assert kinds(core.handle(C.Revoked())) == ["Forget", "Reregister", "StatusChanged"]
    assert core.current == C.Identity("local-1", None, False, None)
    assert core.handle(C.Refused("auth")) == [], "that profile's refusals come in the link"


class RecordingCredentials(Credentials):
    def __init__(self, state_dir, service_ref):
        super().__init__(state_dir)
        self.seen_at_save = []
        self.service_ref = service_ref

    def save(self, *a, **kw):
        self.seen_at_save.append(self.service_ref[0].current.token)
        super().save(*a, **kw)


def test_the_shell_stores_before_it_publishes_and_runs_effects_in_order(tmp_path):
    ref = []
    creds = RecordingCredentials(str(tmp_path), ref)
    calls = []
    service = IdentityService(native(), creds, Hooks(
        restart_enrollment=lambda g: calls.append(("restart", g)),
        pause_link=lambda: calls.append("pause"), resume_link=lambda: calls.append("resume"),
        resume_uploads=lambda: calls.append("uploads"),
        status_changed=lambda: calls.append(("status", service.current.token))))
    ref.append(service)
    service.handle(C.Enrolled(TOKEN, generation=0))
    assert creds.seen_at_save == [None], "the new token was in use before it was on disk"
    assert creds.load("local-1") == TOKEN and service.current.token == TOKEN
    assert calls == ["resume", "uploads", ("status", TOKEN)]
    calls.clear()
    service.handle(C.Revoked())
    assert calls == [("restart", 1), "pause", ("status", None)]
    assert creds.load("local-1") is None


def test_events_from_many_threads_leave_disk_and_memory_agreeing(tmp_path):
    creds = Credentials(str(tmp_path))
    clock = FakeClock()
    service = IdentityService(screentinker(), creds, clock=clock)
    rng = random.Random(5)
    events = [rng.choice([C.Registered(f"{i:032d}", f"srv-{i % 3}", "123456"), C.Claimed("x"),
                          C.UnpairedByServer(), C.Revoked()]) for i in range(400)]

    def feed(chunk):
        for e in chunk:
            service.handle(e)

    threads = [threading.Thread(target=feed, args=(events[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    settle(service, clock)
    again = IdentityService.load("local-1", creds, None, False, pairs_in_link=True)
    assert again.current == service.current


def settle(service, clock):
    """Past the write budget's hold: the latest credentials on the disk."""
    clock.advance(C.WRITE_EVERY_S * C.WRITE_BURST)
    deadline = time.monotonic() + 5
    while service.core.unwritten is not None and time.monotonic() < deadline:
        service._timers.poke()
        time.sleep(0.01)
    assert service.core.unwritten is None


def test_a_server_that_hands_out_tokens_without_end_writes_the_card_a_few_times_a_minute(
        tmp_path, caplog):
    """A hostile ScreenTinker sent 2,000 device:registered with alternating tokens: 978
    fsync'd writes in 90 s. The credentials are in use from memory at once, the card
    takes a burst and then one write every WRITE_EVERY_S, the latest, said once."""
    creds = Credentials(str(tmp_path))
    writes = []
    save = creds.save
    creds.save = lambda *a, **k: (writes.append(a[1]), save(*a, **k))
    clock = FakeClock()
    service = IdentityService(screentinker(), creds, clock=clock)
    tokens = [f"{i % 2}" * 32 for i in range(2000)]
    with caplog.at_level(logging.INFO, logger="edge_agent"):
        for i, token in enumerate(tokens):
            service.handle(C.Registered(token, "srv-1", "123456"))
            assert service.current.token == token, "in use at once"
            clock.advance(90 / len(tokens))
    assert len(writes) <= C.WRITE_BURST + 90 / C.WRITE_EVERY_S + 1, len(writes)
    held = [r for r in caplog.records if "held back" in r.getMessage()]
    assert 1 <= len(held) <= 6, [r.getMessage() for r in held]
    settle(service, clock)
    assert IdentityService.load("local-1", creds, None, False, True).current.token == tokens[-1]


def test_a_token_the_disk_refuses_stays_in_use_and_is_written_again_on_a_capped_backoff():
    """The retry schedule, with a fake clock: 1 s doubling to 5 minutes, one attempt at
    a time, quiet while the refusal repeats, and the latest write is the one retried."""
    core, now = native(), 1000.0
    effects = core.handle(C.Enrolled(TOKEN, generation=0))
    assert effects[0] == C.Store(TOKEN) and core.current.token == TOKEN
    said = core.handle(C.WriteFailed(effects[0], "No space left on device", now))
    assert kinds(said) == ["Note", "StatusChanged"] and said[0].level == logging.WARNING
    assert "not stored yet (No space left on device)" in said[0].message and TOKEN not in said[0].message
    assert core.current.token == TOKEN, "in use while the disk is full"
    assert core.storage() == {"stored": False, "pending": "store", "error": "No space left on device",
                              "failed_attempts": 1, "next_try_at": now + 1}
    attempts = []
    t = now
    while t < now + 3600:
        t += 0.25
        for effect in core.due(t):
            assert effect == C.Store(TOKEN) and core.due(t) == [], "one attempt at a time"
            attempts.append(t - now)
            assert core.handle(C.WriteFailed(effect, "No space left on device", t)) == [], \
                "the same refusal again is not logged again"
    gaps = [b - a for a, b in zip([0.0] + attempts, attempts)]
    assert gaps[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert set(gaps[9:]) == {300}, "capped at 5 minutes"
    assert len(attempts) == 19, "an hour of a full disk costs 19 writes, not a hot loop"
    said = core.handle(C.WriteFailed(C.Store(TOKEN), "Read-only file system", t))
    assert kinds(said) == ["Note", "StatusChanged"], "a new reason is said once"
    # a newer write (the claim, here a revoke) replaces the one that waits
    revoke = core.handle(C.Revoked())
    assert C.Forget() in revoke and core.current.token is None
    core.handle(C.WriteFailed(C.Forget(), "Read-only file system", t))
    t = core.next_write_at
    assert core.due(t) == [C.Forget()]
    said = core.handle(C.Written(C.Forget()))
    assert kinds(said) == ["Note", "StatusChanged"] and "after 22 failed attempts" in said[0].message
    assert core.storage() is None and core.next_write_at is None and core.due(t + 1e6) == []
    # and the schedule starts from 1 s again for the next refusal
    store = core.handle(C.Enrolled(OTHER, generation=1))[0]
    core.handle(C.WriteFailed(store, "Input/output error", t))
    assert core.next_write_at == t + 1



def test_a_claim_after_a_spent_budget_is_in_use_at_once_and_on_the_card_at_the_stop(tmp_path):
    """Registrations spend the budget, then the server says the screen is claimed
    and the agent stops: the claim is in use at once (uploads go), waits for the budget
    like anything a server's message changes (else a server that claims after each
    token wears the card: 2,984 fsyncs in 30 s), and is on the card when the agent
    starts again (the stop writes what was held)."""
    creds = Credentials(str(tmp_path))
    clock = FakeClock()
    service = IdentityService(screentinker(), creds, clock=clock)
    last = f"tok{C.WRITE_BURST:02d}" + "x" * 27
    for i in range(C.WRITE_BURST + 1):
        service.handle(C.Registered(f"tok{i:02d}" + "x" * 27, "srv-1", "123456"))
    assert service.core.unwritten is not None, "the one past the burst was held back"
    service.handle(C.Claimed("Lobby"))
    assert service.current.claimed, "in use at once"
    assert not IdentityService.load("local-1", creds, None, False, pairs_in_link=True).current.claimed
    service.flush()
    again = IdentityService.load("local-1", creds, None, False, pairs_in_link=True)
    assert again.current.claimed and again.current.token == last
    service.handle(C.Registered("tok09" + "x" * 27, "srv-1", "123456"))
    service.flush()
    again = IdentityService.load("local-1", creds, None, False, pairs_in_link=True)
    assert again.current.token == "tok09" + "x" * 27


def test_a_pairing_and_a_pairing_again_on_a_quiet_card_are_written_at_once(tmp_path):
    """The burst covers a real pairing (the registration, then the operator's claim),
    and an unpair on the screen and the server's relinking right after it."""
    creds = Credentials(str(tmp_path))
    service = IdentityService(screentinker(), creds, clock=FakeClock())
    for token in ("tok00" + "x" * 27, "tok01" + "x" * 27):
        service.handle(C.Registered(token, "srv-1", "123456"))
        service.handle(C.Claimed("Lobby"))
        assert service.core.unwritten is None
        again = IdentityService.load("local-1", creds, None, False, pairs_in_link=True)
        assert again.current.claimed and again.current.token == token
        service.handle(C.Revoked())


@pytest.mark.parametrize("claims", [True, False])
def test_a_server_that_claims_after_each_new_token_or_unpairs_is_held_to_the_budget(claims):
    """Each token answered as a claimed screen's ("online": a claim follows it), or a
    device:unpaired after each: every synced write a server's message causes spends the
    budget (a removal is an unlink, never synced: not counted)."""
    core, now, writes = screentinker(), 0.0, 0
    for i in range(4000):
        now += 0.005
        events = [C.Registered("ab"[i % 2] * 32, "srv-1", "123456"),
                  C.Claimed("") if claims else C.UnpairedByServer()]
        for event in events:
            for effect in core.handle(event, now) + core.due(now):
                if isinstance(effect, (C.Store, C.Forget)):
                    writes += isinstance(effect, C.Store)
                    core.handle(C.Written(effect))
    assert writes <= C.WRITE_BURST + now / C.WRITE_EVERY_S + 1, writes
