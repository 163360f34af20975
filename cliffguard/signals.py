"""``cliffguard train``'s side of a preemption: pass the scheduler's warning on to the workers.

The workers save on the warning (agent/recovery/preemption.py); the launcher must only make sure
they get it and then wait for them. How the signal arrives depends on the scheduler:

- Slurm preempting a job (``PreemptMode=REQUEUE``) signals every process of the job: the launcher,
  torchrun and the workers. torchrun forwards it to the workers too and waits ``--shutdown_timeout``
  before SIGKILL (torch.distributed.elastic does that; the launcher passes the deadline);
- ``sbatch --signal=B:USR1@N`` and a ``kill`` by hand reach the launcher alone (the batch script is
  ``exec cliffguard train ...``).

So the launcher forwards each warning to torchrun's children (the workers) and never to torchrun
itself: a second signal to torchrun while it waits for its workers would cut that wait short.
A worker warned twice saves once. The handler only notes the signal (no I/O in a handler);
``forward_pending`` sends it from the launcher's wait loop.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


def children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The pids whose parent is ``pid`` (Linux ``/proc``; a process that vanished meanwhile is skipped)."""
    out = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry.name))
    return sorted(out)


class WarningForwarder:
    """Installs handlers for ``signals`` in the launcher (main thread) and forwards each one noted
    to the children of ``parent_pid`` when ``forward_pending`` runs."""

    def __init__(self, signals: list[str]) -> None:
        self.signals = [signal.Signals[name] for name in signals]
        self.pending: list[int] = []
        self.received: list[str] = []
        self._previous: dict[signal.Signals, Any] = {}
        self.on_warning: Callable[[str], None] | None = None
        """Runs with each warning's name before it is passed on (an elastic node's leave, cliffguard/node_leave.py)."""

    def install(self) -> None:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)  # only note it: the wait loop forwards it

    def forward_pending(self, parent_pid: int) -> None:
        while self.pending:
            signum = self.pending.pop(0)
            name = signal.Signals(signum).name
            self.received.append(name)
            if self.on_warning is not None:
                self.on_warning(name)
            workers = children(parent_pid)
            for pid in workers:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            print(f"cliffguard train: {name}: passed to {len(workers)} worker(s); waiting for them to save",
                  flush=True)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
