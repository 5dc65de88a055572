"""Text from outside made safe to print: the one sanitizer for what reaches the
journal or a terminal (logs.py's every line, `edge-agent status`, the doctor). Apart from
logs.py so that what only prints (`status`) imports no logging."""
from __future__ import annotations

import re

# Any line, the agent's own included: what a server names (a command id, a device's
# name, a refusal's text) reaches the journal inside the agent's lines, so no line may
# be longer than a journal entry anyone reads whole.
LINE_CHARS = 1000
# Control characters that must not reach journald or a terminal as they are: journald
# starts a new entry at NUL as well as at LF (the next one's "<N>" taken as its
# priority, emergency included), CR rewrites a terminal's line, ESC starts a terminal
# escape (a clipboard write, a title), C1 controls do the same on some terminals.
# Invisible and bidirectional controls too: a server's words must not reorder or hide
# what an operator reads (U+202E turns the rest of a line around).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069"
                      "\ufeff\ufff9-\ufffb]")


def clean(text: str, limit: int = LINE_CHARS) -> str:
    """``text`` as one safe line: every control character escaped (``\\n``, ``\\x1b``),
    cut to ``limit`` characters. The one sanitizer for text from outside on its way to
    the journal or a terminal."""
    text = _CONTROL.sub(_escape, text[:limit + 1])   # escaping only lengthens it
    return text if len(text) <= limit else text[:limit] + "..."


def _escape(match: "re.Match") -> str:
    char = match.group()
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    if named:
        return named
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
