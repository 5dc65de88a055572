"""Identity, sans I/O: every way the token, the server's id and the claim change, and the
shell that puts them on disk before anyone uses them."""
import logging
import random
import threading

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
    service = IdentityService(screentinker(), creds)
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
    again = IdentityService.load("local-1", creds, None, False, pairs_in_link=True)
    assert again.current == service.current
