"""The device's lines in `edge-agent status`, from the status file's ``device`` section:
pure, and a file from another build (a section missing or odd) says less, never fails."""
from __future__ import annotations

import time

from ..base.clock import printable_wall


def _gib(n) -> str:
    return f"{n / (1 << 30):.1f} GiB" if isinstance(n, (int, float)) else "?"


def _names(value) -> list[str]:
    """A list of flags' names as the file has it; anything else is none."""
    return [str(x) for x in value] if isinstance(value, list) else []


def lines(device) -> list[str]:
    if not isinstance(device, dict):
        return []
    out = []
    st = device.get("storage")
    if isinstance(st, dict):
        text = f"card        {st.get('verdict')}"
        reasons = st.get("reasons") if isinstance(st.get("reasons"), list) else []
        if reasons:
            text += ": " + "; ".join(map(str, reasons))
        facts = [str(x) for x in (st.get("disk"), (st.get("card") or {}).get("name")
                                  if isinstance(st.get("card"), dict) else None) if x]
        if isinstance(st.get("size_bytes"), int):
            facts.append(_gib(st["size_bytes"]))
        per_day = st.get("written_bytes_per_day")
        if isinstance(per_day, int):
            facts.append(f"{per_day >> 20} MiB written a day"
                         + (f" ({st['card_writes_per_day']:g} of the card)"
                            if isinstance(st.get("card_writes_per_day"), (int, float)) else ""))
        if facts:
            text += f" ({', '.join(facts)})"
        out.append(text)
    pw = device.get("power")
    if isinstance(pw, dict) and pw.get("source"):
        now = ", ".join(_names(pw.get("now"))) or "no flag now"
        since = ", ".join(_names(pw.get("since_boot"))) or "none"
        out.append(f"power       {now}; since boot: {since} (from the {pw.get('source')})")
    dog = device.get("watchdog")
    if isinstance(dog, dict) and isinstance(dog.get("said"), str):
        out.append(f"watchdog    the system's: {dog['said']}")
    boot = device.get("last_boot")
    if isinstance(boot, dict):
        at = boot.get("at")
        when = (time.strftime(" at %Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
                if printable_wall(at) else "")
        out.append(f"last boot   ended with {boot.get('words') or boot.get('cause')}{when}")
    return out


def network_lines(network) -> list[str]:
    """The network's healer (device/heal.py): where its ladder is, from the status
    file's ``network`` section; nothing where it is off."""
    if not isinstance(network, dict) or not network.get("enabled"):
        return []
    text = f"network     healer {network.get('state')}"
    if network.get("cause"):
        text += f": {network.get('cause')}"
    facts = [f"{k} {network[k]}" for k in ("interface", "manager", "gateway")
             if isinstance(network.get(k), str)]
    if isinstance(network.get("carrier"), bool):
        facts.append("carrier" if network["carrier"] else "no carrier")
    if facts:
        text += f" ({', '.join(facts)})"
    if network.get("last"):
        text += f"; last: {network['last']}"
    return [text]
