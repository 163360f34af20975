"""After an elastic run's preemption save: which nodes leave, and how the rest go on (issue 24,
"shrink, don't kill").

In an elastic launch (``cliffguard train --nnodes MIN:MAX``) a SIGTERM reaches a worker for two
reasons its handler cannot tell apart: the scheduler preempting the worker's node-group job, and
torchrun's elastic agent stopping its workers for a membership change (a node joining). Both are
handled the same way up to the save (every rank at one boundary, the step in flight finished), so
a membership change loses no step either. After the save each rank asks its launcher
(core/node_warning.py: only the launcher receives the scheduler's warning) and the ranks share
the answers (one ``all_gather_object``, only on this path):

- **no node warned**: torchrun's membership change. Every rank exits for torchrun's restart
  (``regroup``); no ``run.preempted`` (the run was not preempted; the scale event says the rest).
- **some nodes warned** (scope ``nodes``: shrink): the warned nodes' ranks wait for their launcher
  to stop them (it stops its torchrun agent first, so the node cannot join the next round), then
  exit ``exit_code``; the other ranks wait until every warned node has left, then exit for
  torchrun's restart: their agent re-forms the rendezvous without the warned nodes and the run
  resumes from this save at the smaller world with the declared batch policy.
- **every node warned** (scope ``job``): every rank waits for its launcher and exits ``exit_code``;
  the scheduler requeues the jobs.

Rank 0 emits ``run.preempted`` with the scope, the nodes that left and the ranks they held.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from cliffguard.agent.recovery.preemption import Request
from cliffguard.core import node_warning
from cliffguard.core.restart_plan import MIN_NODES_ENV, RESTART_EXIT_CODE

log = logging.getLogger(__name__)

CONFIRM_S = 2.0
"""How long after its own signal a rank waits for its launcher's word before taking the signal
for torchrun's (the launcher writes it within a poll, 0.25 s; CI's loaded cores take longer)."""
SETTLE_S = 2.0
"""A rank whose node has no warning yet waits until this long after the first warned node's (a
scheduler preempting several node-group jobs for one job warns them within moments: one save and
one decision then serve them all). Measured: two groups warned at the same Slurm decision; one's
launcher wrote its word a step later, so the first group left alone, the second re-formed the group
at world 1 and saved only after its restart, 24.7 s after its warning (deadline 20 s)."""
LEAVE_WAIT_S = 30.0
"""The most a rank waits for a warned node's launcher to stop it (or, staying, for the warned
nodes to leave) before it exits anyway, saying so."""


def is_elastic(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """An elastic launch: ``cliffguard train --nnodes`` sets the fewest nodes for its workers."""
    return MIN_NODES_ENV in (os.environ if env is None else env)


@dataclass(frozen=True, slots=True)
class Leave:
    """What this rank does after the save, and what rank 0 reports."""

    warned: bool
    """This rank's node got the scheduler's warning: it leaves the run."""
    nodes: tuple[str, ...]
    """The warned nodes (none: a membership change)."""
    ranks_leaving: int
    world: int

    @property
    def scope(self) -> str:
        if not self.nodes:
            return "regroup"
        return "job" if self.ranks_leaving == self.world else "nodes"

    def report(self) -> dict[str, Any]:
        return {"scope": self.scope, "nodes": list(self.nodes), "ranks_leaving": self.ranks_leaving,
                "world": self.world}


def scheduler_warned(request: Request | None, plan_dir: str, node: str, since_wall: float, *,
                     confirm_s: float = CONFIRM_S, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Whether this rank's own signal was its node's scheduler warning (a rank a peer's flag
    reached has none). Waits until ``confirm_s`` after the signal for the launcher's word."""
    if request is None:
        return False
    while True:
        if node_warning.read_warned(plan_dir, node, since_wall) is not None:
            return True
        if request.elapsed() >= confirm_s:
            return False
        sleep(0.05)


def settle(plan_dir: str, node: str, since_wall: float, *, settle_s: float = SETTLE_S,
           sleep: Callable[[float], None] = time.sleep) -> bool:
    """For a rank whose node had no warning of its own: whether one comes within ``settle_s`` of the
    first warned node's (warnings before ``since_wall``, this worker group's start, are old news).
    No node warned (a membership change): False at once, no wait."""
    first = node_warning.first_warned_since(plan_dir, since_wall)
    if first is None:
        return False
    while True:
        if node_warning.read_warned(plan_dir, node, since_wall) is not None:
            return True
        if time.time() >= first + settle_s:
            return False
        sleep(0.05)


def origin(plan_dir: str, nodes: tuple[str, ...], fallback_at: float) -> Request | None:
    """For a rank its peers' flag reached: the first warned node's signal, dated by its launcher
    (the deadline and ``save_s`` count from the scheduler's signal, not from this rank's boundary)."""
    words = [w for n in nodes if (w := node_warning.read_warned(plan_dir, n, 0.0)) is not None]
    if not words:
        return None
    first = min(words, key=lambda w: w["at"])
    ago = max(time.time() - float(first["at"]), 0.0)
    return Request(str(first.get("signal") or "peer"), min(time.monotonic() - ago, fallback_at))


class LauncherWord:
    """Polled every step: whether this node's launcher wrote a warning (one ``stat`` while there is none)."""

    def __init__(self, plan_dir: str, node: str) -> None:
        self.plan_dir, self.node = plan_dir, node
        self.path = node_warning.warned_path(plan_dir, node)

    def read(self) -> Request | None:
        if not self.path.exists():
            return None
        word = node_warning.read_warned(self.plan_dir, self.node, 0.0)  # the launcher clears it at its start
        if word is None:
            return None
        ago = max(time.time() - float(word["at"]), 0.0)
        return Request(str(word.get("signal") or "SIGTERM"), time.monotonic() - ago)


def decide(warned: bool, node: str, distributed: bool) -> Leave:
    """Every rank's answer, shared (one all_gather_object)."""
    mine = (warned, node)
    if distributed:
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    nodes = tuple(sorted({str(n) for w, n in everyone if w}))
    return Leave(warned=warned, nodes=nodes, ranks_leaving=sum(1 for w, _ in everyone if w), world=len(everyone))


def wait_to_leave(leave: Leave, plan_dir: str, node: str, since_wall: float, local_rank: int, step: int, *,
                  timeout_s: float = LEAVE_WAIT_S, sleep: Callable[[float], None] = time.sleep) -> None:
    """Hold this rank until the warned nodes are out of the rendezvous (see the module's doc)."""
    end = time.monotonic() + timeout_s
    if leave.warned:
        if local_rank == 0:  # every rank's share is written: the gather came after the save
            node_warning.write_saved(plan_dir, node, step)
        while time.monotonic() < end:  # the launcher stops this process
            sleep(0.1)
        log.error("preemption: the launcher of node %s did not stop this worker within %.0f s of the save; "
                  "exiting by itself (its torchrun agent may join the next rendezvous round)", node, timeout_s)
        return
    waiting = [n for n in leave.nodes if n != node]
    while waiting and time.monotonic() < end:
        waiting = [n for n in waiting if not node_warning.has_left(plan_dir, n, since_wall)]
        if waiting:
            sleep(0.1)
    if waiting:
        log.error("preemption: node(s) %s did not leave within %.0f s; re-forming the group anyway",
                  ", ".join(waiting), timeout_s)


def exit_code(leave: Leave, preempt_exit: int) -> int:
    """A leaving rank's code is the scheduler's requeue code; a staying one's tells torchrun to restart it."""
    return preempt_exit if leave.warned else RESTART_EXIT_CODE
