"""What the OS grants the agent beyond its sandbox follows its configuration ([commands]
allow, [screen] player_unit), no more.

The agent's privileged acts are asked of root services: logind for a reboot or a power-off,
systemd for edge-agent-update.service (a self-update) and for a restart of the player's
unit (``[screen] player_unit``), timedated for the clock and the time zone. polkit allows each
(/usr/share/polkit-1/rules.d/50-edge-agent.rules) only while its flag file exists in
GRANTS_DIR; the player's flag holds, on its first line, the one unit that may be
restarted, and exists only where a player unit is set and either the ``restart-player``
command is allowed or ``[screen] recovery`` is on (the ladder restarts it).
The network healer's flag (``[device] heal_network``) names, on its first line, the one
manager found managing the device's network (netprobe.py's rule) and, for ifupdown, its
interfaces: polkit lets the agent act through that manager alone.
The unit's root-side steps keep the flags in step with the configuration:
``ExecStartPre=-+/usr/bin/python3 -I -m agent.programs.grants`` before every start, ``--revoke``
after every stop (systemd runs ExecStopPost after a skipped ExecCondition too), so the grant
exists only while an agent runs on a configuration that allows what it grants.

Why a flag and not a rule written at run time: polkit's JavaScript cannot read the
TOML, polkitd's user is not in the edge-agent group that can, and bookworm's polkitd
122 reads rules only from /etc and /usr/share (its binary names no other directory;
only later releases read /run/polkit-1/rules.d), while one static rule serves both.

The flag directory is root's, so the agent, which the network talks to, can neither
make a grant nor plant a link that root would write through.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import stat
import sys

from ..config import load as config_mod
from ..config.model import metrics_home
from ..base.logs import early

GRANTS_DIR = "/run/edge-agent-grants"
# grant name -> the command in [commands] allow that needs it
GRANTABLE = {"reboot": "reboot", "update": "update", "poweroff": "poweroff",
             "set-time": "set-time", "set-timezone": "set-timezone"}
FLAG_TEXT = ("polkit lets the edge-agent user {name} (50-edge-agent.rules): [commands] allow "
             "in {source} lists it. Written by edge-agent.service's ExecStartPre, removed "
             "when it stops.\n")
NETWORK = "network-heal"
# the first line: the manager found managing this device's network when the agent started
# (agent/device/netprobe.py: systemd-networkd, NetworkManager or ifupdown), for ifupdown
# followed by the interfaces it manages, each after one space; polkit allows that
# manager's own acts and the restart of its unit (of ifup@IF.service for those), no other
NETWORK_TEXT = ("{manager}\n# polkit lets the edge-agent user bounce the network's interface "
                "through the manager on the line above and restart that manager, no other "
                "(50-edge-agent.rules): [device] heal_network in {source} is on. Written by "
                "edge-agent.service's ExecStartPre, removed when it stops.\n")
PLAYER = "restart-player"
# the first line is what polkit compares with the unit systemd is asked to restart: the
# unit's name alone; the rest cannot be a unit's name (it has spaces)
PLAYER_TEXT = ("{unit}\n# polkit lets the edge-agent user restart the unit on the line above, "
               "no other (50-edge-agent.rules): [screen] player_unit in {source} names it, "
               "and [commands] allow lists restart-player or [screen] recovery is on. Written "
               "by edge-agent.service's ExecStartPre, removed when it stops.\n")
MAX_FLAG = 4096
OWN_UNITS = "edge-agent"   # edge-agent.service, edge-agent-update.service: never the player


class GrantError(Exception):
    """A one-line reason the grants could not be brought in step (none is given)."""


def wanted(allow) -> frozenset:
    """The grants a configuration needs: one for each privileged command it allows."""
    return frozenset(name for name, command in GRANTABLE.items() if command in allow)


def player_unit(screen, allow) -> str | None:
    """The unit the agent may restart: ``[screen] player_unit`` (already checked to be a
    service's name, nothing that could be a path or a pattern), where the restart-player
    command is allowed or the recovery ladder is on; else None. Never one of the
    agent's own units: a restart of the updater would start it without ``update`` in
    the allow list."""
    unit = screen.player_unit
    if unit and not unit.startswith(OWN_UNITS) and (PLAYER in allow or screen.recovery):
        return unit
    return None


def network_heal(device) -> bool:
    """The network's healer asks polkit for its acts: ``[device]`` on with heal_network."""
    return device.heals_network


def network_manager(networkd_dir: str | None = None,
                    ifstate: str | None = None) -> tuple[str, tuple[str, ...]] | None:
    """What manages this device's network, as the healer finds it (netprobe.py, the one
    home of that rule), and for ifupdown the interfaces it manages; None: nothing
    known. Loaded only here: the running agent's device part, for the one grant that
    needs it (it reads the kernel, sysfs and /run, and asks nmcli)."""
    from ..device.netprobe import NetProbe
    where = {k: v for k, v in (("networkd_dir", networkd_dir), ("ifstate", ifstate)) if v}
    return NetProbe(nudge=False, **where).managing()


def flags(grants, player: str | None = None, source: str = "",
          config: str = "", network: tuple[str, tuple[str, ...]] | None = None
          ) -> dict[str, str]:
    """Each flag's name and text: the commands' ``grants`` (``source``: whose allow list
    it is), the player's unit (``config``: the operator's file, which alone names
    it), and the network's healer (``network``: [device] heal_network is on, and the
    manager found with its interfaces, as network_manager() gives them)."""
    texts = {name: FLAG_TEXT.format(name=name, source=source or "the file")
             for name in grants}
    if player:
        texts[PLAYER] = PLAYER_TEXT.format(unit=player, source=config or "the file")
    if network:
        manager, interfaces = network
        texts[NETWORK] = NETWORK_TEXT.format(manager=" ".join((manager, *interfaces)),
                                             source=config or "the file")
    return texts


def sync(grants, directory: str = GRANTS_DIR, source: str = "") -> list[str]:
    """Makes the flags in ``directory`` exactly ``grants`` (names, or a dict of each
    flag's name and text, as ``flags()`` makes it); returns what it changed
    (``+reboot``, ``-reboot``). Works through a descriptor of the directory, opened
    without following a link, owned by us and writable by nobody else. A flag whose
    text changed (another player unit) is made anew."""
    texts = grants if isinstance(grants, dict) else flags(grants, source=source)
    fd = _open_own_dir(directory, create=bool(texts))
    if fd is None:
        return []
    changed = []
    try:
        for name in sorted(set(os.listdir(fd)) - set(texts)):
            try:
                os.unlink(name, dir_fd=fd)
            except IsADirectoryError:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                continue
            changed.append(f"-{name}")
        for name in sorted(texts):
            if _is_own_file(fd, name) and _text(fd, name) == texts[name]:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
            flag = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                os.fchmod(flag, 0o644)  # the unit's UMask=0077 would hide it from polkitd
                os.write(flag, texts[name].encode())
            finally:
                os.close(flag)
            changed.append(f"+{name}")
    finally:
        os.close(fd)
    return changed


def _open_own_dir(directory: str, create: bool) -> int | None:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o755)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # nothing to revoke
    except OSError as e:
        raise GrantError(f"{directory}: not a directory of ours ({e.strerror})") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise GrantError(f"{directory}: owned by uid {st.st_uid} with mode "
                         f"{stat.S_IMODE(st.st_mode):o}, not ours alone: no grant written")
    os.fchmod(fd, 0o755)  # polkitd's user must see in; mkdir's mode went through the umask
    return fd


