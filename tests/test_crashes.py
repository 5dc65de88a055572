"""A dying agent: stacks to stderr (the journal), no core file, whatever core_pattern says."""
import signal
import subprocess
import sys

from devtools.harness import REPO

PROBE = """
import ctypes, os, sys
from agent.runtime import crashes
libc = ctypes.CDLL(None)
print(libc.prctl(3, 0, 0, 0, 0), flush=True)   # PR_GET_DUMPABLE before
crashes.prepare()
print(libc.prctl(3, 0, 0, 0, 0), flush=True)   # ...and after
os.abort()                                     # what the watchdog's SIGABRT does
"""


def test_prepare_makes_the_process_undumpable_and_prints_stacks_on_abort():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       cwd=REPO, timeout=30)
    assert r.stdout.split() == ["1", "0"], r.stdout
    assert r.returncode == -signal.SIGABRT
    assert "Fatal Python error: Aborted" in r.stderr and "most recent call first" in r.stderr
