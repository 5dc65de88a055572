"""The .deb, as built: lint-clean. Installing, running, upgrading and purging it are
proven on a booted Debian with systemd as PID 1 (tests/test_booted_systemd.py)."""
import re
import subprocess

from agent import __version__


def test_deb_lints_clean(built_debs):
    assert [d.name for d in built_debs] == [f"edge-agent_{__version__}-1_all.deb",
                                            f"edge-agent_{__version__}-2_all.deb"]
    for deb in built_debs:
        r = subprocess.run(["lintian", "--fail-on", "error,warning", str(deb)],
                           capture_output=True, text=True, timeout=600)
        problems = [line for line in r.stdout.splitlines() if re.match(r"^[EW]: ", line)]
        assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_every_package_of_the_agent_is_in_the_deb(built_debs):
    """A subpackage left out of pyproject's list is missing from the .deb: the agent
    then dies at import on the device, while every test from the checkout passes."""
    from pathlib import Path
    listing = subprocess.run(["dpkg-deb", "-c", str(built_debs[0])], capture_output=True,
                             text=True, timeout=60).stdout
    repo = Path(__file__).resolve().parent.parent
    for init in sorted(repo.glob("agent/**/__init__.py")):
        package = init.parent.relative_to(repo)
        assert f"/dist-packages/{package}/__init__.py" in listing, f"{package} is not in the .deb"


def test_the_deb_carries_the_journal_gate_and_the_polkit_rule(built_debs):
    """The agent's `logs` command needs the socket and its helper (the agent is not in
    systemd-journal); its `reboot` needs the rule; `journalctl -x` the catalog. Each as a
    root-owned 0644 file."""
    listing = subprocess.run(["dpkg-deb", "-c", str(built_debs[0])], capture_output=True,
                             text=True, timeout=60).stdout
    for path in ("./usr/lib/systemd/system/edge-agent-logs.socket",
                 "./usr/lib/systemd/system/edge-agent-logs@.service",
                 "./usr/lib/systemd/system/edge-agent.service",
                 "./usr/share/polkit-1/rules.d/50-edge-agent.rules",
                 "./usr/lib/systemd/catalog/edge-agent.catalog"):
        assert re.search(rf"^-rw-r--r-- root/root .* {re.escape(path)}$", listing, re.M), path


def test_the_entry_point_runs_nothing_the_agents_user_can_write(built_debs, tmp_path):
    """The agent's user owns its home (the state directory, $HOME under systemd): a
    usercustomize, sitecustomize or .pth planted there, or PYTHON* variables, must not
    run when /usr/bin/edge-agent starts. Its interpreter line, as the .deb ships it,
    with the hooks each in place; the same interpreter without the flag runs them (so
    this test can fail)."""
    import os
    import sys
    out = tmp_path / "deb"
    subprocess.run(["dpkg-deb", "-x", str(built_debs[0]), str(out)], check=True, timeout=60)
    first = (out / "usr/bin/edge-agent").read_text().splitlines()[0]
    assert first.startswith("#!")
    interpreter = first[2:].split()
    assert interpreter == ["/usr/bin/python3", "-I"], first
    home = tmp_path / "home"
    version = subprocess.run([interpreter[0], "-c", "import sys; print('%d.%d' % "
                              "sys.version_info[:2])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    site = home / ".local" / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    marks = home / "ran"
    hook = f"open({str(marks)!r} + '-' + {{!r}}, 'w').close()\n"
    (site / "usercustomize.py").write_text(hook.format("usercustomize"))
    (site / "evil.pth").write_text("import os; " + hook.format("pth"))
    (elsewhere / "sitecustomize.py").write_text(hook.format("sitecustomize"))
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(elsewhere),
           "PYTHONUSERBASE": str(home / ".local")}

    def ran(argv):
        for m in home.glob("ran-*"):
            m.unlink()
        subprocess.run([*argv, "-c", "pass"], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30)
        return sorted(m.name for m in home.glob("ran-*"))

    assert ran(interpreter[:1]) == ["ran-pth", "ran-sitecustomize", "ran-usercustomize"]
    assert ran(interpreter) == []