def _is_own_file(fd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and stat.S_IMODE(st.st_mode) == 0o644)


def _text(fd: int, name: str) -> str | None:
    try:
        flag = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                       dir_fd=fd)
    except OSError:
        return None
    try:
        return os.read(flag, MAX_FLAG).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(flag)


# Debian's prometheus-node-exporter reads textfiles here by default; the agent's is on
# tmpfs, and a link here says where. Made only while an agent writes it: a link to
# nothing is node_exporter's scrape error, on every screen with metrics off.
NODE_EXPORTER_DIR = "/var/lib/prometheus/node-exporter"
METRICS_LINK = "edge-agent.prom"
# The file node_exporter's link reaches is the agent's to write and nothing more: made
# here, in a directory of root's, on a tmpfs of its own this small. node_exporter
# opens what the link names, following links, and waits on a FIFO forever (every
# collector's scrape with it, a thread kept per scrape): in a directory the agent
# owned, the agent could put a FIFO, a link to any file node_exporter may read, a
# directory or a file as large as /run there. In root's it can only write the file,
# at most this much.
# systemd mounts it (systemd/run-edge\x2dagent\x2dmetrics.mount, pulled in by the unit's
# RequiresMountsFor=): a mount made here would stay in the unit's own namespace
METRICS_FS_BYTES = 1 << 20
METRICS_FS = (f"size={METRICS_FS_BYTES},nr_inodes=4,mode=0755,uid=0,gid=0,"
              "nosuid,nodev,noexec")   # the mount unit's Options=
