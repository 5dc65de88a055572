"""One request of the identity's to the server, bounded in time and in bytes: the
enroller's (enroller.py) and the kind probe's (kind_probe.py), each on a loop of its own
whose silence on the watchdog gate these bounds make. Apart from the enroller, so that a
screen with nothing to enroll (a token in its configuration, or a server that pairs in
the link) loads no enrollment at its start."""
from __future__ import annotations

from ..base.http import read_capped
from ..runtime.deadline import deadline

MAX_ANSWER_BYTES = 16 * 1024
TIMEOUT = (5.0, 15.0)
# The longest such a loop sleeps while it has work; with two request timeouts this is
# what the watchdog gate allows it between ticks.
MAX_WAIT_S = 30.0
MAX_SILENCE_S = MAX_WAIT_S + 2 * sum(TIMEOUT) + 10.0


def exchange(session, method: str, url: str, **kw) -> tuple[int, bytes]:
    """One request to the server, bounded from its first byte to its last (a trickled
    answer ends with it) and in bytes (MAX_ANSWER_BYTES + 1 at most are read); no
    redirect is followed. (status, the body as sent)."""
    with deadline(sum(TIMEOUT)):
        r = session.request(method, url, timeout=TIMEOUT, allow_redirects=False,
                            stream=True, **kw)
        try:
            return r.status_code, read_capped(r, MAX_ANSWER_BYTES)
        finally:
            r.close()
