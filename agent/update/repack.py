"""The installed version's .deb, rebuilt from dpkg's own record of it: the way back
for the first self-update of a screen that was installed with apt (apt keeps no copy
of a package it installed from a file, and cleans its cache of the others).

What dpkg-repack does, for the one package: its files as the .list names them, each
checked against the package's md5sums (a file changed since the install means there
is no faithful way back: refused), its control fields and maintainer scripts.

Its conffiles go in as the package shipped them, never as the operator edited them:
dpkg records a conffile's shipped hash, and a rebuilt package shipping the edited file
would make the next update take the edit for the default and replace it (and would
carry the device token in a package). The package keeps a pristine copy of each
conffile under /usr/share/edge-agent/ (``PRISTINE``); a conffile that was edited and
has no pristine copy of the recorded hash is refused.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile

INFO_DIR = "/var/lib/dpkg/info"
PRISTINE = "/usr/share/edge-agent"
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


def repack(package: str, out: str, work: str, info_dir: str = INFO_DIR,
           pristine_dir: str = PRISTINE) -> str:
    """Builds ``out`` from the installed ``package``; returns its version."""
    fields = status_fields(package)
    if fields.get("Status") != "install ok installed":
        raise RepackError(f"{package} is not fully installed ({fields.get('Status')})")
    # " /etc/x <md5>", and a flag after it for obsolete or remove-on-upgrade ones,
    # which the package no longer ships
    entries = [line.split() for line in fields.get("Conffiles", "").splitlines()]
    conffiles = {parts[0]: parts[1] for parts in entries if len(parts) == 2}
    flagged = {parts[0] for parts in entries if len(parts) > 2}
    sums = {}
    with open(os.path.join(info_dir, f"{package}.md5sums")) as f:
        for line in f:
            digest, _, path = line.rstrip("\n").partition("  ")
            sums["/" + path] = digest
    tree = tempfile.mkdtemp(prefix=".repack.", dir=work)   # 0700 while it is filled
    try:
        return _build(package, fields, conffiles, flagged, sums, info_dir, pristine_dir,
                      tree, out)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _build(package: str, fields: dict, conffiles: dict, flagged: set, sums: dict,
           info_dir: str, pristine_dir: str, tree: str, out: str) -> str:
    os.makedirs(os.path.join(tree, "DEBIAN"), 0o755)
    with open(os.path.join(info_dir, f"{package}.list")) as f:
        paths = [line.rstrip("\n") for line in f if line.strip() not in ("", "/.")]
    for path in paths:
        dest = tree + path
        if path in flagged:
            continue   # an obsolete conffile: dpkg lists it, the package no longer ships it
        if path in conffiles:   # as shipped, even if the operator deleted it
            _copy_conffile(path, conffiles[path], dest, pristine_dir)
            continue
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) and os.path.isdir(path) and any(
                p.startswith(path + "/") for p in paths):
            st = os.stat(path)   # a directory the system made a link (merged /usr)
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
            if sums.get(path) != digest.hexdigest():
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
    os.chmod(tree, 0o755)   # dpkg-deb wants the tree's root as a package's root
    r = subprocess.run(["dpkg-deb", "--root-owner-group", "--build", tree, out],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RepackError(f"dpkg-deb: {(r.stderr or r.stdout).strip()[-200:]}")
    return fields["Version"]


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_conffile(path: str, shipped: str, dest: str, pristine_dir: str) -> None:
    """The conffile as the package shipped it (its recorded hash): the file itself if
    unedited, else the package's pristine copy."""
    candidates = [path, os.path.join(pristine_dir, os.path.basename(path))]
    for source in candidates:
        st = os.lstat(source) if os.path.lexists(source) else None
        if st is not None and stat.S_ISREG(st.st_mode) and _md5(source) == shipped:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(source, dest)
            os.chmod(dest, 0o644)
            return
    raise RepackError(f"{path} was edited and the package keeps no copy of it as shipped")


def _write(path: str, text: str, mode: int) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