AGENT_USER = "edge-agent"


def _open_root_dir(path: str) -> int:
    """``path``, every directory on the way root's and writable by root alone, opened
    without following a link anywhere; OSError (or GrantError) otherwise."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            _check_root_dir(fd, path)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        _check_root_dir(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_root_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise GrantError(f"{path}: a directory on the way is owned by uid {st.st_uid} with "
                         f"mode {stat.S_IMODE(st.st_mode):o}, not root's alone")


def prepare_metrics_file(path: str, user: str = AGENT_USER) -> None:
    """The agent's textfile, ready for node_exporter's link: its directory root's, a tmpfs
    of at most METRICS_FS_BYTES mounted there (by systemd), the file in it the agent
    user's (0644), which the agent writes in place. GrantError where that cannot hold:
    then no link is made."""
    directory, name = os.path.split(path)
    parent_path, dir_name = os.path.split(directory)
    try:
        owner = pwd.getpwnam(user)
    except KeyError:
        raise GrantError(f"no user {user} to write the metrics") from None
    parent = _open_root_dir(parent_path)
    try:
        fd = os.open(dir_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent)
        try:
            _check_root_dir(fd, directory)
            fs = os.fstatvfs(fd)
            if os.fstat(fd).st_dev == os.fstat(parent).st_dev or \
                    fs.f_blocks * fs.f_frsize > METRICS_FS_BYTES:
                raise GrantError(f"{directory}: not a mount of at most {METRICS_FS_BYTES} bytes "
                                 "(run-edge\\x2dagent\\x2dmetrics.mount)")
            _make_agent_file(fd, name, owner.pw_uid, owner.pw_gid)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def _make_agent_file(fd: int, name: str, uid: int, gid: int) -> None:
    """The file, the agent's, regular, 0644, one link: kept where it is so, else made anew."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_uid == uid and st.st_nlink == 1:
        return
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644, dir_fd=fd)
    try:
        os.fchown(f, uid, gid)
        os.fchmod(f, 0o644)  # the unit's UMask=0077 would hide it from node_exporter's user
    finally:
        os.close(f)


