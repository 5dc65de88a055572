"""Releases for the upgrade and self-update tests: an OpenPGP key made with Debian's
gnupg, packages re-versioned from the one scripts/build-deb makes (dpkg-deb), the
package a landed commit built (what screens in the field run), and the ways a release
goes wrong on purpose (an agent that never proves its link, a postinst that hangs so a
test can cut the power in the middle of dpkg)."""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# beside the booted tests' root filesystems: outside the repository, kept between runs
DEB_CACHE = Path(os.environ.get("EDGE_AGENT_DEB_CACHE", "/var/cache/edge-agent/debs"))


class SigningKey:
    """``key = SigningKey(dir); key.keyring`` goes into /etc/edge-agent/update-keys/."""

    def __init__(self, directory: Path, name: str = "edge-agent release"):
        # gpg-agent's sockets live in its home, and a Unix socket's path has 108 bytes:
        # under a test's deep temporary directory key generation failed (exit 2)
        directory.mkdir(parents=True, exist_ok=True)
        self.home = Path(tempfile.mkdtemp(prefix="gpg-", dir="/tmp"))
        self._gpg("--quick-gen-key", f"{name} <release@edge-agent.invalid>", "ed25519",
                  "sign", "never")
        self.keyring = directory / f"{name.replace(' ', '-')}.gpg"
        self.keyring.write_bytes(self._gpg("--export").stdout)

    def _gpg(self, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--pinentry-mode",
                               "loopback", "--homedir", str(self.home), *args],
                              capture_output=True, check=True, timeout=60, input=input)

    def sign(self, path: Path) -> Path:
        """The detached signature, beside the package, as an operator makes it."""
        sig = path.with_name(path.name + ".sig")
        sig.unlink(missing_ok=True)
        self._gpg("--detach-sign", "--output", str(sig), str(path))
        return sig


def built_at(commit: str, cache: Path = DEB_CACHE) -> Path:
    """The .deb the tree of ``commit`` builds, as its own scripts/build-deb built it
    (its debian/ and its files, dpkg-buildpackage -b on this host), made once per
    commit and kept in ``cache``: the package screens installed from a landed state."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    out = cache / f"edge-agent-{full}.deb"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # a second run waits for the first one's build
        if out.exists():
            return out
        with tempfile.TemporaryDirectory(dir=cache) as work:
            src = Path(work) / "edge-agent"
            src.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", full],
                                     capture_output=True, check=True, timeout=120).stdout
            subprocess.run(["tar", "-C", str(src), "-xf", "-"], input=archive, check=True,
                           timeout=120)
            r = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src,
                               capture_output=True, text=True, timeout=900,
                               env={**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
            if r.returncode != 0:
                raise RuntimeError(f"building {commit}: {(r.stdout + r.stderr)[-2000:]}")
            built = list(Path(work).glob("edge-agent_*_all.deb"))
            if len(built) != 1:
                raise RuntimeError(f"building {commit}: no single .deb in {os.listdir(work)}")
            shutil.copy(built[0], cache / f".{out.name}.{os.getpid()}")
            os.rename(cache / f".{out.name}.{os.getpid()}", out)
    return out


def reversioned(deb: Path, version: str, out_dir: Path, *, never_proves: bool = False,
                postinst_first: str = "", defaults: dict[str, str] | None = None) -> Path:
    """``deb`` as version ``version``. ``never_proves``: an agent that starts, says it
    is ready, and never calls its link proven live (so never pets the watchdog).
    ``postinst_first``: shell run first in the postinst (a hang, for a power cut).
    ``defaults``: lines the shipped defaults file gets in place of the line it starts
    with ({"# heartbeat_interval_s": "heartbeat_interval_s = 20"}), as a release that
    changed its defaults ships them."""
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        tree = Path(work) / "tree"
        subprocess.run(["dpkg-deb", "-R", str(deb), str(tree)], check=True, timeout=120)
        control = tree / "DEBIAN" / "control"
        control.write_text(re.sub(r"^Version: .*$", f"Version: {version}", control.read_text(),
                                  flags=re.M))
        if never_proves:
            liveness = next(tree.glob("usr/lib/python3/dist-packages/agent/link/liveness.py"))
            text = liveness.read_text()
            marker = "    def proven_live(self, now: float) -> bool:\n"
            assert marker in text, "liveness.py has no proven_live() to break"
            liveness.write_text(text.replace(marker, marker + "        return False\n", 1))
            _fix_md5sums(tree)
        if defaults:
            shipped = tree / "usr" / "lib" / "edge-agent" / "agent.toml"
            text = shipped.read_text()
            for start, line in defaults.items():
                text, n = re.subn(rf"^{re.escape(start)}.*$", line, text, count=1, flags=re.M)
                assert n == 1, f"the shipped defaults have no line starting {start!r}"
            shipped.write_text(text)
            _fix_md5sums(tree)
        if postinst_first:
            postinst = tree / "DEBIAN" / "postinst"
            lines = postinst.read_text().splitlines(keepends=True)
            postinst.write_text(lines[0] + postinst_first + "\n" + "".join(lines[1:]))
        out = out_dir / f"edge-agent_{version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(tree), str(out)],
                       check=True, capture_output=True, timeout=120)
    return out


def _fix_md5sums(tree: Path) -> None:
    lines = []
    for root, _, names in os.walk(tree):
        for name in names:
            path = Path(root) / name
            rel = path.relative_to(tree)
            if rel.parts[0] == "DEBIAN" or path.is_symlink():
                continue
            lines.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}\n")
    conffiles = (tree / "DEBIAN" / "conffiles")
    skip = set(conffiles.read_text().split()) if conffiles.exists() else set()
    (tree / "DEBIAN" / "md5sums").write_text(
        "".join(sorted(l for l in lines if "/" + l.split("  ", 1)[1].strip() not in skip)))
