"""The fault matrix as a picture: per fault and client, when the fault began and
ended, when the client noticed, and when its heartbeats reached the server again."""
from __future__ import annotations

from pathlib import Path


def draw(silent: list, faults: list, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = []  # (label, fault_len, noticed, back), seconds from the fault's start
    for kind in silent:
        t = next((t for t in kind.trials if t.recovery_s is not None), None)
        if t is not None:
            rows.append((f"silent drop: {kind.name}", 0.0, None, t.recovery_s))
    for r in faults:
        if r.trial != 0:
            continue
        length = max(0.0, r.t_end - r.t_fault)
        back = (length + r.recovery_s) if r.recovery_s is not None else None
        rows.append((f"{r.fault}: {r.client}", length, r.noticed_s, back))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    for y, (label, length, noticed, back) in enumerate(reversed(rows)):
        colour = "tab:green" if "edge-agent" in label else "tab:grey"
        if length:
            ax.barh(y, length, left=0, color="tab:red", alpha=0.25, height=0.6)
        if back is not None:
            ax.barh(y, back - length, left=length, color=colour, alpha=0.7, height=0.3)
            ax.plot([back], [y], marker="|", color="black", markersize=12)
        if noticed is not None:
            ax.plot([noticed], [y], marker="x", color="black")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel("seconds from the start of the fault  (red: fault; bar: until heartbeats "
                  "reach the server again; x: client noticed)")
    ax.set_title("edge-agent (green) and the stock python-socketio client (grey)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
