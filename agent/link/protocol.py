"""The edge-agent wire contract (docs/PROTOCOL.md), as payload builders and parsers.

Parsers take whatever a server sent and return a clean value or None; they never
raise, because a malformed server message must cost a log line, not the agent.
"""
from __future__ import annotations

import math

PROTOCOL_VERSION = 2  # 2: server:command / device:command-result

HEARTBEAT = "device:heartbeat"
EVENT = "device:event"
REPORT = "device:report"
THROTTLE = "server:throttle"
RECONNECT_WINDOW = "server:reconnect-window"
DRAIN = "server:drain"
COMMAND = "server:command"
COMMAND_RESULT = "device:command-result"

# the requests a server makes that a part serves (link/port.py), by the name the
# profiles post them under, whichever event the server said them with
REQUEST_COMMAND = "command"

# Anything bigger than this is not a payload we asked for.
MAX_FIELD_REPR = 200


def connect_auth(device_id: str, token: str, agent_version: str) -> dict:
    return {"device_id": device_id, "token": token,
            "agent_version": agent_version, "protocol": PROTOCOL_VERSION}


def heartbeat(seq: int, wall: float, uptime_s: float) -> dict:
    return {"seq": seq, "ts": round(wall, 3), "uptime_s": round(uptime_s, 1)}


def report(device_id: str, connections: list[dict], wall: float) -> dict:
    return {"device_id": device_id, "ts": round(wall, 3), "connections": connections}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def parse_heartbeat_ack(args: tuple, expected_seq: int) -> tuple[bool, str]:
    """(True, "") if ``args`` is the server's ACK of ``expected_seq``, else (False, why)."""
    if len(args) != 1 or not isinstance(args[0], dict):
        return False, f"ack is not one object: {_short(args)}"
    body = args[0]
    seq = body.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        return False, f"ack without an integer seq: {_short(body)}"
    if seq != expected_seq:
        return False, f"ack for seq {seq}, expected {expected_seq}"
    return True, ""


def parse_throttle(args: tuple) -> float | None:
    """retry_after_s from a server:throttle message, or None if malformed."""
    if len(args) != 1 or not isinstance(args[0], dict):
        return None
    return _number(args[0].get("retry_after_s"))


def refused_for_now(refusal) -> float | None:
    """retry_after_s of a connect refusal that is for now, not for the credentials
    (python-socketio's ``ConnectionRefusedError(message, {"retry_after_s": N})`` sends
    ``{"message", "data": {"retry_after_s"}}``), or None: a refusal of the credentials.
    A refusal that names retry_after_s is for now whatever its value: one that is no
    number >= 0 (a buggy server's "30") is 0, the least hold, not an unpairing."""
    if not isinstance(refusal, dict):
        return None
    data = refusal.get("data")
    if not isinstance(data, dict) or "retry_after_s" not in data:
        return None
    later = _number(data["retry_after_s"])
    return later if later is not None and later >= 0 else 0.0


def parse_reconnect_window(args: tuple) -> float | None:
    """window_s from a server:reconnect-window message, or None if malformed."""
    if len(args) != 1 or not isinstance(args[0], dict):
        return None
    window = _number(args[0].get("window_s"))
    return window if window is not None and window >= 0 else None


def parse_drain(args: tuple) -> float | None:
    """window_s from a server:drain message, or None if malformed."""
    return parse_reconnect_window(args)


def parse_ok(args: tuple) -> bool:
    return len(args) == 1 and isinstance(args[0], dict) and args[0].get("ok") is True


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= MAX_FIELD_REPR else text[:MAX_FIELD_REPR] + "..."
