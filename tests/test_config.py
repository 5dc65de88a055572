import os
import subprocess
import sys

import pytest

from agent import config as C

GOOD = """
[server]
url = "http://127.0.0.1:8470"
[identity]
device_id = "screen-1"
token = "t0ken"
[link]
heartbeat_interval_s = 15
[link.backoff]
base_s = 2
[link.keepalive]
idle_s = 10
"""


def write(tmp_path, text):
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return str(p)


def test_defaults_and_values(tmp_path):
    cfg = C.load(write(tmp_path, GOOD), env={})
    assert cfg.liveness.heartbeat_interval_s == 15.0
    assert cfg.liveness.ack_timeout_s == 5.0
    assert cfg.liveness.missed_acks == 1
    assert cfg.liveness.silence_timeout_s is None
    assert cfg.stable_after_s == 60.0
    assert cfg.backoff.base_s == 2.0 and cfg.backoff.cap_s == 60.0 and cfg.backoff.jitter == "full"
    assert cfg.keepalive.idle_s == 10
    assert cfg.runtime_dir == "/run/edge-agent"
    assert "t0ken" not in repr(cfg)  # never in a log line by accident


def test_env_overrides_win(tmp_path):
    env = {"EDGE_AGENT_LINK_BACKOFF_BASE_S": "0.5", "EDGE_AGENT_SERVER_URL": "https://fleet.example:9443",
           "EDGE_AGENT_LINK_MISSED_ACKS": "2", "RUNTIME_DIRECTORY": "/run/edge-agent"}
    cfg = C.load(write(tmp_path, GOOD), env=env)
    assert cfg.backoff.base_s == 0.5
    assert cfg.server_url == "https://fleet.example:9443"
    assert cfg.liveness.missed_acks == 2


BASE = {"server": {"url": "http://127.0.0.1:8470"},
        "identity": {"device_id": "screen-1", "token": "t0ken"}}


def to_toml(doc: dict, prefix: str = "") -> str:
    plain = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    out = "".join(f"{k} = {_lit(v)}\n" for k, v in plain.items())
    if prefix and plain:
        out = f"[{prefix}]\n" + out
    for k, v in doc.items():
        if isinstance(v, dict):
            out += to_toml(v, f"{prefix}.{k}" if prefix else k)
    return out


def _lit(v):
    if isinstance(v, str):
        return '"' + v + '"'
    return repr(v).lower() if isinstance(v, bool) else repr(v)


@pytest.mark.parametrize("section, key, value, expect", [
    ("link", "heartbeat_interval_s", -1, "link.heartbeat_interval_s"),
    ("link", "ack_timeout_s", 20, "link.ack_timeout_s"),
    ("link", "missed_acks", 0, "link.missed_acks"),
    ("link", "missed_acks", 1.5, "link.missed_acks"),
    ("link", "silence_timeout_s", 3, "link.silence_timeout_s"),
    ("link", "bogus", 1, "link.bogus"),
    ("nope", "x", 1, "nope"),
    ("link.backoff", "cap_s", 0.5, "link.backoff.cap_s"),
    ("link.backoff", "jitter", "some", "link.backoff.jitter"),
    ("link.keepalive", "count", "three", "link.keepalive.count"),
    ("server", "url", "ftp://x", "server.url"),
    ("server", "url", "http://", "server.url"),
    ("server", "url", "http://h:99999", "server.url"),
    ("server", "ca_file", "/nonexistent/ca.pem", "server.ca_file"),
    ("identity", "device_id", "a b", "identity.device_id"),
    ("identity", "token", "", "identity.token"),
    ("log", "level", "loud", "log.level"),
    ("link", "stable_after_s", float("inf"), "link.stable_after_s"),
])
def test_bad_values_name_the_key(tmp_path, section, key, value, expect):
    doc = {k: dict(v) for k, v in BASE.items()}
    node = doc
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = value
    text = to_toml(doc).replace("inf", "inf")
    with pytest.raises(C.ConfigError) as e:
        C.load(write(tmp_path, text), env={})
    assert str(e.value).startswith(expect), str(e.value)
    assert "\n" not in str(e.value)


def test_stray_top_level_key(tmp_path):
    with pytest.raises(C.ConfigError, match=r"^stray: unknown key"):
        C.load(write(tmp_path, "stray = 1\n" + GOOD), env={})


def test_missing_required_and_bad_env(tmp_path):
    with pytest.raises(C.ConfigError, match=r"^server.url: required"):
        C.load(write(tmp_path, GOOD.replace('url = "http://127.0.0.1:8470"\n', "")), env={})
    with pytest.raises(C.ConfigError, match=r"^identity.token: a pre-provisioned token needs"):
        C.load(write(tmp_path, GOOD.replace('device_id = "screen-1"\n', "")), env={})
    enrolling = C.load(write(tmp_path, GOOD.replace('device_id = "screen-1"\ntoken = "t0ken"\n', "")), env={})
    assert enrolling.device_id is None and enrolling.token is None
    with pytest.raises(C.ConfigError, match=r"^link.ack_timeout_s \(from EDGE_AGENT_LINK_ACK_TIMEOUT_S\)"):
        C.load(write(tmp_path, GOOD), env={"EDGE_AGENT_LINK_ACK_TIMEOUT_S": "soon"})
    with pytest.raises(C.ConfigError, match=r"^EDGE_AGENT_LINK_TYPO: unknown"):
        C.load(write(tmp_path, GOOD), env={"EDGE_AGENT_LINK_TYPO": "1"})


