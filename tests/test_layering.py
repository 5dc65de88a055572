"""The layering written down in docs/LAYERS.md, kept: no import runs up a floor, the
sans-I/O cores import no I/O, and the reference server takes from the agent only the
wire contract. The tables come from the doc itself, so the two cannot disagree."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "LAYERS.md"


def _modules(package: str) -> dict[str, Path]:
    """Dotted name -> file, for every .py under one top-level package."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


AGENT, SERVER = _modules("agent"), _modules("fleet_server")
KNOWN = AGENT | SERVER | _modules("devtools")


def _imports(name: str, path: Path) -> list[str]:
    """Every module `name` imports, at the top or inside a function, as absolute dotted
    names; one of this repository's is the module itself, not a name inside it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = package.split(".")[: package.count(".") + 2 - node.level]
                source = ".".join(base + ([node.module] if node.module else []))
            found += [f"{source}.{a.name}" if f"{source}.{a.name}" in KNOWN else source
                      for a in node.names]
    return sorted({_own(target) or target for target in found})


def _own(target: str) -> str | None:
    """The module of this repository that `target` names (agent.__version__ -> agent)."""
    while target and target not in KNOWN:
        target = target.rpartition(".")[0]
    return target or None


def _unit(name: str) -> str:
    """agent.link.core -> link/, agent.cli -> cli, agent -> __init__."""
    first = (name.split(".")[1:] or ["__init__"])[0]
    return f"{first}/" if (ROOT / "agent" / first).is_dir() else first


def _rows() -> dict[str, list[str]]:
    """Each table row of the doc: its first cell -> the `ticked` names of its second."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = line.strip().strip("|").split("|")
        if line.startswith("|") and len(cells) >= 2:
            rows[cells[0].strip()] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def _dotted(path: str) -> str:
    return "agent." + path.removesuffix(".py").replace("/", ".")


ROWS = _rows()


def _wings() -> tuple[dict[str, str], dict[str, set[str]]]:
    """From the wings table: unit -> its wing, and wing -> the wings it may import."""
    wing_of, may = {}, {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"[a-z]+", cells[0]) and "`" in cells[1]:
            for unit in re.findall(r"`([^`]+)`", cells[1]):
                wing_of[unit] = cells[0]
            may[cells[0]] = {"cores" if w.strip().startswith("the cores of") else w.strip()
                             for w in cells[2].split(",")} - {"nothing of the agent"}
    return wing_of, may


WING, MAY = _wings()
CORES = {_dotted(p) for p in ROWS.get("cores", [])}
PURE = CORES | {_dotted(p) for p in ROWS.get("pure helpers", [])}
SPOKEN = PURE | {_dotted(p) for p in ROWS.get("data", [])}
ROOT_SIDE = {_dotted(p) for row, paths in ROWS.items() if row.startswith("root's side of ")
             for p in paths}
NO_IO = ROWS.get("never imported by either", [])
SERVER_TAKES = {_dotted(p) for p in ROWS.get("`fleet_server/`", []) if p.endswith(".py")}
ROOT_PROGRAMS = [name for name in AGENT if name.startswith("agent.programs.")
                 and not name.endswith("__init__") and name != "agent.programs"]
RUNNING_PARTS = ("link", "uploads", "commands", "identity", "events", "hours", "inventory",
                 "screen", "metrics", "device")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_doc_gives_every_unit_of_the_agent_one_wing():
    units = {_unit(name) for name in AGENT}
    assert len(WING) > 10 and len(CORES) > 5 and NO_IO and SERVER_TAKES and ROOT_SIDE, \
        "docs/LAYERS.md: tables not found"
    assert {"base", "runtime", "config", "parts", "app", "programs"} <= set(MAY)
    missing, gone = sorted(units - WING.keys()), sorted(WING.keys() - units)
    assert not missing, f"no wing in docs/LAYERS.md for {missing}"
    assert not gone, f"docs/LAYERS.md places units that are gone: {gone}"
    gone = sorted((SPOKEN | SERVER_TAKES | ROOT_SIDE) - AGENT.keys())
    assert not gone, f"docs/LAYERS.md names modules that are gone: {gone}"


