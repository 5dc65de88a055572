"""Every thread and timer of the agent is started in agent/runtime/: a Loop (supervised,
on the watchdog gate), an alarm of a Timers, or a worker started with its stated reason
(runtime/threads.py). A thread made anywhere else is one nobody restarts, watches or
stops, so this reads every module of agent/ and fails on one.

What counts: ``threading.Thread`` and ``threading.Timer`` named at all (called, passed,
subclassed, imported by name), a class whose bases are one of those or such a class
(across modules), ``_thread.start_new_thread``, and the pools that start threads for
you (``concurrent.futures.ThreadPoolExecutor``, ``multiprocessing.pool.ThreadPool``).
``threading.Event``, ``Lock`` and the rest are not threads. A name reached by getattr
or importlib is beyond an ast: review is."""
from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STARTS_THREADS = {"threading.Thread", "threading.Timer", "_thread.start_new_thread",
                  "_thread.start_new", "concurrent.futures.ThreadPoolExecutor",
                  "concurrent.futures.thread.ThreadPoolExecutor",
                  "multiprocessing.pool.ThreadPool"}
THREAD_CLASSES = {"threading.Thread", "threading.Timer"}
STAR_SOURCES = {"threading", "_thread", "concurrent.futures", "multiprocessing.pool"}

# Files that still start raw threads, each until its owner moves them to runtime/ (file:
# who moves it). link/transport.py (moved by the link split) and app/daemon.py (moved by
# the daemon's owner) were the last; nothing may join the list.
ALLOWED: dict[str, str] = {}


@dataclass(frozen=True)
class Finding:
    path: str    # relative to agent/
    line: int
    what: str

    def __str__(self) -> str:
        return f"agent/{self.path}:{self.line}: {self.what}"


def _modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py of the ``agent`` package under ``root``."""
    found = {}
    for path in sorted((root / "agent").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


class _Module:
    def __init__(self, name: str, path: Path, root: Path):
        self.name, self.path = name, path
        self.rel = path.relative_to(root / "agent").as_posix()
        self.tree = ast.parse(path.read_text(), str(path))
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.names: dict[str, str] = {}      # local name -> what it is, dotted
        self.imports: list[tuple[ast.AST, str]] = []   # (node, dotted name imported)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.names[a.asname] = a.name
                    else:
                        top = a.name.partition(".")[0]
                        self.names[top] = top
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = self.package.split(".")[: self.package.count(".") + 2 - node.level]
                    source = ".".join(base + ([node.module] if node.module else []))
                for a in node.names:
                    self.imports.append((node, f"{source}.{a.name}"))
                    if a.name != "*":
                        self.names[a.asname or a.name] = f"{source}.{a.name}"
        self.classes = {n.name: n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}

    @property
    def in_runtime(self) -> bool:
        return self.rel.startswith("runtime/")

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, when it is a name or attributes."""
        if isinstance(node, ast.Name):
            if node.id in self.names:
                return self.names[node.id]
            return f"{self.name}.{node.id}" if node.id in self.classes else None
        if isinstance(node, ast.Attribute):
            inner = self.resolve(node.value)
            return None if inner is None else f"{inner}.{node.attr}"
        return None


def scan(root: Path = ROOT) -> list[Finding]:
    """Every thread or timer made outside agent/runtime/ in ``root``/agent."""
    modules = [_Module(name, path, root) for name, path in _modules(root).items()]
    # the classes that are threads, in any module, to a fixed point: a subclass of a
    # subclass of threading.Thread is as much a thread
    thread_classes = set(THREAD_CLASSES)
    grew = True
    while grew:
        grew = False
        for m in modules:
            for cname, cls in m.classes.items():
                dotted = f"{m.name}.{cname}"
                if dotted not in thread_classes and \
                        any(m.resolve(b) in thread_classes for b in cls.bases):
                    thread_classes.add(dotted)
                    grew = True
    # a class of runtime's is its own to start (WatchdogPetter); one made elsewhere is not
    outside = {c for c in thread_classes - THREAD_CLASSES
               if not c.startswith("agent.runtime.")}
    findings = []
    for m in modules:
        if m.in_runtime:
            continue
        for node, dotted in m.imports:
            if dotted in STARTS_THREADS or dotted in outside:
                findings.append(Finding(m.rel, node.lineno, f"imports {dotted}"))
            elif dotted.endswith(".*") and dotted[:-2] in STAR_SOURCES:
                findings.append(Finding(m.rel, node.lineno, f"imports {dotted}"))
        for cname, cls in m.classes.items():
            if f"{m.name}.{cname}" in thread_classes:
                findings.append(Finding(m.rel, cls.lineno, f"class {cname} is a thread"))
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                dotted = m.resolve(node)
                # a bare name of a thread class of the agent's is its own module's (the
                # class is the finding) or imported (the import is)
                if dotted in STARTS_THREADS or (dotted in outside
                                                and isinstance(node, ast.Attribute)):
                    findings.append(Finding(m.rel, node.lineno, f"uses {dotted}"))
    return sorted(set(findings), key=lambda f: (f.path, f.line, f.what))


