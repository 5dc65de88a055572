"""The agent's own journal lines, through a gate: the ``logs`` command without the
systemd-journal group.

Membership of systemd-journal would let the network-facing agent read every service's
journal. Instead, edge-agent-logs.socket (mode 0600, the edge-agent user's) starts
edge-agent-logs@.service for each connection: a sandboxed process with no network and
a dynamic user in systemd-journal, which reads one request line, checks it, and
answers with ``journalctl -u edge-agent.service -o json`` for that window and nothing
else. The exchange, both ends of it, is base/journal_wire.py's.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from collections import deque

from ..base import children
from ..base import journal_wire as wire
from ..base.logs import early
from ..runtime.threads import Timers


def serve(rfile, wfile, popen=subprocess.Popen) -> int:
    raw = rfile.readline(wire.MAX_REQUEST)
    try:
        request = wire.parse_request(raw)
        body, dropped = _newest(request.argv(), popen)
        wfile.write(wire.reply_ok(body, dropped))
        status = 0
    except wire.GateError as e:
        early(f"edge-agent-logs: refused: {e}", 4)
        wfile.write(wire.reply_error(str(e)))
        status = 1
    wfile.flush()
    return status


def _newest(argv: list[str], popen) -> tuple[bytes, int]:
    """journalctl's lines, the newest that fit in wire.MAX_BODY_BYTES, as it writes them;
    and how many older ones did not fit."""
    try:
        proc = popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    except OSError as e:
        raise wire.GateError(children.failure(argv, error=e)) from None
    expired = threading.Event()

    def expire():
        expired.set()
        proc.kill()

    kept: deque[bytes] = deque()
    size = dropped = 0
    # stopped (the alarm cancelled, its thread ended) however the reading ends
    with Timers("journalctl-timeout") as timers:
        timers.after(wire.JOURNALCTL_TIMEOUT_S, expire, name="journalctl")
        for line in wire.read_lines(proc.stdout):
            kept.append(line)
            size += len(line)
            while size > wire.MAX_BODY_BYTES:
                size -= len(kept.popleft())
                dropped += 1
        err = proc.stderr.read(wire.MAX_HEADER * 4)
        proc.wait()
    if expired.is_set():
        raise wire.GateError(children.failure(argv, timeout_s=wire.JOURNALCTL_TIMEOUT_S))
    if proc.returncode != 0:
        raise wire.GateError(children.failure(argv, exited=proc.returncode, stderr=err))
    return b"".join(kept), dropped


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout.buffer))
