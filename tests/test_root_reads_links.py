"""Root reads a file a root-owned setting names (doctor reading the unit's
EnvironmentFile=) as systemd does, links followed, except a link someone but root could
have planted: the agent's user owns its state directory, and doctor prints what it read."""
import os

import pytest

from agent.app import unit_env
from agent.base.fsutil import UnsafePath, read_following_roots_links

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CI runs as root)")


def _tree(tmp_path):
    root_dir = tmp_path / "etc"
    root_dir.mkdir(mode=0o755)
    secret = root_dir / "secret.env"
    secret.write_text("EDGE_AGENT_SERVER_URL=https://root-only.example\n")
    agents = tmp_path / "state"
    agents.mkdir(mode=0o755)
    os.chown(agents, NOBODY, NOBODY)
    return root_dir, secret, agents


def test_a_link_in_roots_own_directory_is_followed_as_systemd_does(tmp_path):
    root_dir, secret, _ = _tree(tmp_path)
    (root_dir / "site.env").symlink_to(secret)
    (root_dir / "relative.env").symlink_to("secret.env")
    assert b"root-only" in read_following_roots_links(str(root_dir / "site.env"), 4096)
    assert b"root-only" in read_following_roots_links(str(root_dir / "relative.env"), 4096)
    assert b"root-only" in read_following_roots_links(
        str(root_dir / ".." / "etc" / "." / "secret.env"), 4096)


def test_a_link_the_agents_user_could_plant_is_not_followed(tmp_path):
    _, secret, agents = _tree(tmp_path)
    (agents / "env").symlink_to(secret)
    with pytest.raises(UnsafePath, match="not followed as root"):
        read_following_roots_links(str(agents / "env"), 4096)
    # a link to that directory from root's own is followed, the link inside it is not
    via = tmp_path / "etc" / "state"
    via.symlink_to(agents)
    with pytest.raises(UnsafePath):
        read_following_roots_links(str(via / "env"), 4096)
    # its own plain file is read: systemd reads it too, and it is the agent's own words
    (agents / "plain.env").write_text("EDGE_AGENT_X=1\n")
    assert read_following_roots_links(str(agents / "plain.env"), 4096) == b"EDGE_AGENT_X=1\n"


def test_a_link_in_a_sticky_world_writable_directory_is_not_followed(tmp_path):
    _, secret, _ = _tree(tmp_path)
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "env").symlink_to(secret)
    with pytest.raises(UnsafePath):
        read_following_roots_links(str(shared / "env"), 4096)


def test_a_loop_of_links_ends(tmp_path):
    root_dir, _, _ = _tree(tmp_path)
    (root_dir / "a").symlink_to("b")
    (root_dir / "b").symlink_to("a")
    with pytest.raises(OSError):
        read_following_roots_links(str(root_dir / "a"), 4096)


def test_doctor_as_root_notes_the_environment_file_it_would_not_follow(tmp_path, monkeypatch):
    _, secret, agents = _tree(tmp_path)
    (agents / "env").symlink_to(secret)
    shown = ("LoadState=loaded\nEnvironment=\nFragmentPath=\nDropInPaths=\n"
             f"EnvironmentFiles={agents / 'env'} (ignore_errors=no)\n")
    monkeypatch.setattr(unit_env.os.path, "isdir", lambda p: True)
    monkeypatch.setattr(unit_env, "_systemctl",
                        lambda args: (shown, "") if args[0] == "show" else ("", ""))
    env = unit_env.read()
    assert "EDGE_AGENT_SERVER_URL" not in env.values
    assert len(env.notes) == 1 and "not followed as root" in env.notes[0], env.notes
    assert "root-only" not in " ".join(env.notes)
