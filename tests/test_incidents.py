"""ScreenTinker 1.9's incident feed: which of the screen's events it keeps, in its words
and within its bounds (server/lib/incident-classify.js, deviceSocket.js device:event);
the real server's side is in tests/test_screentinker_real.py."""
from agent.link.profiles.screentinker_incidents import DETAIL_CHARS, REASON_CHARS, incident


def test_a_display_read_back_is_display_on_or_off_only_when_confirmed():
    on = incident({"type": "display.read_back", "state": "on", "confirmed": True,
                   "confirmed_by": ["X11 DPMS"], "ts": 1.0, "id": 3, "count": 1})
    assert on == {"type": "display_on", "reason": "a display command",
                  "detail": "display on, confirmed by X11 DPMS (edge-agent)"}
    off = incident({"type": "display.scheduled", "state": "off", "confirmed": False,
                    "why": "no source read off within 10 s"})
    assert off["type"] == "app_error" and "not confirmed: no source read off" in off["detail"]
    assert incident({"type": "display.read_back", "state": "sideways"}) is None


def test_black_frozen_and_a_crashed_player_are_incidents_and_the_rest_has_no_place():
    assert incident({"type": "screen.black", "luma": 2.0, "ts": 5.0})["type"] == "app_error"
    crashed = incident({"type": "player.crashed", "unit": "kiosk.service", "result": "signal"})
    assert crashed == {"type": "crash", "reason": "player crashed",
                       "detail": "unit kiosk.service; result signal"}
    # a display found dark that nobody turned off is one; the agent's own off, or an on, not
    by_hand = incident({"type": "display.changed", "state": "off", "was": "on",
                        "read": "CEC: standby"})
    assert by_hand == {"type": "display_off", "reason": "display off, not by the agent",
                       "detail": "display off (was on): CEC: standby (edge-agent)"}
    assert incident({"type": "display.changed", "state": "disconnected", "was": "on",
                     "read": "DRM: no connector is connected"})["type"] == "display_off"
    assert incident({"type": "display.changed", "state": "off", "was": "on",
                     "meant_dark": "off by working hours"}) is None
    assert incident({"type": "display.changed", "state": "on", "was": "off"}) is None
    # an operator's clean stop of the player is no crash on the dashboard
    assert incident({"type": "player.stopped", "unit": "kiosk.service",
                     "result": "success"}) is None
    for kind in ("network.up", "display.connected", "power.undervoltage", "screen.ok"):
        assert incident({"type": kind}) is None


def test_what_the_server_would_cut_is_cut_here():
    long = incident({"type": "display.fault", "wanted": "on", "error": "x" * 5000})
    assert len(long["detail"]) == DETAIL_CHARS and len(long["reason"]) <= REASON_CHARS
