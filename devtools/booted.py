"""A Debian (bookworm or trixie) booted with systemd as PID 1, for tests against the
real systemd.

The root filesystem is made once per release with debootstrap and kept at a fixed path
outside the repository (``ROOTFS_CACHE``), keyed by the release and the packages in it,
so a second run skips the minute or two debootstrap takes. Each boot runs on an overlay
of it, so nothing a test does reaches the cache, and powering off throws the changes
away. Both releases boot on this bookworm host's nspawn (252), on the host's cgroup
layout: systemd 257 accepts its hybrid one inside a container (a device boots trixie on
cgroup v2).

The container is started with ``systemd-nspawn -b`` from the calling thread, so it
shares that thread's network namespace: a test inside ``NetNS`` reaches the container's
agent on loopback, and its nftables rules cut the container's flows as they cut any
other. The host has no systemd or machined (``--register=no --keep-unit``); on its
mixed cgroup layout nspawn needs its ``payload`` and ``supervisor`` groups made first,
in a group of our own that is removed at power-off.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOTFS_CACHE = Path(os.environ.get("EDGE_AGENT_ROOTFS_CACHE", "/var/cache/edge-agent/rootfs"))
# the releases a screen runs: Debian 12, and Debian 13 that Raspberry Pi OS is now based on
SUITES = ("bookworm", "trixie")
# what a booted system needs beyond minbase; the package's own dependencies are added
BASE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3")
INSIDE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "TERM": "dumb",
              "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "DEBIAN_FRONTEND": "noninteractive"}


class BootError(Exception):
    pass


# -- the root filesystem ------------------------------------------------------------
def package_depends(control: Path, field: str = "Depends") -> list[str]:
    """The literal package names in a relation field of the binary package (no
    substvars): Depends, or Recommends (apt installs those too)."""
    text = control.read_text()
    m = re.search(rf"^{field}:(.*?)(?=^\S|\Z)", text, re.M | re.S)
    names = []
    for alt in (m.group(1).split(",") if m else []):
        name = alt.split("|")[0].strip().split(" ")[0].split("(")[0].strip()
        if name and not name.startswith("$"):
            names.append(name)
    return names


def host_mirror() -> str:
    """The Debian mirror the host's apt uses, so debootstrap goes where apt is allowed
    (one archive serves every release)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):  # deb822
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+\s", text, re.M):
            if m.group(1).rstrip("/").endswith("/debian"):
                return m.group(1)
    return "http://deb.debian.org/debian"


