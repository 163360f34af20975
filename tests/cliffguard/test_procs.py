"""cliffguard.procs: children in their own process groups, stopped with everything they started."""

from __future__ import annotations

import os
import sys
import time

from cliffguard.core.pids import pid_alive as _alive
from cliffguard.procs import ProcessSet

# A child that starts a grandchild in a session of its own (as torchrun does with its workers),
# ignores SIGINT (a stubborn child) and prints the grandchild's pid.
PARENT = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(g.pid, flush=True)
time.sleep(300)
"""


def test_stop_all_ends_children_and_grandchildren_in_other_sessions(tmp_path):
    lines: list[str] = []
    procs = ProcessSet()
    child = procs.spawn("stubborn", [sys.executable, "-c", PARENT], env=dict(os.environ),
                        log_path=tmp_path / "child.log", on_line=lines.append)
    deadline = time.monotonic() + 30
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(lines[0])
    assert os.getpgid(child.proc.pid) == child.proc.pid != os.getpgid(0)
    assert _alive(grandchild)
    procs.stop_all(grace_s=0.5)
    assert child.proc.poll() is not None
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert (tmp_path / "child.log").read_text().strip() == str(grandchild)
