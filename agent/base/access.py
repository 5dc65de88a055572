"""Whether the agent's user can read the files its configuration names: root checks it
as that user (a forked child that becomes it and opens each file, so modes, groups and
ACLs all count); anyone else can only reason from the modes, and says so."""
from __future__ import annotations

import grp
import json
import os
import pwd
import stat

AGENT_USER = "edge-agent"


def check(paths: dict[str, str], user: str = AGENT_USER) -> tuple[str, dict[str, str]]:
    """(how it was checked, {key: why ``user`` cannot read it}) for ``paths``
    ({key: path}). Raises LookupError when ``user`` does not exist here."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise LookupError(f"no user {user} on this system") from None
    if os.geteuid() == pw.pw_uid:
        return f"as {user}", _opened(paths)
    if os.geteuid() == 0:
        return f"as {user} (uid {pw.pw_uid})", _as_user(paths, pw)
    return (f"from the modes alone (as uid {os.geteuid()}: run it as root to open each "
            f"file as {user}; ACLs not read)", _by_modes(paths, pw))


def _opened(paths: dict[str, str]) -> dict[str, str]:
    problems = {}
    for key, path in paths.items():
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            problems[key] = e.strerror or str(e)
    return problems


def _as_user(paths: dict[str, str], pw) -> dict[str, str]:
    groups = [g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: becomes the user for good, opens, reports, ends
        code = 1
        try:
            os.close(r)
            os.setgroups([pw.pw_gid, *groups])
            os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
            os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
            os.write(w, json.dumps(_opened(paths)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return {key: f"could not check as {pw.pw_name}" for key in paths}
    return json.loads(out)


def _by_modes(paths: dict[str, str], pw) -> dict[str, str]:
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem}
    problems = {}
    for key, path in paths.items():
        path = os.path.abspath(path)
        parts = path.split("/")
        try:
            for i in range(1, len(parts)):   # every directory on the way: search
                d = "/".join(parts[:i]) or "/"
                if not _allowed(os.stat(d), pw.pw_uid, gids, stat.S_IXUSR):
                    problems[key] = f"{pw.pw_name} cannot enter {d}"
                    break
            else:
                if not _allowed(os.stat(path), pw.pw_uid, gids, stat.S_IRUSR):
                    problems[key] = f"not readable by {pw.pw_name} (its mode and owner)"
        except OSError as e:
            problems[key] = f"cannot tell ({e.strerror})"
    return problems


def _allowed(st: os.stat_result, uid: int, gids: set, bit: int) -> bool:
    """``bit`` as the owner's (S_IRUSR or S_IXUSR), checked for uid and its groups."""
    if st.st_uid == uid:
        return bool(st.st_mode & bit)
    if st.st_gid in gids:
        return bool(st.st_mode & (bit >> 3))
    return bool(st.st_mode & (bit >> 6))