def _crossing(name: str, target: str) -> str | None:
    """Why `name` may not import `target` (both of the agent), or None."""
    here, there = _unit(name), _unit(target)
    mine, theirs = WING[here], WING[there]
    if here == there or (mine == theirs and mine != "parts"):
        return None
    if theirs == "parts":
        if "parts" in MAY[mine] or ("cores" in MAY[mine] and target in SPOKEN):
            return None
        if mine == "programs" and target in ROOT_SIDE:
            return None
        if "cores" in MAY[mine]:
            return f"the {mine} wing reaches a part ({there}) only through its cores, " \
                   f"never its shell"
        return f"the {mine} wing may not import the parts"
    if theirs not in MAY[mine]:
        return f"the {mine} wing may not import the {theirs} wing"
    return None


def test_every_import_stays_within_what_its_wing_may_take():
    bad, seen = [], 0
    for name, path in AGENT.items():
        for target in _imports(name, path):
            top = target.split(".")[0]
            if top in ("fleet_server", "devtools"):
                bad.append(f"{_rel(path)} imports {target}: the agent never imports {top}")
            elif top == "agent":
                seen += 1
                why = _crossing(name, target)
                if why:
                    bad.append(f"{_rel(path)} imports {target}: {why}")
    assert seen > 100, "the scan found almost no imports: it is broken"
    assert not bad, "\n".join(bad)


def test_the_parts_import_each_other_in_no_circle():
    edges: dict[str, set[str]] = {}
    for name, path in AGENT.items():
        if WING[_unit(name)] == "parts":
            edges.setdefault(_unit(name), set()).update(
                _unit(t) for t in _imports(name, path)
                if t.startswith("agent.") and WING[_unit(t)] == "parts" and _unit(t) != _unit(name))

    def reach(start: str, seen: set) -> set:
        for nxt in edges.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen
    circles = sorted(p for p in edges if p in reach(p, set()))
    assert not circles, f"parts that import each other round in a circle: {circles}"


def test_the_root_programs_load_none_of_the_running_parts():
    assert len(ROOT_PROGRAMS) >= 3, ROOT_PROGRAMS
    script = ("import sys, importlib; importlib.import_module(sys.argv[1]); "
              "print(' '.join(m for m in sys.modules if m.startswith('agent.')))")
    for program in ROOT_PROGRAMS:
        loaded = subprocess.run([sys.executable, "-I", "-c", script, program], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.split()
        assert any(m.startswith("agent.programs") for m in loaded), "the probe is broken"
        running = sorted(m for m in loaded if m.split(".")[1] in RUNNING_PARTS)
        assert not running, f"{program} loads {len(running)} modules of the running agent: " \
                            f"{running}"


# what a run of `edge-agent status` may load beyond the interpreter's own start (#51:
# it loaded 305-317 modules, requests, socketio and the link among them, to print a file)
STATUS_MODULES = 100
HTTP_AND_LINK = ("requests", "urllib3", "socketio", "engineio", "websocket", "agent.link")
# what its third of 0.2.2's time rests on (scripts/bench, the status row): no logging, ssl
# or socket, none of the configuration's schema, records or validation (config/files.py)
NOT_FOR_STATUS = ("logging", "ssl", "socket", "dataclasses", "agent.base.logs",
                  "agent.config.load", "agent.config.schema", "agent.config.model")


def test_status_loads_a_hundred_modules_and_neither_http_nor_the_link(tmp_path):
    """`edge-agent status` is run by every operator and monitoring script: it reads a
    file. A fresh interpreter, the command run to its end (no status file: exit 3)."""
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'[server]\nurl = "http://fleet.example:8080"\n'
                   f'[runtime]\ndir = "{tmp_path}"\n')
    script = ("import sys; before = set(sys.modules); from agent import cli\n"
              "try:\n    cli.main(['status', '--config', sys.argv[1]])\n"
              "except SystemExit:\n    pass\n"
              "print(' '.join(sorted(set(sys.modules) - before)))")
    r = subprocess.run([sys.executable, "-c", script, str(cfg)], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    loaded = r.stdout.split()
    assert "agent.app.status" in loaded, "the probe is broken: " + r.stderr
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".")
                                             for h in HTTP_AND_LINK))
    assert not heavy, f"`status` loads {heavy}"
    unneeded = sorted(set(loaded) & set(NOT_FOR_STATUS))
    assert not unneeded, f"`status` loads {unneeded}"
    assert len(loaded) <= STATUS_MODULES, f"`status` loads {len(loaded)} modules: {loaded}"