def ensure_rootfs(packages: list[str], later: list[str] = (), log=print,
                  suite: str = "bookworm") -> Path:
    """The cached root of ``suite`` with ``packages`` in it; made with debootstrap if absent.
    ``later`` are installed with apt in a chroot afterwards: packages whose maintainer
    scripts debootstrap's bare configure stage cannot run (polkitd)."""
    if suite not in SUITES:
        raise BootError(f"suite: {suite!r} is not one of {', '.join(SUITES)}")
    include = sorted(set(BASE_PACKAGES) | set(packages))
    later = sorted(set(later) - set(include))
    key = hashlib.sha256(f"{suite} {' '.join(include)} + {' '.join(later)}".encode()).hexdigest()[:12]
    root = ROOTFS_CACHE / f"{suite}-{key}"
    if (root / ".complete").exists():
        return root
    ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    with open(ROOTFS_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first one's build
        if (root / ".complete").exists():
            return root
        tmp = Path(tempfile.mkdtemp(dir=ROOTFS_CACHE, prefix=f".{root.name}."))
        mirror = host_mirror()
        log(f"building the {suite} rootfs in {root} with debootstrap from {mirror} (once)")
        t0 = time.monotonic()
        r = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(include)}",
                            suite, str(tmp), mirror], capture_output=True, text=True,
                           timeout=1200)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BootError(f"debootstrap failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
        if later:
            subprocess.run(["mount", "-t", "proc", "proc", str(tmp / "proc")], check=True)
            try:
                r = subprocess.run(["chroot", str(tmp), "sh", "-c",
                                    "apt-get update -qq && apt-get install -y -q "
                                    + " ".join(later) + " && apt-get clean"],
                                   capture_output=True, text=True, timeout=900,
                                   env={**INSIDE_ENV})
            finally:
                subprocess.run(["umount", str(tmp / "proc")], check=False)
            if r.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise BootError(f"installing {' '.join(later)} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        # installs in the tests resolve against what is installed, not a mirror
        (tmp / ".complete").write_text(f"{' '.join(include)} + {' '.join(later)}\n")
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
        log(f"rootfs ready in {time.monotonic() - t0:.0f}s")
    return root


# -- cgroups of a host without systemd ----------------------------------------------
def _cgroup_mounts() -> list[Path]:
    """The hierarchies nspawn uses: the named systemd v1 one and the unified one."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            fstype, options = parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else ""
            if fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in options):
                found.append(Path(parts[4]))
    return found


def _host_runs_systemd() -> bool:
    try:
        return Path("/proc/1/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _rmdir_tree(top: Path) -> None:
    if not top.exists():
        return
    for dirpath, dirnames, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


# -- the booted system ----------------------------------------------------------------
class BootedDebian:
    """``with BootedDebian(rootfs) as os_: os_.run("systemctl", "status")``"""

    def __init__(self, rootfs: Path, name: str = "edge-screen"):
        self.rootfs = rootfs
        self.name = name
        self.leader: int | None = None
        self.proc: subprocess.Popen | None = None
        self._cgroups: list[Path] = []
        self._mounted = False

    # lifecycle
    def __enter__(self) -> "BootedDebian":
        try:
            self.boot()
        except BaseException:
            self.poweroff()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.poweroff()

    def boot(self, timeout: float = 90.0) -> None:
        self._prepare()
        self._spawn(timeout)

    def rebooted(self, timeout: float = 60.0) -> int:
        """Waits for the system inside to reboot (nspawn exits 133 for that, as a
        service unit would restart it) and boots it again on the same disk."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise BootError(f"no reboot within {timeout:.0f}s") from None
        if code != 133:
            raise BootError(f"systemd-nspawn exited {code}, not 133 (reboot)")
        self.leader = None
        for top in self._cgroups:  # the last boot's groups, emptied by its exit
            for sub in ("payload", "supervisor"):
                _rmdir_tree(top / sub)
                (top / sub).mkdir(exist_ok=True)
        self.boots += 1
        self._spawn(timeout)
        return code

    def power_cut(self, timeout: float = 60.0) -> None:
        """Everything inside dies at once, as a power cut kills it (the disk, the
        overlay's upper layer, keeps what reached it; /run does not survive), and the
        system boots again on the same disk."""
        self._kill()
        deadline = time.monotonic() + 10
        for top in self._cgroups:
            for sub in ("payload", "supervisor"):
                while (top / sub).exists() and time.monotonic() < deadline:
                    _rmdir_tree(top / sub)   # the killed ones may still be exiting
                    if (top / sub).exists():
                        time.sleep(0.05)
                (top / sub).mkdir(exist_ok=True)
        self.boots += 1
        self._spawn(timeout)

    def _kill(self) -> None:
        # killing nspawn alone would orphan the container's processes: the init of
        # their pid namespace takes all of them with it
        if self.leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(10)
        self.leader = None

    def _prepare(self) -> None:
        self.boots = 1
        self.work = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="edge-agent-booted."))
        upper, workdir, self.root = (self.work / d for d in ("upper", "work", "root"))
        for d in (upper, workdir, self.root):
            d.mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={self.rootfs},upperdir={upper},workdir={workdir}",
                        str(self.root)], check=True, capture_output=True, text=True)
        self._mounted = True
        group = f"edge-agent-test-{os.getpid()}"
        if not _host_runs_systemd():
            for mount in _cgroup_mounts():
                top = mount / group
                for sub in ("payload", "supervisor"):
                    (top / sub).mkdir(parents=True, exist_ok=True)
                self._cgroups.append(top)

    def _spawn(self, timeout: float) -> None:
        procs = [str(top / "cgroup.procs") for top in self._cgroups]

        def into_own_cgroup():
            for path in procs:
                with open(path, "w") as f:
                    f.write("0")

        self.console = open(self.work / "console.log", "ab")
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "-D", str(self.root), "-b", "--register=no", "--keep-unit",
             "--console=passive", f"--machine={self.name}",
             # systemd-networkd runs only with it (ConditionCapability=): the network's
             # healer bounces an interface networkd manages in the test's own namespace
             "--capability=CAP_NET_ADMIN"],
            stdin=subprocess.DEVNULL, stdout=self.console, stderr=subprocess.STDOUT,
            preexec_fn=into_own_cgroup)
        deadline = time.monotonic() + timeout
        own_pidns = os.readlink("/proc/self/ns/pid")
        while self.leader is None:
            if self.proc.poll() is not None:
                raise BootError(f"systemd-nspawn exited {self.proc.returncode}: {self.console_text()}")
            if time.monotonic() > deadline:
                raise BootError("the container's init never appeared: " + self.console_text())
            for pid in _descendants(self.proc.pid):
                try:
                    # the init of the container's pid namespace: pid 1 there (a child
                    # it has just forked is "systemd" in that namespace too, for a moment)
                    if (Path(f"/proc/{pid}/comm").read_text().strip() == "systemd"
                            and os.readlink(f"/proc/{pid}/ns/pid") != own_pidns
                            and _nspid(pid)[-1:] == ["1"]):
                        self.leader = pid
                        break
                except OSError:
                    continue
            time.sleep(0.05)
        while True:  # init is there before its bus is: retry until systemctl can ask
            r = self.run("systemctl", "is-system-running", "--wait", check=False,
                         timeout=max(5.0, deadline - time.monotonic()))
            # "offline": systemctl could not reach the manager yet (early in a boot
            # under load): asked again, as an empty answer is
            if r.stdout.strip() not in ("", "offline") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if r.stdout.strip() not in ("running", "degraded"):
            raise BootError(f"the system did not come up: {r.stdout.strip()} {r.stderr.strip()}")
        if r.stdout.strip() == "degraded":
            failed = self.run("systemctl", "--failed", "--no-legend", check=False).stdout
            raise BootError(f"the system came up degraded: {failed}")

    def poweroff(self, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # nspawn turns SIGTERM into the container's orderly poweroff (SIGRTMIN+3 to init)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"{self.name}: no orderly poweroff in {timeout:.0f}s, killed: "
                      + self.console_text()[-500:])
                self._kill()
        self.leader = None
        deadline = time.monotonic() + 10
        for top in self._cgroups:
            _rmdir_tree(top)
            while top.exists() and time.monotonic() < deadline:  # killed ones still exiting
                time.sleep(0.05)
                _rmdir_tree(top)
        self._cgroups = []
        if self._mounted:
            subprocess.run(["umount", str(self.root)], check=False, capture_output=True)
            self._mounted = False
        if getattr(self, "work", None) is not None:
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None

    def leftovers(self) -> list[str]:
        """What of this boot is still on the host: for the test that says nothing is."""
        left = []
        group = f"edge-agent-test-{os.getpid()}"
        left += [str(m / group) for m in _cgroup_mounts() if (m / group).exists()]
        if self.proc is not None and self.proc.poll() is None:
            left.append(f"systemd-nspawn pid {self.proc.pid}")
        return left

    # inside
    def run(self, *argv: str, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess:
        if self.leader is None:
            raise BootError("not booted")
        r = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "--", *argv],
                           capture_output=True, text=True, timeout=timeout, input=input,
                           env=INSIDE_ENV)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {r.returncode}:\n"
                                 f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def path(self, inside: str) -> Path:
        """The host's view of a path inside the container (to write files into it)."""
        return self.root / inside.lstrip("/")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *args: str) -> list[dict]:
        out = self.run("journalctl", "--no-pager", "-o", "json", *args).stdout
        entries = []
        for line in out.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry.get("MESSAGE"), list):  # journald's bytes encoding
                entry["MESSAGE"] = bytes(entry["MESSAGE"]).decode(errors="replace")
            entries.append(entry)
        return entries

    def cursor(self) -> str:
        """Where the journal ends now: ``journal("--after-cursor", c)`` reads what follows."""
        last = self.journal("-n", "1")
        return last[-1]["__CURSOR"] if last else ""

    def console_text(self) -> str:
        try:
            return (self.work / "console.log").read_text(errors="replace")[-3000:]
        except (OSError, TypeError):
            return ""


def _nspid(pid: int) -> list[str]:
    """The pid in each pid namespace it is in, outermost first (/proc's NSpid)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return line.split()[1:]
    return []


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out
