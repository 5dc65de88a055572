"""The bench's startup and footprint rows (devtools/bench/startup.py, footprint.py): what
they time is what `edge-agent run` imports, and each ratio is printed with its target
from issue #38. Fast: no process is timed here."""
from __future__ import annotations

import ast
import importlib.util

from devtools.bench import footprint as FP, startup as SU
from devtools.harness import REPO


def test_the_import_row_times_what_edge_agent_run_imports():
    modules = SU.agent_imports()
    assert modules[0] == "agent.cli"
    for name in modules:
        assert importlib.util.find_spec(name) is not None, name
    # every module cmd_run imports from the package is timed
    tree = ast.parse((REPO / "agent" / "cli.py").read_text())
    run = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "cmd_run")
    lazy = {"agent." + n.module for n in ast.walk(run) if isinstance(n, ast.ImportFrom) and n.level == 1}
    timed = {m if m in lazy else m.rsplit(".", 1)[0] for m in modules}
    assert lazy and lazy <= timed, (lazy, modules)
    assert "agent.app.daemon" in modules and "agent.runtime.crashes" in modules, modules


def test_the_bare_client_and_the_timed_imports_are_python():
    compile(SU.BARE_CLIENT, "bare", "exec")
    compile(SU._import_code(SU.agent_imports()), "agent", "exec")
    compile(SU._import_code(SU.BARE_IMPORTS, SU.BARE_TOUCH), "bare", "exec")


def test_the_startup_row_prints_each_ratio_against_its_target():
    s = SU.Startup(3, SU.agent_imports(), heaviest=[["agent.link", 31.4]],
                   medians={"agent_import_ms": 372.0, "bare_import_ms": 240.0,
                            "agent_process_ms": 470.0, "bare_process_ms": 320.0,
                            "agent_link_ms": 300.0, "bare_link_ms": 256.0,
                            "agent_server_ms": 298.0, "bare_server_ms": 255.0},
                   ratios={"import_ms": 1.55, "process_ms": 1.47, "link_ms": 1.17, "server_ms": 1.17})
    text = "\n".join(SU.section(s))
    assert "| spawn to proven link | 300.0 | 256.0 | 1.17x |" in text
    assert "Import 1.55x (target <= 1.3x: NOT met)" in text
    assert "spawn to a proven link 1.17x (target <= 1.3x: met)" in text
    assert "agent.link 31.4 ms" in text


def test_a_startup_row_with_no_figures_says_so_instead_of_breaking():
    s = SU.Startup(3, SU.agent_imports(), errors=["agent #1: timed out"],
                   medians={}, ratios={"import_ms": None, "link_ms": None})
    text = "\n".join(SU.section(s))
    assert "spawn to a proven link -" in text and "- agent #1: timed out" in text


def test_the_footprint_row_prints_the_issue_targets():
    fps = [FP.Footprint("edge-agent", 300.0, rss_mb=50.6, cpu_s=0.06, wakeups_per_min=36.3,
                        heartbeats=20),
           FP.Footprint("bare", 300.0, rss_mb=41.5, cpu_s=0.05, wakeups_per_min=32.7,
                        heartbeats=20)]
    text = "\n".join(FP.section(fps))
    assert "RSS 1.22x (target <= 1.15x: NOT met)" in text
    assert "wake-ups 1.11x (target <= 1.06x: NOT met)" in text
    fps[0].rss_mb, fps[0].wakeups_per_min = 47.7, 34.3
    text = "\n".join(FP.section(fps))
    assert "RSS 1.15x (target <= 1.15x: met)" in text
    assert "wake-ups 1.05x (target <= 1.06x: met)" in text
    assert "device's reads" not in text


def test_the_footprint_says_the_device_reads_cost_beside_the_same_agent_without():
    fps = [FP.Footprint("edge-agent", 300.0, rss_mb=47.7, cpu_s=0.05, wakeups_per_min=34.3),
           FP.Footprint("edge-agent, device off", 300.0, rss_mb=47.5, cpu_s=0.048,
                        wakeups_per_min=34.3),
           FP.Footprint("bare", 300.0, rss_mb=41.4, cpu_s=0.036, wakeups_per_min=32.7)]
    text = "\n".join(FP.section(fps))
    assert "| edge-agent, device off | 47.5 | 0.048 |" in text
    assert "without them: CPU 1.04x, wake-ups 1.00x; 0 bytes written" in text


def test_the_footprint_says_the_network_healers_cost_on_a_live_link():
    fps = [FP.Footprint("edge-agent", 300.0, rss_mb=47.7, cpu_s=0.05, wakeups_per_min=34.3),
           FP.Footprint("edge-agent, healer on", 300.0, rss_mb=47.9, cpu_s=0.051,
                        wakeups_per_min=34.3),
           FP.Footprint("bare", 300.0, rss_mb=41.4, cpu_s=0.036, wakeups_per_min=32.7)]
    text = "\n".join(FP.section(fps))
    assert "| edge-agent, healer on | 47.9 | 0.051 |" in text
    assert "against the shipped agent CPU 1.02x, wake-ups 1.00x; 0 bytes written" in text


def test_the_design_cards_client_is_the_bare_one_with_the_cards_packages_and_nothing_else():
    compile(SU.CARD_CLIENT, "card", "exec")
    assert "import socketio, requests, sdnotify, psutil, pyudev\n" in SU.CARD_CLIENT
    assert SU.CARD_CLIENT.replace("import socketio, requests, sdnotify, psutil, pyudev\n",
                                  "import socketio\n") == SU.BARE_CLIENT
    compile(SU._import_code(SU.CARD_IMPORTS, SU.BARE_TOUCH), "card", "exec")
    for name in SU.CARD_IMPORTS:
        assert importlib.util.find_spec(name) is not None, name


def test_the_startup_row_prints_the_design_cards_ratios_against_issue_51s_target():
    s = SU.Startup(3, SU.agent_imports(), agent_import_ms=[300.0] * 5,
                   card_import_ms=[250.0] * 5, card_server_ms=[200.0] * 7,
                   card={"agent_import_best_ms": 300.0, "card_import_best_ms": 250.0,
                         "agent_server_ms": 320.0, "card_server_ms": 200.0,
                         "import": 1.2, "server": 1.6},
                   medians={}, ratios={})
    text = "\n".join(SU.section(s))
    assert "| import statement, best of 5 | 300.0 | 250.0 | 1.20x |" in text
    assert "| exec to the first heartbeat at the server, median of 7 | 320.0 | 200.0 | 1.60x |" in text
    assert "Import 1.20x (target <= 1.3x: met); exec to the first heartbeat at the server " \
           "1.60x (target <= 1.3x: NOT met)." in text


def test_the_footprint_row_says_the_agent_against_the_design_cards_client():
    fps = [FP.Footprint("edge-agent", 60.0, rss_mb=47.7, cpu_s=0.05, wakeups_per_min=34.3),
           FP.Footprint("bare", 60.0, rss_mb=38.0, cpu_s=0.04, wakeups_per_min=32.7),
           FP.Footprint(FP.CARD, 60.0, rss_mb=45.0, cpu_s=0.04, wakeups_per_min=33.0)]
    text = "\n".join(FP.section(fps))
    assert f"| {FP.CARD} | 45.0 |" in text
    assert "Against the design card's bare client" in text
    assert "RSS 1.06x (target <= 1.15x: met); wake-ups 1.04x (target <= 1.06x: met)." in text
