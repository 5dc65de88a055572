"""Real network failure for tests: a private network namespace and nftables rules.

``NetNS`` moves the *calling thread* into a fresh network namespace (unshare on the
thread, then back with setns), so the test, the servers it starts and the agents it
spawns all share a private loopback that nothing else on the machine can see, and
nftables rules there cut real TCP flows without a FIN or an RST.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS_pidfd_getfd = 438  # the same number on x86_64 and aarch64
TCP_USER_TIMEOUT = 18  # linux/tcp.h; spelled out so the test does not trust the agent's constant

TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


class NetNS:
    TABLE = "edgetest"

    def __enter__(self) -> "NetNS":
        self._orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        if _libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            os.close(self._orig)
            raise OSError(err, "unshare(CLONE_NEWNET) failed: " + os.strerror(err))
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        self.nft(f"add table inet {self.TABLE}\n"
                 f"add chain inet {self.TABLE} input {{ type filter hook input priority 0; }}\n")
        return self

    def __exit__(self, *exc) -> None:
        if _libc.setns(self._orig, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns back to the original namespace failed")
        os.close(self._orig)

    @contextlib.contextmanager
    def outside(self):
        """Step back into the original namespace for a while (e.g. to reach apt's mirror)."""
        mine = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            if _libc.setns(self._orig, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns to the original namespace failed")
            yield
        finally:
            if _libc.setns(mine, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back into the test namespace failed")
            os.close(mine)

    # -- faults -------------------------------------------------------------------
    def nft(self, script: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True,
                       capture_output=True)

    def drop_flow(self, local_port: int, server_port: int) -> None:
        """Silently drop one TCP connection in both directions; new ones still pass: its
        local port is kept from every later connect here (a test's own request to the
        server, given the dropped flow's port, was dropped too: CI once)."""
        reserved = "/proc/sys/net/ipv4/ip_local_reserved_ports"   # this namespace's
        with open(reserved) as f:
            ports = f.read().strip()
        with open(reserved, "w") as f:
            f.write(f"{ports},{local_port}" if ports else str(local_port))
        self.nft(f"add rule inet {self.TABLE} input tcp sport {local_port} tcp dport {server_port} drop\n"
                 f"add rule inet {self.TABLE} input tcp sport {server_port} tcp dport {local_port} drop\n")

    def drop_port(self, server_port: int) -> None:
        """Silently drop everything to and from the server: the network is gone."""
        self.nft(f"add rule inet {self.TABLE} input tcp dport {server_port} drop\n"
                 f"add rule inet {self.TABLE} input tcp sport {server_port} drop\n")

    def restore(self) -> None:
        self.nft(f"flush chain inet {self.TABLE} input\n")


# -- looking into another process's sockets ----------------------------------------
def _socket_inodes(pid: int) -> dict[int, int]:
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(fd)
    return out


def tcp_sockets(pid: int, remote_port: int) -> list[dict]:
    """The process's TCP sockets to ``remote_port``: local port, state, fd."""
    try:
        inodes = _socket_inodes(pid)
    except (FileNotFoundError, ProcessLookupError):
        return []
    found, seen = [], set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, remote, st, inode = parts[1], parts[2], parts[3], int(parts[9])
                    # once per socket: the kernel's table is read in pages, and a
                    # socket that moves in it between two reads is listed twice
                    if (inode in inodes and inode not in seen
                            and int(remote.split(":")[1], 16) == remote_port):
                        seen.add(inode)
                        found.append({"local_port": int(local.split(":")[1], 16),
                                      "state": TCP_STATES.get(st, st), "fd": inodes[inode]})
        except FileNotFoundError:
            continue
    return found


def borrow_socket(pid: int, fd: int) -> socket.socket:
    """A duplicate of another process's socket (pidfd_getfd), to getsockopt on it live."""
    pidfd = os.pidfd_open(pid)
    try:
        new_fd = _libc.syscall(SYS_pidfd_getfd, pidfd, fd, 0)
        if new_fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, "pidfd_getfd: " + os.strerror(err))
    finally:
        os.close(pidfd)
    return socket.socket(fileno=new_fd)
