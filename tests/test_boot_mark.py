"""The boot's first start of the agent (base/boot.py): told by the kernel's boot id
against the mark the last start left, in a place a service stop does not empty. Under
real systemd: tests/test_booted_systemd.py (a `systemctl restart` is no reboot)."""
import shutil

from agent.base import boot


def test_a_restart_in_the_same_boot_is_no_first_start_even_once_the_runtime_dir_is_gone(
        tmp_path, monkeypatch):
    state, runtime = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    runtime.mkdir()
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-a")
    assert boot.first_start_of_boot(str(state)) is True
    shutil.rmtree(runtime)          # systemd's stop removes RuntimeDirectory=
    runtime.mkdir()
    assert boot.first_start_of_boot(str(state)) is False
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-b")      # a reboot
    assert boot.first_start_of_boot(str(state)) is True
    assert boot.first_start_of_boot(str(state)) is False
