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


def test_a_container_whose_sandbox_sees_the_hosts_boot_id_is_told_by_its_managers_start(
        tmp_path, monkeypatch):
    """Booted bookworm in systemd-nspawn: under the unit's ProtectProc= the agent read the
    host's boot id, the same after the container rebooted, so no start was ever the
    boot's first again (the device part never said why the last boot ended). The service
    manager's start changes at each boot, a container's too."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(boot, "boot_id", lambda: "the-hosts")
    monkeypatch.setattr(boot, "manager_started", lambda: "1000")
    assert boot.first_start_of_boot(str(state)) is True
    assert boot.first_start_of_boot(str(state)) is False      # a service restart
    monkeypatch.setattr(boot, "manager_started", lambda: "2000")   # the container rebooted
    assert boot.first_start_of_boot(str(state)) is True
    assert boot.first_start_of_boot(str(state)) is False



def test_the_upgrade_from_0_2_2_is_no_boot(tmp_path, monkeypatch):
    """0.2.2 kept its mark in the runtime directory, which the package's restart keeps:
    the first start of this release within that boot is not the boot's first."""
    state, runtime = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    runtime.mkdir()
    (runtime / boot.BOOT_MARK).write_text("boot-a")
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-a")
    monkeypatch.setattr(boot, "manager_started", lambda: "1000")
    assert boot.first_start_of_boot(str(state), str(runtime)) is False
    assert (state / boot.BOOT_MARK).read_text() == "boot-a 1000"
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-b")      # a reboot since
    assert boot.first_start_of_boot(str(state), str(runtime)) is True


def test_the_upgrade_from_a_release_before_the_boot_mark_is_no_boot(tmp_path, monkeypatch):
    """0.1.0 to 0.2.1 left no boot mark anywhere, but each wrote its status file in the
    runtime directory, a tmpfs that the package's restart keeps and a boot empties."""
    state, runtime = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    runtime.mkdir()
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-a")
    monkeypatch.setattr(boot, "manager_started", lambda: "1000")
    (runtime / "status.json").write_text("{}")
    assert boot.first_start_of_boot(str(state), str(runtime)) is False
    assert (state / boot.BOOT_MARK).read_text() == "boot-a 1000"
    (runtime / "status.json").unlink()        # the reboot empties the tmpfs
    monkeypatch.setattr(boot, "boot_id", lambda: "boot-b")
    assert boot.first_start_of_boot(str(state), str(runtime)) is True
    # a first install: neither a mark nor a status file: the boot's first start
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert boot.first_start_of_boot(str(fresh), str(runtime)) is True
