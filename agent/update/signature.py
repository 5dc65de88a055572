"""A package's detached OpenPGP signature, checked with Debian's gpgv against the keys
installed on the device: what stops a fleet server, or anyone who owns one, from
pushing code that runs as root to every screen.

The agent checks before it stages (so a refusal is reported at once), and the root
side checks its own copy again before dpkg sees it: the agent is what the network
talks to, and is not trusted to have checked.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile

KEYS_DIR = "/etc/edge-agent/update-keys"
GPGV = "/usr/bin/gpgv"
MAX_KEYS = 16


class SignatureError(Exception):
    """A one-line reason the package is not trusted."""


def keyrings(keys_dir: str = KEYS_DIR) -> list[str]:
    """The ``*.gpg`` keyrings (binary, as ``gpg --export`` writes them) in a directory
    only root can write, none of them a link."""
    try:
        st = os.lstat(keys_dir)
    except FileNotFoundError:
        raise SignatureError(f"no update keys: {keys_dir} does not exist") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SignatureError(f"{keys_dir}: not a directory that only root can write")
    found = []
    for name in sorted(os.listdir(keys_dir)):
        if not name.endswith(".gpg"):
            continue
        path = os.path.join(keys_dir, name)
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise SignatureError(f"{path}: not a regular file that only root can write")
        found.append(path)
    if not found:
        raise SignatureError(f"no update keys: no *.gpg keyring in {keys_dir}")
    return found[:MAX_KEYS]


def verify(package: str, signature: bytes, keys_dir: str = KEYS_DIR,
           timeout_s: float = 60.0, as_user: str | None = None) -> str:
    """The signing key's fingerprint if ``signature`` is a good signature of the file
    ``package`` by one of the keys; SignatureError otherwise. ``as_user``: gpgv runs as
    that user (root's side: the bytes it parses are the network's), so ``package``
    and the keys must be readable by it."""
    rings = keyrings(keys_dir)
    with tempfile.TemporaryDirectory(prefix="edge-agent-gpgv.") as home:
        sig = os.path.join(home, "package.sig")
        with open(sig, "wb") as f:
            f.write(signature)
        if as_user is not None:
            # root's copies, readable by that user whatever the keys' own modes
            copies = []
            for i, ring in enumerate(rings):
                copy = os.path.join(home, f"key{i}.gpg")
                shutil.copyfile(ring, copy)
                os.chmod(copy, 0o644)
                copies.append(copy)
            rings = copies
            os.chmod(home, 0o755)
            os.chmod(sig, 0o644)
        argv = [GPGV, "--homedir", home, "--status-fd", "1",
                # a Pi has no real-time clock: before NTP a good signature is "made in the
                # future"; when it was made proves nothing either way
                "--ignore-time-conflict"]
        for ring in rings:
            argv += ["--keyring", ring]
        try:
            r = subprocess.run([*argv, sig, package], capture_output=True, timeout=timeout_s,
                               stdin=subprocess.DEVNULL, env={"LANG": "C", "PATH": "/usr/bin:/bin"},
                               user=as_user, group=as_user and "nogroup",
                               extra_groups=[] if as_user else None)
        except FileNotFoundError:
            raise SignatureError(f"{GPGV} is not installed (package gpgv)") from None
        except subprocess.TimeoutExpired:
            raise SignatureError(f"gpgv took more than {timeout_s:.0f}s") from None
    status = r.stdout.decode(errors="replace").splitlines()
    valid = [line.split()[2] for line in status
             if line.startswith("[GNUPG:] VALIDSIG ") and len(line.split()) > 2]
    if r.returncode == 0 and valid:
        return valid[0]
    for line in status:
        if line.startswith("[GNUPG:] BADSIG"):
            raise SignatureError("bad signature: the package is not what the key signed")
        if line.startswith("[GNUPG:] NO_PUBKEY"):
            raise SignatureError("signed by a key that is not installed in " + keys_dir)
        if line.startswith(("[GNUPG:] EXPKEYSIG", "[GNUPG:] REVKEYSIG")):
            raise SignatureError("signed by an expired or revoked key")
    if any(line.startswith("[GNUPG:] NODATA") for line in status):
        raise SignatureError("the signature is not an OpenPGP signature")
    raise SignatureError(f"gpgv refused it (exit {r.returncode})")
