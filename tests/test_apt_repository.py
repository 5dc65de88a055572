"""A screen that stopped upgrading is visible: what apt's lists offer for the package
(read bounded, in chunks, never a link), when apt last succeeded, the comparison with
the installed version as dpkg orders versions, and the status line that says it."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from agent.app import status
from agent.update import apt, rules

PAIRS = [("1.0", "1.0-1"), ("1.0~rc1", "1.0"), ("1:0.1", "9.9"), ("0.3.0-1", "0.3.0-2"),
         ("0.3.0-10", "0.3.0-9"), ("1.0a", "1.0+"), ("1.0", "1.0.0"), ("2.0~~", "2.0~"),
         ("0.10", "0.9"), ("1.0-1+b1", "1.0-1"), ("1.001", "1.1"), ("a", "b"), ("1.0+dfsg", "1.0")]


@pytest.mark.parametrize("a,b", PAIRS)
def test_versions_are_ordered_as_dpkg_orders_them(a, b):
    dpkg = {op: subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0
            for op in ("lt", "eq", "gt")}
    said = rules.compare_versions(a, b)
    assert dpkg == {"lt": said < 0, "eq": said == 0, "gt": said > 0}
    assert rules.compare_versions(b, a) == -said


def stanza(package: str, version: str) -> str:
    return (f"Package: {package}\nVersion: {version}\nArchitecture: all\n"
            f"Description: x\n long text\n Package: {package}\n")


def test_the_lists_are_read_for_the_package_alone_and_bounded(tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    # Debian's own index: big, and the package not in it; the package's repository:
    # the package first in the file, and again later, past a chunk's end
    filler = "".join(stanza(f"pkg{i}", "1.0") + "\n" for i in range(30000))
    (lists / "deb.debian.org_debian_dists_trixie_main_binary-arm64_Packages").write_text(filler)
    assert len(filler) > apt.CHUNK
    (lists / "repo_dists_stable_main_binary-arm64_Packages").write_text(
        stanza("edge-agent", "0.3.0-1") + "\n" + filler + stanza("edge-agent", "0.3.1-1")
        + "\n" + stanza("edge-agent-extra", "9.0") + "\n" + stanza("edge-agent", "bad version!"))
    (lists / "repo_dists_stable_InRelease").write_text("Package: edge-agent\nVersion: 99\n")
    os.symlink("/etc/passwd", lists / "link_Packages")
    os.mkfifo(lists / "fifo_Packages")
    t = time.monotonic()
    said = apt.read_repository(str(lists), str(tmp_path / "no-stamp"))
    assert time.monotonic() - t < 2, "a fifo or a big list is never waited on"
    assert said["newest"] == "0.3.1-1"
    assert said["since"] == "lists" and said["apt_success_at"] == pytest.approx(
        os.stat(lists).st_mtime, abs=0.01)
    stamp = tmp_path / "update-success-stamp"
    stamp.write_text("")
    os.utime(stamp, (1.7e9, 1.7e9))
    said = apt.read_repository(str(lists), str(stamp))
    assert said["since"] == "stamp" and said["apt_success_at"] == 1.7e9
    assert rules.behind("0.3.0-1", said["newest"]) is True
    assert rules.behind("0.3.1-1", said["newest"]) is False
    assert rules.behind("", said["newest"]) is None and rules.behind("0.3.0-1", None) is None


def test_the_watch_reads_again_only_when_apt_changed_something(tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    now = [0.0]
    watch = apt.RepositoryWatch(str(lists), str(tmp_path / "stamp"), clock=lambda: now[0])
    assert watch.snapshot()["newest"] is None
    new = lists / "repo_Packages"
    new.write_text(stanza("edge-agent", "0.4.0-1"))
    assert watch.snapshot()["newest"] is None, "looked at again only after LOOK_EVERY_S"
    now[0] = apt.LOOK_EVERY_S
    assert watch.snapshot()["newest"] == "0.4.0-1"
    assert apt.RepositoryWatch(str(tmp_path / "none")).snapshot() is None


def test_the_status_says_the_newer_version_and_how_long_ago_apt_succeeded():
    text = status._update_text({"installed": "0.3.0-1", "repository": {
        "newest": "0.3.1-1", "behind": True, "apt_success_at": time.time() - 3 * 86400,
        "since": "stamp"}})
    assert "apt offers 0.3.1-1 (newer: not installed yet)" in text
    assert "apt updated 72.0 h ago" in text, text
    text = status._update_text({"installed": "0.3.0-1", "repository": {
        "newest": None, "behind": None, "apt_success_at": None, "since": None}})
    assert "apt's lists offer no edge-agent" in text


def test_the_board_makes_its_document_again_now_and_then_for_what_parts_read_themselves(tmp_path):
    """apt's lists change without the agent hearing of it: the board's turn makes the
    document again every DOCUMENT_REFRESH_S, so the file and the metrics follow."""
    from agent.app import board as board_mod
    from agent.app.state_health import StorageHealth
    from agent.runtime.systemd import Notifier
    offered = ["0.3.0-1"]
    b = board_mod.StatusBoard(str(tmp_path / "status.json"), Notifier({}), device_id=lambda: "s",
                              server="http://x", storage=StorageHealth(str(tmp_path)),
                              pairing=lambda: None, link_now=dict)
    b.show({"update": lambda: {"repository": {"newest": offered[0]}},
            **{k: dict for k in ("credentials", "uploads", "events")},
            "journal": list, "commands": list})
    b.refresh()
    offered[0] = "0.3.1-1"
    start = time.monotonic()
    b.turn(start + 1)
    assert b.document()["update"]["repository"]["newest"] == "0.3.1-1"
    import json
    assert json.loads((tmp_path / "status.json").read_text())["update"]["repository"][
        "newest"] == "0.3.0-1", "not before its time"
    b.turn(start + board_mod.DOCUMENT_REFRESH_S + 1)
    assert json.loads((tmp_path / "status.json").read_text())["update"]["repository"][
        "newest"] == "0.3.1-1"