def sync_metrics_link(target: str | None, directory: str = NODE_EXPORTER_DIR) -> str | None:
    """The link in node_exporter's directory to ``target`` (None: no link); what changed
    ("+metrics", "-metrics") or None. Through a descriptor of the directory, never
    following a link there; a file of that name that is not our link is left alone."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None    # no node_exporter here (or not a directory): nothing to point
    try:
        try:
            current = os.readlink(METRICS_LINK, dir_fd=fd)
        except FileNotFoundError:
            current = None
        except OSError:
            return None    # a file, not a link: someone else's
        if target is not None and current != target:
            if current is not None:
                os.unlink(METRICS_LINK, dir_fd=fd)
            os.symlink(target, METRICS_LINK, dir_fd=fd)
            return "+metrics"
        if target is None and current is not None and current.endswith("/" + METRICS_LINK):
            os.unlink(METRICS_LINK, dir_fd=fd)
            return "-metrics"
        return None
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m agent.programs.grants",
        description="Bring polkit's grants for edge-agent in step with [commands] allow.")
    parser.add_argument("--config", default=config_mod.DEFAULT_PATH)
    parser.add_argument("--revoke", action="store_true", help="remove every grant")
    parser.add_argument("--dir", default=GRANTS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--node-exporter-dir", default=NODE_EXPORTER_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--user", default=AGENT_USER, help=argparse.SUPPRESS)
    parser.add_argument("--watchdog-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--networkd-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ifstate", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    grants: frozenset = frozenset()
    player = metrics = None
    network = None
    source = args.config
    watchdog: int | None | bool = False   # False: left as it is (a stop, a bad file)
    if not args.revoke:
        try:
            config = config_mod.load(args.config)
        except config_mod.ConfigError:
            pass  # nothing is granted; the agent's own start says what is wrong, once
        else:
            # the operator's layers alone: the fleet may not set it (schema.py)
            watchdog = config.device.watchdog_s
            grants = wanted(config.commands.allow)
            player = player_unit(config.screen, config.commands.allow)
            if network_heal(config.device):
                network = network_manager(args.networkd_dir, args.ifstate)
                if network is None:
                    early("edge-agent: grants: [device] heal_network is on, but no network "
                          "manager (systemd-networkd, NetworkManager, ifupdown) manages this "
                          "device's network: the healer may bounce nothing, restart nothing",
                          4, sys.stdout)
            metrics = config.metrics_path if config.metrics.enabled else None
            if metrics is not None and metrics != metrics_home(config.runtime.dir):
                # the operator's own path: never a tmpfs mounted over a directory of theirs
                early(f"edge-agent: grants: [metrics] textfile {metrics} is not "
                      f"{metrics_home(config.runtime.dir)}: no link for node_exporter", 6,
                      sys.stdout)
                metrics = None
            if config.origins.get("commands.allow") == "fleet":
                source = (f"the fleet's settings revision {config.fleet_revision} (which "
                          f"{args.config} lets it manage)")
    if metrics is not None and os.path.isdir(args.node_exporter_dir):
        try:
            prepare_metrics_file(metrics, args.user)
        except (GrantError, OSError) as e:
            # no link to a file the agent could turn into something node_exporter hangs on
            early(f"edge-agent: grants: no link for node_exporter to {metrics}: "
                  f"{getattr(e, 'strerror', None) or e}", 4, sys.stdout)
            metrics = None
    try:
        if sync_metrics_link(metrics, args.node_exporter_dir) == "+metrics":
            early(f"edge-agent: node_exporter reads the metrics at {metrics}", 6, sys.stdout)
    except OSError as e:
        early(f"edge-agent: grants: node_exporter's link: {e.strerror}", 4, sys.stdout)
    if watchdog is not False:
        _system_watchdog(watchdog, args.config, args.watchdog_dir)
    try:
        changed = sync(flags(grants, player, source, args.config, network), args.dir, source)
    except (GrantError, OSError) as e:
        # fails closed and does not fail the unit: the agent runs without the grant and
        # a reboot command is refused by polkit, reported to the server as such
        early(f"edge-agent: grants: {e}", 3, sys.stdout)
        return 0
    given = [c[1:] for c in changed if c.startswith("+")]
    if NETWORK in given:
        given[given.index(NETWORK)] = (f"the network's bounce through {network[0]} and its "
                                       "restart" + (f" ({', '.join(network[1])})"
                                                    if network[1] else ""))
    if PLAYER in given:
        given[given.index(PLAYER)] = f"a restart of {player}"
        early(f"edge-agent: polkit grants this service {', '.join(given)}: as {args.config} "
              "configures it", 6, sys.stdout)
    elif given:
        early(f"edge-agent: polkit grants this service {', '.join(given)}: [commands] allow "
              f"in {source} lists it", 6, sys.stdout)
    return 0


def _system_watchdog(seconds: int | None, config: str, directory: str | None) -> None:
    """The system's watchdog as [device] asks (system_watchdog.py); said, never fatal."""
    from . import system_watchdog   # it takes this module's directory checks
    directory = directory or system_watchdog.DROPIN_DIR
    where = os.path.join(directory, system_watchdog.DROPIN_NAME)
    try:
        changed = system_watchdog.sync(seconds, config, directory)
    # run as __main__, this module's GrantError is not the one system_watchdog imports
    except (GrantError, system_watchdog.GrantError, OSError) as e:
        why = f"{directory}: {e.strerror or e}" if isinstance(e, OSError) else e
        early(f"edge-agent: the system's watchdog: {why} (never through a link): left as it "
              "was", 3, sys.stdout)
        return
    if changed is None:
        return
    what, _, why = changed.partition("; ")
    said = (f"systemd's RuntimeWatchdogSec={seconds}s in {where}" if what.startswith("+")
            else f"off: {where} removed")
    if why:
        early(f"edge-agent: the system's watchdog: {said}; systemd not told ({why}): it "
              "applies at the next boot", 4, sys.stdout)
    else:
        early(f"edge-agent: the system's watchdog: {said}, systemd reloaded", 6, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
