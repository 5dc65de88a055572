"""What a journal record carries besides its text: the fields a log pipeline selects by
(``journalctl -u edge-agent REASON=tls-untrusted``), the MESSAGE_IDs of the moments an
operator looks for (explained by systemd/edge-agent.catalog under ``journalctl -x``), and
the native protocol's datagram that carries them to journald.

A log call names its fields with ``extra=journal(REASON=..., CONNECTION=...)``; the
handler (base/logs.py) adds DEVICE_ID and VERSION to every record (SERVER_DEVICE_ID once
a server assigned an id of its own), and HELD_BACK where its rate limit held lines back. Pure: no I/O here.
"""
from __future__ import annotations

import re
import struct

# The fields a call may set, and nothing else: a typo or a name from outside never
# becomes a field of its own, and no call can set journald's (PRIORITY, MESSAGE) or
# forge a trusted one (those start with "_" and journald drops them anyway).
FIELDS = frozenset({
    "DEVICE_ID",    # this screen's own id: one for the whole process (and every process)
    "SERVER_DEVICE_ID",   # the id a server assigned (ScreenTinker's), where it is another
    "VERSION",      # the agent's version
    "REASON",       # why a link ended or an attempt failed (base/reasons.py)
    "CONNECTION",   # the link's connection number, as status and the report count them
    "COMMAND_ID",   # the server's id of a command (its words: sanitised like any)
    "EVENT",        # the kind of an event told to the server (display.off, config.kept)
    "REVISION",     # a fleet settings revision
    "MESSAGE_ID",   # one of the moments below
    "HELD_BACK",    # how many lines of this kind the rate limit held back before this one
    "CAUSE",        # why the last boot ended (device/last_boot.py): clean, power-loss, ...;
                    # the network's device-side cause (device/network.py): no-carrier, ...
})
# A value is one clean line of at most this many characters: fields are for selecting
# and grouping, the record's text says the rest.
FIELD_CHARS = 200


class MessageId:
    """The moments with a stable id, each written once with uuid4 and never changed:
    dashboards and alerts select by them. Each has its entry in the catalog."""
    LINK_LOST = "1fe9c3472ca04036af044b70e4939eda"
    LINK_UP = "3b15e1b8794c4b37893212ac18454661"   # connected: the first proof follows
    RESTARTED_AFTER_KILL = "0b88658e750a45c0a63bddb2fd7850e2"   # the watchdog, the OOM killer
    PAIRING_CODE_SHOWN = "79f8bd5d828b4046afbee0daacf4a9c5"
    PAIRING_CLAIMED = "999d2241c60d4736847a82846b752b61"
    UPDATE_COMMITTED = "4d891bd576d348d59840d77c8b0e080c"
    UPDATE_ROLLED_BACK = "d617aee2494a4926b07ff730e2392d2c"
    SETTINGS_KEPT = "ee5a0d61f9384f419b13d527df0ebf40"
    SETTINGS_ROLLED_BACK = "40795fa9d40741f4add2ac72e02851a2"
    STORAGE_DEGRADED = "31d7487a6da84aa687d9bec39728e6d6"
    CARD_CLONED = "2e222f5ed19f48808925aabcb598c028"   # this card was made from another screen's
    BOOT_ENDED = "39335dc8e20845aca6df3426cb34fb47"   # why the last boot ended, said by the next
    NETWORK_HEALING = "dbb3968824e14943aa2332cf09a7188b"   # a rung of the network's healer


MESSAGE_IDS = {name: value for name, value in vars(MessageId).items()
               if not name.startswith("_")}


def journal(message_id: str | None = None, **fields) -> dict:
    """``extra=`` for a log call: ``log.warning("link lost: %s", why,
    extra=journal(MessageId.LINK_LOST, REASON=reason, CONNECTION=n))``. A field given
    None is left out (a command without an id)."""
    chosen = {k: v for k, v in fields.items() if v is not None}
    if message_id is not None:
        chosen["MESSAGE_ID"] = message_id
    return {"journal": chosen}


# journald's rule for a field name: upper case, digits and "_", not first "_" (those
# are the trusted fields it sets itself), at most 64 characters
_NAME = re.compile(r"[A-Z0-9][A-Z0-9_]{0,63}")


def datagram(fields: list[tuple[str, str]]) -> bytes:
    """The native protocol (systemd's "Native Journal Protocol"): one KEY=VALUE line per
    field; a value with a newline in it (a traceback) as KEY, a newline, its length as a
    little-endian 64-bit number, the bytes and a newline, so it stays one record."""
    out = bytearray()
    for name, value in fields:
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a journal field name: {name!r}")
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)
