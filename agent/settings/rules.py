"""A revision on trial, sans I/O: the verdict on settings from the fleet that the link
has not yet proven (agent/settings/service.py runs the trial). What a revision may look
like and when its settings expire is the configuration's (agent/config/revision.py)."""
from __future__ import annotations

MAX_TRIAL_STARTS = 3            # starts on a revision without proof: a crash loop

# how a trial ends, or a setting
KEPT, ROLLED_BACK, EXPIRED = "kept", "rolled-back", "expired"


def rollback_reason(starts: int, now: float, deadline: float) -> str | None:
    """Why a revision still on trial goes back (the agent keeps dying on it, or its
    deadline passed without proof); None: wait. Proof ends a trial before this is asked."""
    if starts > MAX_TRIAL_STARTS:
        return f"the agent restarted {starts - 1} times on it without proving its link"
    if now >= deadline:
        return "the link was not proven live with it in time"
    return None
