"""`edge-agent enqueue` says 0 only when the item is stored; each refusal has its own
exit status and one line. A duplicate is a key seen again, never equal content. Run
through the real CLI, the disk case on a real loop-mounted ext4 filled almost full."""
import hashlib
import os
import struct
import subprocess
import sys
import uuid
import zlib
from pathlib import Path

from agent.config.policies import UploadPolicy
from agent.uploads.store import QueueStore
from devtools.card import SdCard

REPO = Path(__file__).resolve().parent.parent
TOO_LARGE, DISK, FULL, DUPLICATE, USAGE = 4, 5, 6, 7, 2


def config(tmp_path: Path, state: Path, uploads: str = "") -> Path:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://127.0.0.1:9"\n[identity]\nstate_dir = "{state}"\n'
                   f'[runtime]\ndir = "{tmp_path / "run"}"\n[uploads]\n{uploads}\n')
    return cfg


def enqueue(cfg, kind, data: bytes, *extra):
    r = subprocess.run([sys.executable, "-m", "agent", "enqueue", "--config", str(cfg),
                        "--kind", kind, *extra, "-"], input=data, capture_output=True,
                       timeout=60, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    err = r.stderr.decode()
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return r.returncode, err


def queued(state: Path) -> int:
    s = QueueStore(str(state / "queue"), UploadPolicy())
    try:
        return s.stats()["items"]
    finally:
        s.close()


def test_each_refusal_has_its_own_exit_status_and_two_plays_are_two_records(tmp_path):
    state = tmp_path / "state"
    cfg = config(tmp_path, state, "max_items = 4")
    play = b'{"event": "play_start", "content_id": "c-1", "content_name": "Welcome"}'
    assert enqueue(cfg, "proof-of-play", play)[0] == 0
    assert enqueue(cfg, "proof-of-play", play)[0] == 0, "a second real play is a record"
    keyed = b'{"play_id": "lobby-3:2026-12-04T10:00:00Z", "content_id": "c-1"}'
    assert enqueue(cfg, "proof-of-play", keyed)[0] == 0
    code, err = enqueue(cfg, "proof-of-play", keyed)
    assert code == DUPLICATE and "duplicate" in err and "lobby-3" in err
    code, err = enqueue(cfg, "log", b"x", "--key", "has space")
    assert code == USAGE and "--key" in err
    code, err = enqueue(cfg, "proof-of-play", b'{"play_id": ["no"]}')
    assert code == USAGE and "play_id" in err
    assert enqueue(cfg, "screenshot", b"\xff\xd8 frame", "--key", "shot-1")[0] == 0
    code, err = enqueue(cfg, "screenshot", b"\xff\xd8 another frame", "--key", "shot-1")
    assert code == DUPLICATE
    code, err = enqueue(cfg, "screenshot", b"\xff\xd8" + bytes(17 << 20))
    assert code == TOO_LARGE and "too large" in err
    # four queued; a screenshot may push out only a screenshot, a log only those two
    assert enqueue(cfg, "log", b"a log")[0] == 0            # evicts the screenshot
    code, err = enqueue(cfg, "screenshot", b"\xff\xd8 frame 3")
    assert code == FULL and "queue full" in err
    assert queued(state) == 4


def test_an_almost_full_card_refuses_with_its_own_status(tmp_path):
    with SdCard(tmp_path, size_mb=128) as card:
        state = card.mountpoint / "state"
        cfg = config(tmp_path, state)
        assert enqueue(cfg, "log", b"before")[0] == 0

        def fill(leave: int) -> None:
            st = os.statvfs(card.mountpoint)
            n = st.f_bavail * st.f_frsize - leave
            with open(card.mountpoint / f"filler-{leave}", "wb") as f:
                os.posix_fallocate(f.fileno(), 0, n)

        fill(40 << 20)   # screenshots need 64 MiB left, logs 16, proof-of-play nothing
        code, err = enqueue(cfg, "screenshot", b"\xff\xd8 frame")
        assert code == DISK and "nearly full" in err
        assert enqueue(cfg, "log", b"still fits")[0] == 0
        fill(0)
        code, err = enqueue(cfg, "proof-of-play", b'{"event": "play_start"}')
        assert code == DISK, err
        assert queued(state) == 2
        for name in os.listdir(card.mountpoint):
            if name.startswith("filler-"):
                os.unlink(card.mountpoint / name)
        assert enqueue(cfg, "screenshot", b"\xff\xd8 frame")[0] == 0
        assert queued(state) == 3


def test_an_eaq1_segment_of_the_previous_layout_is_read_and_keyed_items_follow_it(tmp_path):
    """Records as the build before keys wrote them (magic EAQ1, kind, stamp, id,
    sha256) are read back, sent with their uuid as key, and a keyed item queued after
    them keeps its key across a restart."""
    path = tmp_path / "queue"
    path.mkdir()
    head, meta_s = struct.Struct("<4sIII"), struct.Struct("<Bd16s32s")
    ids, blob = [], b""
    for n, payload in enumerate((b"old screenshot", b'{"old": "play"}')):
        raw_id = uuid.uuid4().bytes
        kind = 1 if n == 0 else 3
        meta = meta_s.pack(kind, 1000.0 + n, raw_id,
                           hashlib.sha256(b"x\0" + payload).digest())
        record = head.pack(b"EAQ1", len(payload), zlib.crc32(payload), zlib.crc32(meta)) + meta
        record += payload
        blob += record + bytes(-len(record) % 4096)
        ids.append(raw_id.hex())
    (path / "00000001.seg").write_bytes(blob)
    s = QueueStore(str(path), UploadPolicy())
    items = s.due(2000.0, 10)
    assert [i.id for i in items] == ids
    assert [i.payload for i in items] == [b"old screenshot", b'{"old": "play"}']
    assert [i.created_at for i in items] == [1000.0, 1001.0]
    assert s.add("log", b"new", now=2001.0, key="bundle-7") == "bundle-7"
    s.confirmed(items[:1], now=2002.0)
    s.close()
    again = QueueStore(str(path), UploadPolicy())
    assert [i.id for i in again.due(3000.0, 10)] == [ids[1], "bundle-7"]
    again.close()


def test_a_play_record_nested_too_deeply_is_one_line_and_exit_2(tmp_path):
    """json.loads raises RecursionError, not ValueError, on a record nested thousands
    deep: it is refused like any other bad record, for either profile."""
    deep = b'{"play_id": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    for profile in ("edge-agent", "screentinker"):
        state = tmp_path / profile
        cfg = config(tmp_path, state)
        cfg.write_text(cfg.read_text().replace("[server]\n", f'[server]\nprofile = "{profile}"\n'))
        code, err = enqueue(cfg, "proof-of-play", deep)
        assert code == USAGE and "nested too deeply" in err, (profile, err)
        assert not (state / "queue").exists() or queued(state) == 0
