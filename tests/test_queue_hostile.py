"""The upload queue on hostile ground: links planted in the agent's state directory by
the agent's own (unprivileged) user, met by `edge-agent enqueue` / `unpair` run as root.

Whoever runs as the agent's user must not become root through the queue: root drops to
the owner of the state directory before touching it, and every file of the spool is
opened with O_NOFOLLOW. The links here are planted by a real unprivileged user
(``nobody``) and the real CLI runs as root.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from agent.base.fsutil import atomic_write
from agent.config.policies import UploadPolicy
from agent.uploads.store import QueueStore, QueueUnsafe

REPO = Path(__file__).resolve().parent.parent
USER, GROUP = "nobody", "nogroup"


def as_user(*cmd):
    subprocess.run(list(cmd), check=True, user=USER, group=GROUP, extra_groups=[], timeout=30)


@pytest.fixture
def ground():
    """A root-owned base (0755, so the unprivileged user can reach into it) holding a
    precious root-owned file and the agent's state directory, owned by the user."""
    if os.geteuid() != 0:
        pytest.fail("these tests plant links as another user: they need root")
    base = Path(tempfile.mkdtemp(prefix="edge-agent-hostile-", dir="/var/tmp"))
    base.chmod(0o755)
    precious = base / "precious"
    precious.write_bytes(b"root's own bytes, not a queue segment\n" * 10)
    precious.chmod(0o644)
    state = base / "state"
    state.mkdir(mode=0o700)
    os.chown(state, *_ids())
    cfg = base / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://127.0.0.1:9"\n[identity]\nstate_dir = "{state}"\n'
                   f'[runtime]\ndir = "{base / "run"}"\n')
    yield base, state, precious, cfg
    shutil.rmtree(base)


def _ids():
    import grp
    import pwd
    return pwd.getpwnam(USER).pw_uid, grp.getgrnam(GROUP).gr_gid


