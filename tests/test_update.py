"""Self-update, below the booted system: the order's rules and the root side's verdicts
on a fake clock, the signature checked by Debian's gpgv against a key made with gnupg,
and the agent's download from the reference server (a cut resumed with a range, a
wrong checksum refused) up to the staged order the root side reads.

The install, the proof and the rollback under real dpkg, polkit and systemd are in
tests/test_booted_systemd.py."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import stat
from pathlib import Path

import pytest

from agent.commands.core import CommandCore, Received, Recovered, Report
from agent.base.egress import Egress
from agent.base.http import fleet_url
from agent.update import rules
from agent.update.rules import NotStaged
from agent.update.service import Updater
from agent.update.signature import SignatureError, verify
from devtools.harness import FleetServerProcess, wait_for
from devtools.releases import SigningKey

SHA = "a" * 64
SIG = base64.b64encode(b"\x89sig").decode()


def args(**over):
    a = {"version": "0.2.0-1", "url": "/releases/x.deb", "size": 1000, "sha256": SHA,
         "signature": SIG}
    a.update(over)
    return a


# -- the order -------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [
    ("version", "latest"), ("version", "1.0; rm -rf /"), ("version", "x" * 80),
    ("version", "0.2.0-1\n"), ("sha256", "a" * 64 + "\n"),
    ("url", ""), ("url", "/a\nb"), ("size", 0), ("size", rules.MAX_PACKAGE_BYTES + 1),
    ("size", True), ("sha256", "A" * 64), ("sha256", "a" * 63), ("signature", "!!"),
    ("signature", ""), ("signature", base64.b64encode(b"x" * 5000).decode()),
    ("window_s", -1), ("window_s", rules.MAX_WINDOW_S + 1), ("retry", "yes"), ("extra", 1)])
def test_a_malformed_order_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError) as e:
        rules.order_args(args(**{field: value}))
    assert str(e.value).startswith(field if field != "extra" else "unknown argument extra")


def test_an_order_is_an_update_command_the_core_checks_and_the_allow_list_gates():
    core = CommandCore(frozenset({"diagnostics"}))
    [_, report] = core.handle(Received({"id": "u1", "name": "update", "args": args()},
                                       100.0, 100.0))
    assert "not allowed" in report.result["error"]
    core = CommandCore(frozenset({"update"}))
    [_, report] = core.handle(Received({"id": "u2", "name": "update",
                                        "args": args(size=-1)}, 100.0, 100.0))
    assert report.result["error"].startswith("bad argument: size")
    [_, run] = core.handle(Received({"id": "u3", "name": "update", "args": args()},
                                    100.0, 100.0))
    assert run.name == "update" and run.args["version"] == "0.2.0-1"


def test_the_package_comes_from_the_fleet_server_and_nowhere_else():
    server = "https://fleet.example:8443/"
    assert fleet_url("/releases/a.deb", server) == "https://fleet.example:8443/releases/a.deb"
    assert fleet_url("https://FLEET.example:8443/a.deb", server) \
        == "https://fleet.example:8443/a.deb"
    for elsewhere in ("https://evil.example/a.deb", "http://fleet.example:8443/a.deb",
                      "https://fleet.example/a.deb", "//evil.example/a.deb", "file:///etc/shadow",
                      # two parsers, two hosts: urllib3 (which connects) reads evil.example
                      "https://evil.example:8443\\@fleet.example:8443/a.deb",
                      "https://user:pw@fleet.example:8443/a.deb", "https://@fleet.example:8443/a",
                      "/a b.deb", "\\\\evil.example\\a.deb", "releases/a.deb"):
        with pytest.raises(ValueError) as e:
            fleet_url(elsewhere, server)
        assert str(e.value).startswith("url: ")


def test_what_stops_an_order_here():
    o = rules.order(args())
    assert rules.refusal(o, installed="0.2.0-1", history=[], free_bytes=1 << 40) \
        == "edge-agent 0.2.0-1 is already installed"
    back = [{"id": "old", "to": "0.2.0-1", "outcome": rules.ROLLED_BACK, "reason": "its link"}]
    why = rules.refusal(o, installed="0.1.0-1", history=back, free_bytes=1 << 40)
    assert "rolled back here (its link)" in why and "retry" in why
    # asked again explicitly: it goes
    assert rules.refusal(rules.order(args(retry=True)), installed="0.1.0-1", history=back,
                         free_bytes=1 << 40) is None
    # a later success of the same version clears it
    later = back + [{"id": "new", "to": "0.2.0-1", "outcome": rules.COMMITTED}]
    assert rules.refusal(o, installed="0.1.0-1", history=later, free_bytes=1 << 40) is None
    why = rules.refusal(o, installed="0.1.0-1", history=[], free_bytes=rules.space_needed(1000) - 1)
    assert why.startswith("not enough space")


def test_a_fleet_told_at_once_installs_spread_over_the_window():
    rng = random.Random(7)
    delays = [rules.install_delay(3600, rng) for _ in range(1000)]
    assert 0 <= min(delays) and max(delays) < 3600
    per_minute = [sum(1 for d in delays if m * 60 <= d < (m + 1) * 60) for m in range(60)]
    assert max(per_minute) < 40, "a minute with most of the fleet in it"
    assert rules.install_delay(0, rng) == 0.0


# -- the root side's verdicts ------------------------------------------------------------
def proof(**over):
    p = {"installed": "0.2.0-1", "fresh": True, "proven_live": True, "restarts": 0}
    p.update(over)
    return rules.Proof(**p)


def test_kept_only_when_the_new_agent_proves_its_link():
    assert rules.verdict("0.2.0-1", proof(), 10, 180) == ("commit", "")
    # the agent from before the install saying so proves nothing
    assert rules.verdict("0.2.0-1", proof(fresh=False), 10, 180)[0] == "wait"
    assert rules.verdict("0.2.0-1", proof(proven_live=False), 179.9, 180)[0] == "wait"
    action, why = rules.verdict("0.2.0-1", proof(proven_live=False), 180, 180)
    assert action == "rollback" and "not proven live in time" in why


def test_a_crash_loop_is_rolled_back_without_waiting_for_the_deadline():
    action, why = rules.verdict("0.2.0-1", proof(proven_live=False, restarts=3), 20, 180)
    assert action == "rollback" and "crash loop" in why


def test_a_crash_loop_tells_the_fleet_the_new_agents_last_error(monkeypatch):
    """What the journal holds at priority err since the install, and only that: the old
    version's errors before it, and the lines of other boots, are not the new one's."""
    import subprocess as sp

    import agent.programs.installer as inst
    lines = [{"__MONOTONIC_TIMESTAMP": "900", "MESSAGE": "an old version's error"},
             {"__MONOTONIC_TIMESTAMP": "2000", "MESSAGE": "edge-agent run: crashed: "
              "ImportError: cannot import name 'x' (at agent/app/daemon.py:12 in <module>)\x1b[2J"},
             {"__MONOTONIC_TIMESTAMP": "2100", "MESSAGE": [1, 2]}]
    seen = []

    def journalctl(argv, **kw):
        seen.append(argv)
        return sp.CompletedProcess(argv, 0, "\n".join(json.dumps(l) for l in lines).encode(), b"")

    monkeypatch.setattr(inst.subprocess, "run", journalctl)
    said = inst.last_error(since_us=1000)
    assert said.startswith("edge-agent run: crashed: ImportError: cannot import name 'x' "
                           "(at agent/app/daemon.py:12 in <module>)") and "\x1b" not in said
    assert "--boot" in seen[0] and "--priority=err" in seen[0]
    action, why = rules.verdict("0.2.0-1", proof(proven_live=False, restarts=3,
                                                 last_error=said), 20, 180)
    assert why.endswith("(a crash loop): " + said)


def test_a_package_that_is_not_the_one_installed_is_rolled_back():
    action, why = rules.verdict("0.2.0-1", proof(installed=""), 1, 180)
    assert action == "rollback" and "not what dpkg has installed" in why


def test_after_a_power_cut_an_install_is_undone_and_an_installed_package_proven_again():
    assert rules.after_power_loss(rules.INSTALLING) == "rollback"
    assert rules.after_power_loss(rules.ROLLING_BACK) == "rollback"
    assert rules.after_power_loss("garbage") == "rollback"
    assert rules.after_power_loss(rules.PROVING) == "prove"


def test_outcomes_are_said_as_results_and_the_history_stays_bounded():
    entry = {"id": "u", "from": "0.1.0-1", "to": "0.2.0-1", "outcome": rules.ROLLED_BACK,
             "reason": "its link was not proven live in time", "took_s": 64.2}
    assert rules.describe(entry) == (False, "rolled back from 0.2.0-1 to 0.1.0-1 in 64s: its "
                                            "link was not proven live in time")
    assert rules.describe({**entry, "outcome": rules.COMMITTED})[0] is True
    history = []
    for i in range(30):
        history = rules.remember(history, {"id": str(i)})
    assert len(history) == rules.HISTORY and history[-1]["id"] == "29"


# -- the signature, by gpgv ----------------------------------------------------------------
@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    base = tmp_path_factory.mktemp("keys")
    trusted, stranger = SigningKey(base / "trusted"), SigningKey(base / "stranger", "stranger")
    keys_dir = base / "update-keys"
    keys_dir.mkdir(mode=0o755)
    (keys_dir / "release.gpg").write_bytes(trusted.keyring.read_bytes())
    return trusted, stranger, keys_dir


def test_a_package_signed_by_an_installed_key_is_trusted_and_no_other(keys, tmp_path):
    trusted, stranger, keys_dir = keys
    package = tmp_path / "edge-agent.deb"
    package.write_bytes(os.urandom(4096))
    good = trusted.sign(package).read_bytes()
    assert len(verify(str(package), good, str(keys_dir))) == 40   # the key's fingerprint
    with pytest.raises(SignatureError, match="not installed"):
        verify(str(package), stranger.sign(package).read_bytes(), str(keys_dir))
    with pytest.raises(SignatureError, match="not an OpenPGP signature"):
        verify(str(package), b"\x00" * 100, str(keys_dir))
    tampered = bytearray(package.read_bytes())
    tampered[100] ^= 1
    package.write_bytes(bytes(tampered))
    with pytest.raises(SignatureError, match="bad signature"):
        verify(str(package), good, str(keys_dir))


def test_keys_only_root_can_write_and_no_link_among_them(keys, tmp_path):
    trusted, _, keys_dir = keys
    package = tmp_path / "p.deb"
    package.write_bytes(b"x")
    sig = trusted.sign(package).read_bytes()
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "release.gpg").write_bytes(trusted.keyring.read_bytes())
    os.chmod(loose, 0o777)
    with pytest.raises(SignatureError, match="only root can write"):
        verify(str(package), sig, str(loose))
    os.chmod(loose, 0o755)
    os.chmod(loose / "release.gpg", 0o666)
    with pytest.raises(SignatureError, match="only root can write"):
        verify(str(package), sig, str(loose))
    (loose / "release.gpg").unlink()
    (loose / "release.gpg").symlink_to(trusted.keyring)
    with pytest.raises(SignatureError, match="not a regular file"):
        verify(str(package), sig, str(loose))
    with pytest.raises(SignatureError, match="does not exist"):
        verify(str(package), sig, str(tmp_path / "none"))


# -- the agent's side, against the reference server --------------------------------------
@pytest.fixture
def server(tmp_path):
    s = FleetServerProcess(tmp_path).start()
    yield s
    s.stop()


def publish(server, data: bytes) -> dict:
    import urllib.request
    req = urllib.request.Request(server.url + "/api/v1/releases", data=data,
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def updater(url, tmp_path, keys_dir, settled, systemctl):
    root = tmp_path / "root-side"
    root.mkdir(exist_ok=True)
    return Updater(url, Egress(), str(tmp_path / "state"), 2.0,
                   settled=lambda *a: settled.append(a), root_dir=str(root),
                   keys_dir=str(keys_dir), systemctl=str(systemctl))


def fake_systemctl(tmp_path) -> Path:
    """Stands in for `systemctl start` (polkit and the root unit are the booted tier's):
    records what it was asked."""
    path = tmp_path / "systemctl"
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/systemctl.calls\n")
    path.chmod(0o755)
    return path


def test_a_cut_download_resumes_and_the_verified_package_is_staged(server, tmp_path, keys):
    trusted, _, keys_dir = keys
    package = tmp_path / "edge-agent_0.2.0-1_all.deb"
    package.write_bytes(os.urandom(300_000))
    release = publish(server, package.read_bytes())
    server.admin("/admin/behaviour", {"release_cut_bytes": 100_000})
    settled = []
    u = updater(server.url, tmp_path, keys_dir, settled, fake_systemctl(tmp_path))
    order = args(url=release["url"], size=release["size"], sha256=release["sha256"],
                 signature=base64.b64encode(trusted.sign(package).read_bytes()).decode())
    u.begin("cmd-1", order)
    wait_for(lambda: (tmp_path / "systemctl.calls").exists(), 20, what="the installer asked for")
    assert (tmp_path / "systemctl.calls").read_text().split() == [
        "start", "--no-block", "--no-ask-password", "edge-agent-update.service"]
    staging = tmp_path / "state" / rules.STAGING
    assert (staging / rules.PACKAGE_FILE).read_bytes() == package.read_bytes()
    doc = json.loads((staging / rules.ORDER_FILE).read_text())
    assert doc["id"] == "cmd-1" and doc["sha256"] == release["sha256"]
    # the second request asked for the rest, not the whole package again
    asked = server.admin("/admin/releases")["requests"]
    assert [r["from"] for r in asked][0] == 0 and 0 < asked[1]["from"] <= 100_000, asked
    assert len(asked) == 2, asked
    for name in os.listdir(staging):
        assert stat.S_IMODE(os.stat(staging / name).st_mode) == 0o600, name
    assert settled == []   # the outcome is the root side's to give
    # the root side's history settles it, and the staged files go
    (tmp_path / "root-side" / rules.HISTORY_FILE).write_text(json.dumps([
        {"id": "cmd-1", "from": "0.1.0-1", "to": "0.2.0-1", "outcome": rules.COMMITTED,
         "took_s": 30}]))
    wait_for(lambda: settled, 10, what="the outcome")
    assert settled == [("cmd-1", True, "updated from 0.1.0-1 to 0.2.0-1 in 30s: its link "
                                       "proven live")]
    assert not (staging / rules.ORDER_FILE).exists()


def test_a_package_that_is_not_the_signed_one_is_refused_before_staging(server, tmp_path, keys):
    trusted, stranger, keys_dir = keys
    package = tmp_path / "p.deb"
    package.write_bytes(os.urandom(5000))
    release = publish(server, package.read_bytes())
    systemctl = fake_systemctl(tmp_path)
    for cid, over, why in [
            ("wrong-sum", {"sha256": hashlib.sha256(b"other").hexdigest()},
             "refused: the package's SHA-256 is not the order's"),
            ("stranger", {"signature": base64.b64encode(stranger.sign(package).read_bytes()).decode()},
             "refused: signed by a key that is not installed")]:
        settled = []
        u = updater(server.url, tmp_path, keys_dir, settled, systemctl)
        order = args(url=release["url"], size=release["size"], sha256=release["sha256"],
                     signature=base64.b64encode(trusted.sign(package).read_bytes()).decode())
        u.begin(cid, {**order, **over})
        wait_for(lambda: settled, 20, what=f"{cid} refused")
        assert settled[0][:2] == (cid, False) and settled[0][2].startswith(why), settled
    assert not (tmp_path / "systemctl.calls").exists()
    assert not (tmp_path / "state" / rules.STAGING / rules.ORDER_FILE).exists()


def test_an_order_the_agent_restarted_in_the_middle_of_is_reported_not_installed(tmp_path, keys):
    _, _, keys_dir = keys
    root = tmp_path / "root-side"
    root.mkdir()
    u = Updater("http://127.0.0.1:9", Egress(), str(tmp_path / "state"), 2.0,
                settled=lambda *a: None, root_dir=str(root), keys_dir=str(keys_dir))
    (root / rules.HISTORY_FILE).write_text(json.dumps([
        {"id": "done", "from": "a", "to": "b", "outcome": rules.ROLLED_BACK, "reason": "r"}]))
    (root / rules.TRANSACTION_FILE).write_text(json.dumps({"id": "busy", "phase": "proving"}))
    found = u.recover(["done", "busy", "lost"])
    assert found["done"] == (False, "rolled back from b to a: r")
    assert found["busy"] is None   # still the root side's
    assert found["lost"][0] is False and "before it was installed" in found["lost"][1]
    u.stop()
    core = CommandCore(frozenset({"update"}))
    for cid in ("done", "busy", "lost"):
        core.handle(Received({"id": cid, "name": "update", "args": args()}, 1.0, 1.0))
    reports = [r for r in core.handle(Recovered("boot", 1, 2.0, found)) if isinstance(r, Report)]
    assert {r.result["id"] for r in reports} == {"done", "lost"}
    assert core.running("update") == ["busy"]


def test_a_redirect_is_never_followed_to_fetch_a_package(tmp_path, keys):
    """The origin check holds for the bytes too: a server (or a box in its place) that
    answers with a redirect gets a refusal, not a download from elsewhere."""
    import http.server
    import threading

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.2:9/evil.deb")
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        settled = []
        u = updater(f"http://127.0.0.1:{httpd.server_port}", tmp_path, keys[2], settled,
                    "/bin/false")
        u.begin("r1", args())
        wait_for(lambda: settled, 10, what="the redirect refused")
        assert settled[0][1] is False and "redirected it (302)" in settled[0][2], settled
    finally:
        httpd.shutdown()


def test_a_second_order_is_refused_while_the_root_side_has_one(tmp_path, keys):
    _, _, keys_dir = keys
    root = tmp_path / "root-side"
    root.mkdir()
    (root / rules.TRANSACTION_FILE).write_text(json.dumps({"id": "first", "phase": "proving"}))
    u = Updater("http://127.0.0.1:9", Egress(), str(tmp_path / "state"), 2.0,
                settled=lambda *a: None, root_dir=str(root), keys_dir=str(keys_dir))
    with pytest.raises(NotStaged, match=r"another update is in progress \(first\)"):
        u.begin("second", args())


# -- the root side's bookkeeping, without dpkg ------------------------------------------------
def test_a_cut_after_the_commit_was_kept_only_tidies_up(tmp_path):
    """Power lost between the outcome and the tidying: the next run neither proves nor
    rolls back again; the committed package becomes the one to go back to."""
    from agent.programs.installer import INCOMING, Installer
    root = tmp_path / "root"
    root.mkdir()
    (root / INCOMING).write_bytes(b"the new package")
    (root / rules.KEPT_PACKAGE).write_bytes(b"the old package")
    (root / rules.TRANSACTION_FILE).write_text(json.dumps(
        {"id": "c1", "from": "1", "to": "2", "phase": rules.PROVING}))
    (root / rules.HISTORY_FILE).write_text(json.dumps(
        [{"id": "c1", "from": "1", "to": "2", "outcome": rules.COMMITTED}]))
    installer = Installer(str(root), str(tmp_path / "state"), str(tmp_path / "status.json"),
                          str(tmp_path / "keys"), 10.0)
    installer.resume(installer.transaction())
    assert (root / rules.KEPT_PACKAGE).read_bytes() == b"the new package"
    assert not (root / INCOMING).exists() and installer.transaction() is None
    assert len(installer.history()) == 1


def test_a_rebuilt_package_ships_its_conffiles_as_shipped_never_as_edited(tmp_path):
    """The operator's edits (and the token in them) never go into the package kept to
    go back to: dpkg would take them for the default at the next update."""
    from agent.update.repack import RepackError, _copy_conffile
    conf, pristine = tmp_path / "agent.toml", tmp_path / "pristine"
    pristine.mkdir()
    shipped = b"# the default\n"
    (pristine / "agent.toml").write_bytes(shipped)
    conf.write_bytes(b'[identity]\ntoken = "s3cret"\n')
    md5 = hashlib.md5(shipped).hexdigest()
    _copy_conffile(str(conf), md5, str(tmp_path / "out" / "agent.toml"), str(pristine))
    assert (tmp_path / "out" / "agent.toml").read_bytes() == shipped
    (pristine / "agent.toml").write_bytes(b"# another version's default\n")
    with pytest.raises(RepackError, match="edited and the package keeps no copy"):
        _copy_conffile(str(conf), md5, str(tmp_path / "out2" / "agent.toml"), str(pristine))
    conf.write_bytes(shipped)   # unedited: the file itself
    _copy_conffile(str(conf), md5, str(tmp_path / "out3" / "agent.toml"), str(pristine))
    assert (tmp_path / "out3" / "agent.toml").read_bytes() == shipped


def test_a_trickle_that_keeps_every_read_alive_is_cut_at_the_download_bound(tmp_path, keys,
                                                                           monkeypatch):
    import http.server
    import threading
    import time as time_mod

    import agent.update.service as service_mod

    class Trickle(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(1000):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time_mod.sleep(0.1)   # well within any read timeout
            except OSError:
                pass

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setattr(service_mod, "DOWNLOAD_LIMIT_S", 1.5)
    try:
        settled = []
        u = updater(f"http://127.0.0.1:{httpd.server_port}", tmp_path, keys[2], settled,
                    "/bin/false")
        t0 = time_mod.monotonic()
        u.begin("slow", args(size=1000))
        wait_for(lambda: settled, 20, what="the trickle cut")
        assert settled[0][1] is False and "download too slow" in settled[0][2], settled
        assert time_mod.monotonic() - t0 < 6
    finally:
        httpd.shutdown()


def test_root_runs_gpgv_as_nobody_and_still_reads_keys_only_root_may(keys, tmp_path):
    """The bytes gpgv parses are the network's: root runs it as nobody, on its own
    copies of the keys (a keyring root keeps 0640 is still read)."""
    import shutil
    import tempfile
    trusted, stranger, _ = keys
    public = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="edge-agent-test-"))
    try:
        public.chmod(0o755)
        keys_dir = public / "keys"
        keys_dir.mkdir(mode=0o755)
        (keys_dir / "release.gpg").write_bytes(trusted.keyring.read_bytes())
        (keys_dir / "release.gpg").chmod(0o640)
        package = public / "p.deb"
        package.write_bytes(os.urandom(2048))
        package.chmod(0o644)
        good = trusted.sign(package).read_bytes()
        assert len(verify(str(package), good, str(keys_dir), as_user="nobody")) == 40
        with pytest.raises(SignatureError, match="not installed"):
            verify(str(package), stranger.sign(package).read_bytes(), str(keys_dir),
                   as_user="nobody")
        package.chmod(0o600)   # nobody cannot read it: refused, not trusted
        with pytest.raises(SignatureError):
            verify(str(package), good, str(keys_dir), as_user="nobody")
    finally:
        shutil.rmtree(public)


def test_a_transaction_no_run_can_finish_is_given_up_and_said(tmp_path):
    from agent.programs.installer import Installer
    root = tmp_path / "root"
    root.mkdir()
    (root / rules.TRANSACTION_FILE).write_text(json.dumps(
        {"id": "c2", "from": "1", "to": "2", "phase": rules.ROLLING_BACK,
         "reason": "its link was not proven live in time", "resumes": rules.MAX_RESUMES}))
    installer = Installer(str(root), str(tmp_path / "state"), str(tmp_path / "status.json"),
                          str(tmp_path / "keys"), 10.0)
    installer.resume(installer.transaction())   # no dpkg is run: it is given up
    assert installer.transaction() is None
    [entry] = installer.history()
    assert entry["outcome"] == rules.FAILED
    ok, text = rules.describe(entry)
    assert not ok and "given up after 8 tries" in text and "needs a hand" in text


def test_an_error_after_an_outcome_never_records_a_second_one(tmp_path, monkeypatch):
    """A failure in the tidying after a commit must not be reported as a refusal."""
    import agent.programs.installer as inst
    root, state = tmp_path / "root", tmp_path / "state"
    root.mkdir()
    (state / rules.STAGING).mkdir(parents=True)
    order = {"id": "c3", **args()}
    (state / rules.STAGING / rules.ORDER_FILE).write_text(json.dumps(order))
    installer = inst.Installer(str(root), str(state), str(tmp_path / "status.json"),
                               str(tmp_path / "keys"), 10.0)

    def commits_then_fails(fd, doc):
        installer._write(rules.HISTORY_FILE, [{"id": "c3", "outcome": rules.COMMITTED}])
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(installer, "install", commits_then_fails)
    with pytest.raises(OSError):
        inst.run(installer)
    assert [e["outcome"] for e in installer.history()] == [rules.COMMITTED]


# -- root's own gates: the agent's user can stage an order whatever the agent decided -----
def stage(tmp_path, order_id="g1", **over):
    state = tmp_path / "state"
    staging = state / rules.STAGING
    staging.mkdir(parents=True, exist_ok=True)
    (staging / rules.PACKAGE_FILE).write_bytes(b"p" * 1000)
    (staging / rules.SIGNATURE_FILE).write_bytes(b"sig")
    (staging / rules.ORDER_FILE).write_text(json.dumps({"id": order_id, **args(**over)}))
    return state


def root_installer(tmp_path, state, allowed, monkeypatch):
    import agent.programs.installer as inst
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    monkeypatch.setattr(inst, "installed_version", lambda: "0.1.0-1")
    monkeypatch.setattr(inst, "dpkg_install", lambda path: pytest.fail("dpkg was run"))
    monkeypatch.setattr(inst, "verify", lambda *a, **k: pytest.fail("the package was checked"))
    return inst.Installer(str(root), str(state), str(tmp_path / "status.json"),
                          str(tmp_path / "keys"), 10.0, update_allowed=allowed)


def test_root_installs_nothing_while_its_configuration_does_not_allow_update(tmp_path,
                                                                            monkeypatch):
    """Code running as the agent's user stages an order and starts the unit (or waits
    for the next boot, when the unit starts on its own): root reads its own gate."""
    import agent.programs.installer as inst
    installer = root_installer(tmp_path, stage(tmp_path), None, monkeypatch)
    inst.run(installer)
    [entry] = installer.history()
    assert entry["outcome"] == rules.REFUSED and "does not list update" in entry["reason"]


def test_root_refuses_a_version_rolled_back_here_unless_the_order_says_retry(tmp_path,
                                                                             monkeypatch):
    import agent.programs.installer as inst
    state = stage(tmp_path, "again")
    installer = root_installer(tmp_path, state, "agent.toml", monkeypatch)
    installer._write(rules.HISTORY_FILE, [{"id": "first", "from": "0.1.0-1", "to": "0.2.0-1",
                                           "outcome": rules.ROLLED_BACK, "reason": "crashed"}])
    inst.run(installer)
    assert installer.history()[-1]["outcome"] == rules.REFUSED
    assert "was rolled back here (crashed)" in installer.history()[-1]["reason"]
    # sent again without retry, refused again: the refusal does not hide the rollback
    stage(tmp_path, "third")
    inst.run(installer)
    assert "was rolled back here" in installer.history()[-1]["reason"]
    # with retry, it goes on to the checks of the package itself
    stage(tmp_path, "retried", retry=True)
    monkeypatch.setattr(inst, "_copy_out", lambda *a: "0" * 64)
    inst.run(installer)
    assert "does not match the order's SHA-256" in installer.history()[-1]["reason"]


@pytest.mark.parametrize("how", ["hard link", "another owner"])
def test_root_takes_only_the_agents_own_file_linked_once(tmp_path, how):
    import agent.programs.installer as inst
    staging = tmp_path / "staging"
    staging.mkdir()
    if how == "hard link":
        # where fs.protected_hardlinks=0 the agent's user could link a file it does not own
        (tmp_path / "elsewhere").write_bytes(b"p" * 1000)
        os.link(tmp_path / "elsewhere", staging / rules.PACKAGE_FILE)
    else:
        (staging / rules.PACKAGE_FILE).write_bytes(b"p" * 1000)
        os.chown(staging / rules.PACKAGE_FILE, 65534, 65534)
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(inst.Refused, match="only the agent's own file, linked once"):
            inst._copy_out(fd, rules.PACKAGE_FILE, str(tmp_path / "out.deb"), 1000)
    finally:
        os.close(fd)
    assert not (tmp_path / "out.deb").exists()


def test_roots_gate_is_read_from_roots_copy_of_the_configuration(tmp_path, monkeypatch):
    import agent.programs.installer as inst
    state = stage(tmp_path)
    seen = []
    monkeypatch.setattr(inst, "run", lambda installer: seen.append(installer.update_allowed))
    conf = tmp_path / "agent.toml"
    for allow, expected in ((["diagnostics", "logs"], None), (["update"], str(conf))):
        conf.write_text(f'[server]\nurl = "http://127.0.0.1:1"\n[identity]\nstate_dir = '
                        f'"{state}"\n[commands]\nallow = {json.dumps(allow)}\n')
        assert inst.main(["--config", str(conf), "--root-dir", str(tmp_path / "root"),
                          "--keys-dir", str(tmp_path / "keys")]) == 0
        assert seen[-1] == expected


def test_the_sites_outage_does_not_count_against_a_release():
    """After a power cut the network comes back last: a site whose network takes longer
    than the proof time rolled a good version back. Where the site was down before (or
    the proof resumes at boot), the proof time starts again once the link is back."""
    site = rules.ProofClock(start=0.0, proof_s=180.0, site_down=True)
    t = 0.0
    while t < 1000:                          # 1000 s of dns-failed
        assert rules.verdict("0.2.0-1", proof(proven_live=False, outage=True), t,
                             site.deadline_at(t, outage=True))[0] == "wait"
        t += 1.0
    back = t                                  # the network is back; the release now has
    assert site.deadline_at(back, outage=False) == pytest.approx(back - 1 + 180.0)
    action, why = rules.verdict("0.2.0-1", proof(proven_live=False), back + 180,
                                site.deadline_at(back + 180, outage=False))
    assert action == "rollback" and "not proven live in time" in why
    # an outage longer than the cap is judged like any other silence
    capped = rules.ProofClock(start=0.0, proof_s=180.0, site_down=True)
    late = rules.OUTAGE_CAP_S + 180.0
    assert capped.deadline_at(late, outage=True) <= late
    # where the link was up before the update, the new version's outage is its own
    healthy = rules.ProofClock(start=0.0, proof_s=180.0, site_down=False)
    assert healthy.deadline_at(500.0, outage=True) == 180.0


def test_root_reads_the_agents_status_file_without_trusting_its_shapes():
    from agent.programs.installer import down_for_outage
    assert down_for_outage({"state": "waiting", "reason": "dns-failed"})
    for link in ({"state": "waiting", "reason": ["dns-failed"]}, {"reason": {"x": 1}},
                 {"state": "online", "reason": "dns-failed"}, {"state": None, "reason": 7}):
        assert down_for_outage(link) is False