def test_unreadable_files(tmp_path):
    with pytest.raises(C.ConfigError, match="no such file"):
        C.load(str(tmp_path / "missing.toml"), env={})
    with pytest.raises(C.ConfigError, match="not valid TOML"):
        C.load(write(tmp_path, "[server\nurl="), env={})
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(C.ConfigError):
        C.load(str(bad), env={})


def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("EDGE_AGENT_")]:
        monkeypatch.delenv(name)
    path = write(tmp_path, GOOD.replace("heartbeat_interval_s = 15", "heartbeat_interval_s = 4"))
    r = subprocess.run([sys.executable, "-m", "agent", "run", "--config", path],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "link.ack_timeout_s" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "agent", "run", "--bogus"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "agent", "check-config", "--config",
                        write(tmp_path, GOOD)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def _cli(*args, env=None, stderr_to_journal=False, tmp_path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT_")} | (env or {})
    if not stderr_to_journal:
        return subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True,
                              text=True, timeout=30, env=env)
    # what systemd does: JOURNAL_STREAM names the device:inode of our stderr
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        st = os.fstat(f.fileno())
        env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        r = subprocess.run([sys.executable, "-m", "agent", *args], stdout=subprocess.PIPE,
                           stderr=f, text=True, timeout=30, env=env)
    r.stderr = err.read_text()
    return r


def test_configured_skips_only_a_missing_url(tmp_path):
    """systemd's ExecCondition: 1 skips the start without failing the unit."""
    no_url = write(tmp_path, "[server]\n# url = \"https://fleet.example.com\"\n")
    r = _cli("configured", "--config", no_url)
    assert r.returncode == 1 and "not configured yet: set [server] url" in r.stderr
    assert _cli("configured", "--config", no_url,
                env={"EDGE_AGENT_SERVER_URL": "http://127.0.0.1:1"}).returncode == 0
    # a typo is not "unconfigured": `run` must fail the unit and say why
    typo = write(tmp_path, GOOD.replace("heartbeat_interval_s = 15", "heartbeat_interval_s = 4"))
    assert _cli("configured", "--config", typo).returncode == 0
    assert _cli("configured", "--config", str(tmp_path / "missing.toml")).returncode == 0


def test_errors_before_logging_carry_their_priority_to_the_journal(tmp_path):
    bad = write(tmp_path, GOOD.replace("heartbeat_interval_s = 15", "heartbeat_interval_s = 4"))
    r = _cli("run", "--config", bad, stderr_to_journal=True, tmp_path=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("<3>edge-agent: config error: link.ack_timeout_s"), r.stderr
    no_url = write(tmp_path, "[server]\n")
    r = _cli("configured", "--config", no_url, stderr_to_journal=True, tmp_path=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("<5>edge-agent: not configured yet")


def test_a_url_with_credentials_never_reaches_logs_or_the_status_file(tmp_path):
    cfg = C.load(write(tmp_path, GOOD.replace("http://127.0.0.1:8470",
                                              "https://fleet:hunter2@fleet.example.com:8443")), env={})
    assert cfg.server_url.startswith("https://fleet:hunter2@")   # still used to connect
    assert cfg.server_display == "https://***@fleet.example.com:8443"
    assert C.load(write(tmp_path, GOOD), env={}).server_display == "http://127.0.0.1:8470"


def test_every_key_reaches_the_config_field_its_schema_entry_names(tmp_path):
    """One declaration per key: a key whose ``into`` were wrong or missing would not
    change the Config it is declared to change."""
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    special = {"server.url": "http://127.0.0.1:9999", "server.ca_file": str(ca),
               "identity.device_id": "screen-9", "identity.token": "another-token",
               "identity.state_dir": "/var/lib/other", "runtime.dir": "/run/other",
               "commands.allow": "logs", "debug.sysfs_root": "/tmp/sys"}
    for section, keys in C.SCHEMA.items():
        for key, spec in keys.items():
            name = f"{section}.{key}"
            if name in special:
                raw = special[name]
            elif isinstance(spec.rule, tuple):
                raw = next(c for c in spec.rule if c != spec.default)
            elif spec.type is bool:
                raw = "false" if spec.default else "true"
            elif spec.type in (int, float):
                raw = str((spec.default or 20) * 2)
            else:
                raw = "/usr/bin/true"
            env = {C.env_name(section, key): raw}
            if name == "identity.token":
                env[C.env_name("identity", "device_id")] = "screen-9"
            cfg = C.load(write(tmp_path, GOOD.replace("heartbeat_interval_s = 15\n", "")), env=env)
            got = cfg
            for part in spec.into.split("."):
                got = getattr(got, part)
            want = C._coerce(name, spec.type, raw, True)
            if name == "commands.allow":
                want = frozenset(want)
            assert got == want, f"{name} -> Config.{spec.into}: {got!r}, not {want!r}"