def cli(cfg, *args, data=b"a log line\n"):
    return subprocess.run([sys.executable, "-m", "agent", *args, "--config", str(cfg)],
                          input=data, capture_output=True, timeout=60, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def fingerprint(path: Path):
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode, path.read_bytes()


@pytest.mark.parametrize("planted", ["lock", "00000001.seg", "queue"])
def test_root_enqueue_never_follows_a_link_the_agent_user_planted(ground, planted):
    base, state, precious, cfg = ground
    before = fingerprint(precious)
    if planted == "queue":   # the spool itself: a link to a directory of root's
        rootdir = base / "rootdir"
        rootdir.mkdir(mode=0o755)
        as_user("ln", "-s", str(rootdir), str(state / "queue"))
    else:
        as_user("mkdir", "-m", "700", str(state / "queue"))
        as_user("ln", "-s", str(precious), str(state / "queue" / planted))
    r = cli(cfg, "enqueue", "--kind", "log", "-")
    assert r.returncode != 0, "queued through a planted link"
    err = r.stderr.decode()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert fingerprint(precious) == before, "the root-owned target was chowned, cut or written"
    if planted == "queue":
        assert os.listdir(base / "rootdir") == [], "root wrote into its own directory"
    # the link removed, the queue works, and what root made there is the user's
    os.unlink(state / "queue" / planted if planted != "queue" else state / "queue")
    r = cli(cfg, "enqueue", "--kind", "log", "-")
    assert r.returncode == 0, r.stderr
    queue = state / "queue"
    assert {os.lstat(p).st_uid for p in [queue, *queue.iterdir()]} == {_ids()[0]}
    store = QueueStore(str(queue), UploadPolicy())
    assert store.stats()["items"] == 1
    store.close()


def test_root_unpair_never_deletes_through_a_link_to_another_directory(ground):
    """The state directory named in the configuration is a link the user planted (in a
    directory of theirs) to a directory of root's holding a credentials.json."""
    base, state, precious, cfg = ground
    rootdir = base / "rootdir"
    rootdir.mkdir(mode=0o755)
    (rootdir / "credentials.json").write_text('{"token": "root\'s"}')
    as_user("ln", "-s", str(rootdir), str(state / "linked"))
    cfg.write_text(cfg.read_text().replace(f'state_dir = "{state}"',
                                           f'state_dir = "{state / "linked"}"'))
    r = cli(cfg, "unpair")
    assert r.returncode != 0
    err = r.stderr.decode()
    assert err.count("\n") == 1 and "symbolic link" in err and "Traceback" not in err, err
    assert (rootdir / "credentials.json").exists(), "root deleted a file through the link"


def test_root_enqueue_runs_as_the_owner_of_the_state_directory(ground):
    """Nothing the user could not do: a root-owned file (an operator's leftover) in the
    user's spool is not the user's to write, so root does not write it either."""
    base, state, precious, cfg = ground
    assert cli(cfg, "enqueue", "--kind", "log", "-").returncode == 0
    seg = state / "queue" / "00000001.seg"
    os.chown(seg, 0, 0)
    before = fingerprint(seg)
    r = cli(cfg, "enqueue", "--kind", "log", "-", data=b"second")
    assert r.returncode == 1 and "Permission denied" in r.stderr.decode(), r.stderr
    assert fingerprint(seg) == before


@pytest.mark.parametrize("name", ["lock", "00000001.seg", "00000001.ack", "dead-letter.jsonl"])
def test_the_store_refuses_a_link_in_the_spool_and_never_writes_through_it(tmp_path, name):
    path = tmp_path / "queue"
    target = tmp_path / "target"
    target.write_bytes(b"not the queue's\n")
    s = QueueStore(str(path), UploadPolicy())
    s.enqueue("log", b"one", now=1.0)
    [item] = s.due(2.0, 10)
    s.close()
    if (path / name).exists():
        os.unlink(path / name)
    os.symlink(target, path / name)
    before = fingerprint(target)
    with pytest.raises(QueueUnsafe, match="a symbolic link"):
        s = QueueStore(str(path), UploadPolicy())
        try:
            s.failed(item, 100.0)                  # an outcome: the .ack file
            s.dead(item, "HTTP 422", now=3.0)      # a reason: the dead-letter file
        finally:
            s.close()
    assert fingerprint(target) == before


def test_atomic_write_does_not_write_through_a_linked_directory(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "state")
    with pytest.raises(OSError):
        atomic_write(str(tmp_path / "state" / "credentials.json"), b"{}")
    assert os.listdir(elsewhere) == []
    # a link at the file's own name is replaced, its target left alone
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(target, real / "status.json")
    atomic_write(str(real / "status.json"), b"new")
    assert target.read_bytes() == b"keep" and (real / "status.json").read_bytes() == b"new"
    assert not (real / "status.json").is_symlink()


@pytest.mark.parametrize("planted", ["symlink", "hardlink"])
def test_an_agent_starting_on_a_planted_queue_file_keeps_its_link_and_says_why(ground, planted):
    """A queue file the user made a link (or gave a second name) is refused, and the
    agent starts without its queue, degraded, like on a failed card: it does not die in
    its constructor and restart forever without a link."""
    from agent.config import load as cfgmod
    from agent.app.daemon import Agent
    base, state, precious, cfg = ground
    queue = state / "queue"
    as_user("mkdir", "-m", "700", str(queue))
    if planted == "symlink":
        as_user("ln", "-s", str(precious), str(queue / "00000001.seg"))
    else:
        as_user("touch", str(queue / "mine"))
        as_user("ln", str(queue / "mine"), str(queue / "00000001.seg"))
    before = fingerprint(precious)
    agent = Agent(cfgmod.load(str(cfg), env={}))
    assert agent.uploads.store is None
    doc = agent.storage.snapshot()
    assert doc["state"] == "unavailable" and "upload queue" in doc["parts"], doc
    assert "link" in doc["reason"], doc   # a symbolic one, or a second name
    assert agent.uploads.queue_stats() == {"error": "storage unavailable"}
    assert fingerprint(precious) == before