def test_the_configuration_imports_no_http_library():
    script = ("import sys; import agent.config.load; "
              "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
              "('requests', 'urllib3')))")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert not loaded, loaded


def test_the_sans_io_cores_import_no_io():
    bad = []
    for name in sorted(PURE):
        path = AGENT[name]
        for target in _imports(name, path):
            if target.split(".")[0] == "agent" and target not in PURE:
                bad.append(f"{_rel(path)} imports {target}: a sans-I/O module imports only "
                           f"the cores and pure helpers of docs/LAYERS.md")
            elif any(target == io or target.startswith(io + ".") for io in NO_IO):
                bad.append(f"{_rel(path)} imports {target}: a sans-I/O module does no I/O")
    assert not bad, "\n".join(bad)


def test_the_reference_server_takes_only_the_wire_contract_from_the_agent():
    bad = []
    for name, path in SERVER.items():
        for target in _imports(name, path):
            top = target.split(".")[0]
            if top == "devtools" or (top == "agent" and target not in SERVER_TAKES):
                bad.append(f"{_rel(path)} imports {target}: fleet_server may import from the "
                           f"agent only {sorted(SERVER_TAKES)}, and nothing of devtools")
    for name in SERVER_TAKES:   # else the server would take the agent's insides with it
        bad += [f"{_rel(AGENT[name])} imports {target}: the server imports this module, "
                f"which must import nothing of the agent"
                for target in _imports(name, AGENT[name]) if target.split(".")[0] == "agent"]
    assert not bad, "\n".join(bad)


def test_the_shared_names_are_each_parts_own_table():
    from agent.base import vocabulary
    from agent.commands.core import COMMANDS
    from agent.link.profiles import PROFILES
    from agent.commands.actions import NEEDS
    from agent.screen.controls import LEVELS
    assert tuple(COMMANDS) == vocabulary.COMMAND_NAMES
    assert tuple(PROFILES) == vocabulary.PROFILE_NAMES
    assert tuple(NEEDS) == vocabulary.SCREEN_MEANS
    assert set(LEVELS) < set(vocabulary.SCREEN_CONTROLS)


