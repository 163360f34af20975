"""An elastic launch's node leaving on the scheduler's warning (issue 24, "shrink, don't kill").

``cliffguard train --nnodes MIN:MAX`` on a node-group job that the scheduler preempts: the
launcher is the one process that knows the SIGTERM is the scheduler's (torchrun's elastic agent
sends its workers SIGTERM on every membership change too). So on a warning it

1. writes the node's warning (core/node_warning.py) before passing the signal on: every rank
   saves at the next boundary, and this node's workers learn that they are the ones to leave;
2. once they saved (``saved-<node>``, written after every rank's share is on disk), or the
   deadline passed, stops its torchrun agent and the workers (SIGKILL: the state is saved, and a
   stopping agent given time would join the next rendezvous round its peers start without it),
   then writes ``left-<node>``: the nodes that stay re-form the group only after that;
3. exits with the requeue code; the scheduler starts the job again later and the node rejoins
   the run (torchrun's scale-up).

The agent's side is agent/recovery/preempt_leave.py.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from cliffguard.core import node_warning

log = logging.getLogger(__name__)

AFTER_DEADLINE_S = 5.0
"""Past the save's deadline the node leaves anyway (the workers may be stuck; the scheduler's
SIGKILL is near)."""


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (torchrun starts each worker in a session of its own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


class NodeLeave:
    def __init__(self, plan_dir: str | Path, node: str, deadline_s: float) -> None:
        self.plan_dir, self.node, self.deadline_s = str(plan_dir), node, deadline_s
        self.warned_at: float | None = None  # time.monotonic()
        self._warned_wall = 0.0
        self.left = False
        self.saved = False
        node_warning.clear(self.plan_dir, node)  # a fresh launch (a requeued job) forgets the last one

    def warned(self, signal_name: str) -> None:
        """The scheduler's warning reached this launcher (before it is passed to the workers)."""
        if self.warned_at is not None:
            return
        self.warned_at, self._warned_wall = time.monotonic(), time.time()
        node_warning.write_warned(self.plan_dir, self.node, signal_name, self._warned_wall)

    def tick(self, proc: subprocess.Popen[bytes]) -> None:
        if self.warned_at is None or self.left:
            return
        self.saved = node_warning.has_saved(self.plan_dir, self.node, self._warned_wall)
        late = time.monotonic() - self.warned_at > self.deadline_s + AFTER_DEADLINE_S
        if not (self.saved or late or proc.poll() is not None):
            return
        if not self.saved:
            log.error("node %s: no save %.0f s after the warning; stopping its workers anyway", self.node,
                      time.monotonic() - self.warned_at)
        kill_tree(proc.pid)
        proc.wait()
        node_warning.write_left(self.plan_dir, self.node)
        self.left = True
