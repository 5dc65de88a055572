"""The installed version's .deb, rebuilt from dpkg's own record of it: the way back
for the first self-update of a screen that was installed with apt (apt keeps no copy
of a package it installed from a file, and cleans its cache of the others).

What dpkg-repack does, for the one package: its files as the .list names them, each
checked against the package's md5sums (a file changed since the install means there
is no faithful way back: refused), its control fields, maintainer scripts and
conffiles (these as they are on disk: the operator's edits are the screen's
configuration, and the reinstall keeps them with --force-confold anyway).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess

INFO_DIR = "/var/lib/dpkg/info"
SCRIPTS = ("preinst", "postinst", "prerm", "postrm", "config", "templates", "triggers")
# dpkg's, not the package's: they describe this installation
DROPPED_FIELDS = {"Status", "Config-Version", "Conffiles"}


class RepackError(Exception):
    """A one-line reason there is no faithful copy of the installed package."""


def status_fields(package: str) -> dict[str, str]:
    r = subprocess.run(["dpkg-query", "-s", package], capture_output=True, text=True,
                       timeout=60, env={"LANG": "C", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})
    if r.returncode != 0:
        raise RepackError(f"{package} is not installed")
    fields: dict[str, str] = {}
    name = None
    for line in r.stdout.splitlines():
        if line[:1] in (" ", "\t") and name:
            fields[name] += "\n" + line
        elif ":" in line:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def repack(package: str, out: str, work: str, info_dir: str = INFO_DIR) -> str:
    """Builds ``out`` from the installed ``package``; returns its version."""
    fields = status_fields(package)
    if fields.get("Status") != "install ok installed":
        raise RepackError(f"{package} is not fully installed ({fields.get('Status')})")
    conffiles = {line.split()[0] for line in fields.get("Conffiles", "").splitlines()
                 if line.strip()}
    sums = {}
    with open(os.path.join(info_dir, f"{package}.md5sums")) as f:
        for line in f:
            digest, _, path = line.rstrip("\n").partition("  ")
            sums["/" + path] = digest
    tree = os.path.join(work, "tree")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(os.path.join(tree, "DEBIAN"), 0o755)
    with open(os.path.join(info_dir, f"{package}.list")) as f:
        paths = [line.rstrip("\n") for line in f if line.strip() not in ("", "/.")]
    for path in paths:
        st = os.lstat(path)
        dest = tree + path
        if stat.S_ISDIR(st.st_mode):
            os.makedirs(dest, exist_ok=True)
            os.chmod(dest, stat.S_IMODE(st.st_mode))
        elif stat.S_ISLNK(st.st_mode):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.symlink(os.readlink(path), dest)
        elif stat.S_ISREG(st.st_mode):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(path, "rb") as src, open(dest, "wb") as dst:
                digest = hashlib.md5(usedforsecurity=False)
                for chunk in iter(lambda: src.read(1 << 16), b""):
                    digest.update(chunk)
                    dst.write(chunk)
            if path not in conffiles and sums.get(path) != digest.hexdigest():
                raise RepackError(f"{path} has changed since {package} was installed")
            os.chmod(dest, stat.S_IMODE(st.st_mode))
        else:
            raise RepackError(f"{path}: not a file, directory or link")
    control = "".join(f"{k}: {v}\n" for k, v in fields.items() if k not in DROPPED_FIELDS)
    _write(os.path.join(tree, "DEBIAN", "control"), control, 0o644)
    if conffiles:
        _write(os.path.join(tree, "DEBIAN", "conffiles"),
               "".join(f"{c}\n" for c in sorted(conffiles)), 0o644)
    with open(os.path.join(info_dir, f"{package}.md5sums")) as f:
        _write(os.path.join(tree, "DEBIAN", "md5sums"), f.read(), 0o644)
    for script in SCRIPTS:
        source = os.path.join(info_dir, f"{package}.{script}")
        if os.path.exists(source):
            shutil.copyfile(source, os.path.join(tree, "DEBIAN", script))
            os.chmod(os.path.join(tree, "DEBIAN", script),
                     0o644 if script in ("templates", "triggers") else 0o755)
    r = subprocess.run(["dpkg-deb", "--root-owner-group", "--build", tree, out],
                       capture_output=True, text=True, timeout=300)
    shutil.rmtree(tree, ignore_errors=True)
    if r.returncode != 0:
        raise RepackError(f"dpkg-deb: {(r.stderr or r.stdout).strip()[-200:]}")
    return fields["Version"]


def _write(path: str, text: str, mode: int) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
