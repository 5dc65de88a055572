"""`edge-agent check-config`: what is in force and where each value comes from, the site
CA read as the agent reads it, and every file it names opened as the agent's user; and
what `server.ca_file` does to the system's CA store (issue #43)."""
import os
import ssl
import subprocess
import sys

import pytest

from agent.base import access
from agent import cli
from agent.config import load as C
from agent.base.egress import Egress

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ca(work, name: str) -> str:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem"],
                   check=True, capture_output=True, cwd=work, timeout=60)
    return str(work / f"{name}.pem")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": REPO, **(env or {})})


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return str(path)


def test_check_config_says_the_profile_proxy_and_ca_in_force_and_where_each_comes_from(tmp_path):
    ca = _ca(tmp_path, "site-ca")
    path = _write(tmp_path, f"""[server]
url = "http://screentinker.site.example:3001"
profile = "screentinker"
ca_file = "{ca}"
[network]
proxy = "http://shop7:pa55word@proxy.site.example:3128"
no_proxy = "10.0.0.0/8"
""")
    r = _cli("check-config", "--config", path, env={"EDGE_AGENT_LOG_LEVEL": "debug"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "pa55word" not in out and "shop7" not in out
    assert "  profile   screentinker (this screen's file)\n" in out, out
    assert ("  proxy     http://***@proxy.site.example:3128 (this screen's file, network.proxy); "
            "direct to 10.0.0.0/8\n") in out, out
    assert (f"  ca        {ca} (this screen's file): 1 PEM certificate, in place of the "
            f"system's CA store for every connection the agent makes\n") in out, out
    assert "  from the environment: log.level\n" in out, out
    assert "server.profile" in out.split("from this screen's file: ")[1].splitlines()[0]


def test_a_proxy_from_the_environment_and_no_ca_are_said_as_such(tmp_path):
    path = _write(tmp_path, '[server]\nurl = "http://fleet.example:3001"\n')
    r = _cli("check-config", "--config", path,
             env={"http_proxy": "http://u:secret@proxy.example:8080"})
    assert r.returncode == 0, r.stderr
    assert "secret" not in r.stdout
    # outside systemd (no unit to read: operator #50.2), the shell's environment, said so
    assert ("  proxy     http://***@proxy.example:8080 (http_proxy, from this shell's "
            "environment)\n") in r.stdout, r.stdout
    assert "the unit's environment not read" in r.stdout, r.stdout
    assert ("  profile   auto (built-in default): not known yet for this url; the agent asks "
            "the server at its start") in r.stdout, r.stdout


def test_only_the_url_set_says_the_kind_auto_found_for_it_and_asks_again_for_another(tmp_path):
    """#50: the profile need not be set; check-config says what the agent found, and that
    a changed url is asked again."""
    from agent.identity import kind_record
    from agent.identity.server_kind import Verdict, record_of
    state = tmp_path / "state"
    state.mkdir()
    kind_record.save(str(state), record_of("http://fleet.example:3001", Verdict(
        "screentinker", "ScreenTinker 1.9.33 answered GET /api/version")))
    for url, said in (("http://fleet.example:3001",
                       "auto (built-in default): screentinker, detected at an earlier start "
                       "(ScreenTinker 1.9.33 answered GET /api/version)\n"),
                      ("http://elsewhere.example:3001", "auto (built-in default): not known yet")):
        path = _write(tmp_path, f'[server]\nurl = "{url}"\n[identity]\nstate_dir = "{state}"\n')
        r = _cli("check-config", "--config", path)
        assert r.returncode == 0, r.stderr
        assert f"  profile   {said}" in r.stdout, r.stdout
    assert "  ca        the system's CA store (server.ca_file unset)\n" in r.stdout


def test_the_packages_defaults_are_a_layer_of_their_own(tmp_path):
    vendor = tmp_path / "vendor.toml"
    vendor.write_text("[link]\nheartbeat_interval_s = 20\n")
    cfg = C.load(_write(tmp_path, '[server]\nurl = "https://fleet.example"\n'), env={},
                 vendor=str(vendor))
    assert cfg.origins["link.heartbeat_interval_s"] == "package"
    assert cfg.origins["server.url"] == "file" and cfg.origins["link.ack_timeout_s"] == "default"
    assert C.ORIGINS["package"] == f"the package's defaults ({C.VENDOR_PATH})"


@pytest.mark.parametrize("content", [b"garbage\n", b"",
                                     b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"])
def test_a_ca_file_that_holds_no_pem_certificate_is_refused_in_one_line(tmp_path, content):
    bad = tmp_path / "ca.pem"
    bad.write_bytes(content)
    path = _write(tmp_path, f'[server]\nurl = "https://fleet.example"\nca_file = "{bad}"\n')
    for command in ("check-config", "run"):
        r = _cli(command, "--config", path)
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"edge-agent: config error: server.ca_file: "), r.stderr
        assert str(bad) in r.stderr


def test_ca_file_replaces_the_system_store_and_does_not_add_to_it(tmp_path, monkeypatch):
    """The system's store stands in as another CA, where OpenSSL looks for it
    (SSL_CERT_FILE). Without ca_file the agent trusts it; with ca_file, only the site's
    CA, for the link's TLS and for every HTTPS request alike."""
    site, system = _ca(tmp_path, "site-ca"), _ca(tmp_path, "system-ca")
    monkeypatch.setenv("SSL_CERT_FILE", system)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    def names(ctx: ssl.SSLContext) -> set:
        return {dict(x[0] for x in c["subject"])["commonName"] for c in ctx.get_ca_certs()}

    assert names(Egress().ssl_context()) == {"system-ca"}
    assert names(Egress(ca_file=site).ssl_context()) == {"site-ca"}
    assert Egress(ca_file=site).session("https://fleet.example").verify == site   # only it
    assert Egress().session("https://fleet.example").verify is True   # requests' own store


@pytest.fixture
def open_dir():
    """A directory every user may enter (the tests' own tmp_path is root's alone)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="edge-agent-access.", dir="/tmp")
    os.chmod(d, 0o755)
    from pathlib import Path
    yield Path(d)
    shutil.rmtree(d)


def test_access_is_checked_as_the_agents_user_by_opening_each_file(open_dir):
    """As root: a forked child that becomes the user opens each file (nobody stands in
    for edge-agent here). As another user: from the modes, and it says so."""
    assert os.geteuid() == 0, "the tests run as root"
    open_file, root_only = open_dir / "ca.pem", open_dir / "key.pem"
    open_file.write_text("x")
    open_file.chmod(0o644)
    root_only.write_text("x")
    root_only.chmod(0o600)
    how, problems = access.check({"a": str(open_file), "b": str(root_only)}, user="nobody")
    assert how.startswith("as nobody (uid ") and problems == {"b": "Permission denied"}, problems
    import pwd
    by_modes = access._by_modes({"a": str(open_file), "b": str(root_only)},
                                pwd.getpwnam("nobody"))
    assert by_modes == {"b": "not readable by nobody (its mode and owner)"}
    with pytest.raises(LookupError):
        access.check({"a": str(open_file)}, user="no-such-user-here")


def test_check_config_fails_when_the_agents_user_cannot_read_a_file_it_names(
        tmp_path, open_dir, monkeypatch, capsys):
    tmp_path = open_dir
    ca = tmp_path / "site.pem"
    ca.write_text(open(_ca(tmp_path, "site-ca")).read())
    ca.chmod(0o600)   # root's alone: the agent's TLS would fail at every connection
    path = _write(tmp_path, f'[server]\nurl = "https://fleet.example"\nca_file = "{ca}"\n')
    os.chmod(path, 0o644)
    monkeypatch.setattr(access, "AGENT_USER", "nobody")
    monkeypatch.setattr(access.check, "__defaults__", ("nobody",))
    assert cli.main(["check-config", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == (f"edge-agent: config error: server.ca_file: {ca}: Permission denied "
                   f"(checked as nobody (uid {__import__('pwd').getpwnam('nobody').pw_uid}))\n")
    ca.chmod(0o644)
    assert cli.main(["check-config", "--config", path]) == 0
    assert "  readable  by nobody: every file named here (checked as nobody" in capsys.readouterr().out
