"""What ScreenTinker keeps of the screen's own events: 1.9's incident feed.

1.9 stores a ``device:event`` {type, reason, detail} in its ``device_events`` table (the
dashboard's incident feed), for the types in server/lib/incident-classify.js
(``display_off``, ``display_on``, ``crash``, ``app_error``, ...), the reason cut to 64
characters and the detail to 500; it ACKs nothing, and 1.2 has no such event (it drops
it unread). So the agent's events that mean an incident there go as one ``device:event``
each, once; the rest have no place on that server and are not sent.

The display's state goes only when it was read back: a display that did not reach the
state asked for is an ``app_error``, never a ``display_on`` it did not show. A display
the watch found dark without anyone asking (``display.changed`` off or disconnected, not
meant dark) is a ``display_off``.
"""
from __future__ import annotations

REASON_CHARS = 64      # what 1.9 keeps of a reason
DETAIL_CHARS = 500     # ... and of a detail


def incident(event: dict) -> dict | None:
    """The ``device:event`` payload (without device_id) that tells ``event`` (an
    Event.payload()) to 1.9's incident feed, or None where that feed has no place for it."""
    kind = event.get("type")
    if kind in ("display.scheduled", "display.read_back"):
        state = event.get("state")
        if state not in ("on", "off"):
            return None
        by = "working hours" if kind == "display.scheduled" else "a display command"
        if event.get("confirmed") is True:
            sources = event.get("confirmed_by")
            said = ", ".join(map(str, sources)) if isinstance(sources, list) else "a source"
            return _one(f"display_{state}", f"{by}",
                        f"display {state}, confirmed by {said} (edge-agent)")
        return _one("app_error", "display unconfirmed",
                    f"display {state} asked by {by}, not confirmed: {event.get('why', '?')}")
    if kind == "display.changed" and event.get("state") in ("off", "disconnected") \
            and not event.get("meant_dark"):
        # dark and nobody asked for it: a TV switched off by hand, a cable pulled. The
        # agent's own offs (hours, commands) are told by their read-back above, and an
        # on is told there too: the feed gets each once
        return _one("display_off", f"display {event['state']}, not by the agent",
                    f"display {event['state']} (was {event.get('was', '?')}): "
                    f"{event.get('read', '?')} (edge-agent)")
    if kind == "display.fault":
        return _one("app_error", "display fault",
                    f"display {event.get('wanted', '?')}: {event.get('error', '?')}")
    if kind in ("screen.black", "screen.frozen"):
        return _one("app_error", kind.replace(".", " "), _details(event))
    if kind == "player.crashed":
        return _one("crash", "player crashed", _details(event))
    return None


def _one(kind: str, reason: str, detail: str) -> dict:
    return {"type": kind, "reason": reason[:REASON_CHARS], "detail": detail[:DETAIL_CHARS]}


def _details(event: dict) -> str:
    """The event's own fields in words: what the operator reads in the feed."""
    skip = {"type", "ts", "count", "id"}
    return "; ".join(f"{k} {v}" for k, v in event.items() if k not in skip)[:DETAIL_CHARS] \
        or str(event.get("type"))