def test_no_file_over_600_lines_no_class_over_400_and_a_thin_composition_root():
    """What a maintainer can hold in mind at once (#38): a file that grows past these is
    two concerns, and the daemon only builds, wires, starts and stops."""
    too_long = []
    for name, path in AGENT.items():
        source = path.read_text()
        if len(source.splitlines()) > 600:
            too_long.append(f"{_rel(path)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                limit = 250 if (name, node.name) == ("agent.app.daemon", "Agent") else 400
                if lines > limit:
                    too_long.append(f"{_rel(path)}: class {node.name} is {lines} lines "
                                    f"(at most {limit})")
    assert not too_long, "\n".join(too_long)


# A composition root that only composes (#51): the daemon builds the identity, the link,
# then the parts on its port, each after what it needs; it asked 104 lines, 6 lambdas
# standing for objects built later, a two-step bind, and 29 modules of 12 parts.
DAEMON = ROOT / "agent" / "app" / "daemon.py"
INIT_LINES = 60


def _agent_init(path: Path) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(), str(path))
    agent = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Agent")
    return next(n for n in agent.body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")


def _stand_ins(init: ast.FunctionDef) -> list[str]:
    """Each ``lambda`` in ``__init__`` that reads ``self.X`` where X is first assigned by
    a statement that ends at or after the lambda: a stand-in for an object built later;
    and each call of a ``bind``."""
    built: dict[str, int] = {}   # attribute -> the last line of its first assignment
    for node in ast.walk(init):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                            and t.value.id == "self":
                        built[t.attr] = min(built.get(t.attr, node.end_lineno),
                                            node.end_lineno)
    found = []
    for node in ast.walk(init):
        if isinstance(node, ast.Lambda):
            for inner in ast.walk(node.body):
                if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) \
                        and inner.value.id == "self" and built.get(inner.attr, 0) >= node.lineno:
                    found.append(f"line {node.lineno}: a lambda stands for self.{inner.attr}, "
                                 f"built at line {built[inner.attr]}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "bind":
            found.append(f"line {node.lineno}: a two-step bind()")
    return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def _modules_by_part(path: Path) -> dict[str, list[str]]:
    """The modules of each part that the file imports (at the top or in a function)."""
    by_part: dict[str, list[str]] = {}
    for target in _imports("agent.app.daemon", path):
        if target.startswith("agent.") and WING[_unit(target)] == "parts":
            by_part.setdefault(_unit(target), []).append(target)
    return by_part


def test_the_composition_root_only_composes():
    init = _agent_init(DAEMON)
    lines = init.end_lineno - init.lineno + 1
    assert lines <= INIT_LINES, f"Agent.__init__ is {lines} lines (at most {INIT_LINES})"
    stand_ins = _stand_ins(init)
    assert not stand_ins, "\n".join(stand_ins)
    by_part = _modules_by_part(DAEMON)
    assert len(by_part) >= 10, f"the scan found too few parts: {by_part}"   # not broken
    many = {part: modules for part, modules in by_part.items() if len(modules) > 1}
    assert not many, f"the daemon imports more than one module of a part (its part.py " \
                     f"assembles it): {many}"


def test_the_composition_checks_see_a_stand_in_a_bind_and_a_second_module(tmp_path):
    """The checks above, on a root that breaks each rule: they can fail."""
    bad = tmp_path / "daemon.py"
    bad.write_text("from ..link import runner\nfrom ..link.part import Link\n\n\n"
                   "class Agent:\n    def __init__(self):\n"
                   "        self.a = make(lambda: self.b.go(), lambda: self.c)\n"
                   "        self.c = 1\n"
                   "        self.b, self.d = make(), make(lambda: self.c)\n"
                   "        self.a.bind(self.b)\n")
    found = _stand_ins(_agent_init(bad))
    assert [f.split(":")[0] for f in found] == ["line 7", "line 7", "line 10"], found
    assert "self.b" in found[0] + found[1] and "bind" in found[-1]
    assert _modules_by_part(bad) == {"link/": ["agent.link.part", "agent.link.runner"]}


def test_the_link_is_classes_that_read_alone():
    """#51: no mixins in link/ (a class built on another of link's classes, its state
    the other's), its largest class at most 300 lines, the runner's constructor at most
    8 parameters."""
    import ast
    link = ROOT / "agent" / "link"
    ours, sizes, bases = set(), {}, {}
    for path in link.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                ours.add(node.name)
                sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if node.name == "LinkRunner":
                    init = next(f for f in node.body
                                if isinstance(f, ast.FunctionDef) and f.name == "__init__")
                    params = len(init.args.args) - 1 + len(init.args.kwonlyargs)
                    assert params <= 8, f"LinkRunner takes {params} parameters"
    mixins = {name: [b for b in bs if b in ours] for name, bs in bases.items()
              if len([b for b in bs if b in ours]) > 0 and len(bs) > 1}
    assert not mixins, f"link/'s classes made of others: {mixins}"
    largest = max(sizes.items(), key=lambda kv: kv[1])
    assert largest[1] <= 300, f"{largest[0]} is {largest[1]} lines"
