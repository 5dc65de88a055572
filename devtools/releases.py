"""Signed releases for the self-update tests: an OpenPGP key made with Debian's gnupg,
packages re-versioned from the one scripts/build-deb makes (dpkg-deb), and the ways a
release goes wrong on purpose (an agent that never proves its link, a postinst that
hangs so a test can cut the power in the middle of dpkg)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path


class SigningKey:
    """``key = SigningKey(dir); key.keyring`` goes into /etc/edge-agent/update-keys/."""

    def __init__(self, directory: Path, name: str = "edge-agent release"):
        self.home = directory / "gnupg"
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def reversioned(deb: Path, version: str, out_dir: Path, *, never_proves: bool = False,
                postinst_first: str = "") -> Path:
    """``deb`` as version ``version``. ``never_proves``: an agent that starts, says it
    is ready, and never calls its link proven live (so never pets the watchdog).
    ``postinst_first``: shell run first in the postinst (a hang, for a power cut)."""
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