def unallowed(root: Path = ROOT) -> dict[str, list[str]]:
    """The files with a raw thread that the allowance does not name, and where."""
    found: dict[str, list[str]] = {}
    for f in scan(root):
        if f.path not in ALLOWED:
            found.setdefault(f.path, []).append(str(f))
    return found


# -- the agent as it is --------------------------------------------------------------
def test_no_thread_or_timer_is_started_outside_runtime():
    bad = unallowed()
    assert not bad, ("threads or timers started outside agent/runtime/ (use a Loop, "
                     "Timers or start_worker of agent/runtime/threads.py):\n"
                     + "\n".join(line for lines in bad.values() for line in lines))


def test_each_allowance_is_still_needed():
    """Once its owner has moved its threads to runtime/, a file leaves the list."""
    still = {f.path for f in scan()}
    stale = sorted(set(ALLOWED) - still)
    assert not stale, f"no raw thread left in {stale}: take them out of ALLOWED"


# -- the scanner can fail --------------------------------------------------------------
def _agent(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"__init__.py": "", "runtime/__init__.py": "", **files}.items():
        path = tmp_path / "agent" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for parent in path.relative_to(tmp_path / "agent").parents:
            (tmp_path / "agent" / parent / "__init__.py").touch()
    return tmp_path


def test_the_scanner_sees_every_way_to_start_a_thread(tmp_path):
    root = _agent(tmp_path, {
        "runtime/mine.py": "import threading\nclass Own(threading.Thread): pass\n"
                           "threading.Timer(1, print).start()\n",
        "a/plain.py": "import threading\nthreading.Thread(target=print).start()\n",
        "a/timer.py": "import threading as th\nt = th.Timer(5, print)\n",
        "a/byname.py": "from threading import Thread\n",
        "a/low.py": "import _thread\n_thread.start_new_thread(print, ())\n",
        "a/pool.py": "from concurrent.futures import ThreadPoolExecutor\n",
        "a/pool2.py": "import concurrent.futures\nconcurrent.futures.ThreadPoolExecutor(2)\n",
        "a/star.py": "from threading import *\n",
        "a/sub.py": "import threading\nclass Reader(threading.Thread):\n    pass\n",
        "a/subsub.py": "from .sub import Reader\nclass Slower(Reader):\n    pass\n",
        "a/factory.py": "import threading\ndef make(factory=threading.Thread):\n    return factory\n",
        "a/petter.py": "from ..runtime.mine import Own\nOwn()\nclass Mine(Own): pass\n",
        "a/fine.py": "import threading\nfrom threading import Event, Lock\n"
                     "e, l = threading.Event(), threading.RLock()\nthreading.current_thread()\n",
    })
    found = {}
    for f in scan(root):
        found.setdefault(f.path, []).append(f.what)
    assert set(found) == {"a/plain.py", "a/timer.py", "a/byname.py", "a/low.py", "a/pool.py",
                          "a/pool2.py", "a/star.py", "a/sub.py", "a/subsub.py",
                          "a/factory.py", "a/petter.py"}, found
    assert found["a/subsub.py"] == ["imports agent.a.sub.Reader", "class Slower is a thread"]
    assert found["a/petter.py"] == ["class Mine is a thread"], \
        "runtime's own thread classes are runtime's to start; a subclass elsewhere is not"
    assert found["a/timer.py"] == ["uses threading.Timer"]


def test_a_thread_planted_in_a_copy_of_the_agent_fails_the_check(tmp_path):
    shutil.copytree(ROOT / "agent", tmp_path / "agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert unallowed(tmp_path) == {}
    hours = tmp_path / "agent" / "hours" / "service.py"
    hours.write_text(hours.read_text() + "\n\ndef _later():\n"
                     "    threading.Timer(1.0, print).start()\n")
    assert list(unallowed(tmp_path)) == ["hours/service.py"]
