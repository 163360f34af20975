"""The recovery kit's preemption boundary: save, say so, and leave (or stay, in an elastic run).

``RecoveryKit._boundary`` calls ``save_and_stop`` at the boundary after any rank was warned
(agent/recovery/preemption.py notes the signal; the step's all-reduce carries the flag): every
rank saves the whole state (the store's ``save_now``: memory, then disk, within the deadline),
rank 0 emits ``run.preempted``, and the boundary is falsy. In an elastic launch the ranks first
share who was warned (agent/recovery/preempt_leave.py): the warned nodes leave, the others wait for
them to be gone and restart without them; a torchrun membership change with nobody warned is a
``regroup``, saved but no preemption.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from cliffguard.agent.modes import STOPPING
from cliffguard.agent.recovery import preempt_leave
from cliffguard.agent.recovery.boundary import Boundary
from cliffguard.agent.recovery.preemption import Request, report
from cliffguard.core.enums import CheckpointKind, EventType

log = logging.getLogger("cliffguard.agent.recovery.kit")
RecoveryKit = Any
"""agent/recovery/kit.py's ``RecoveryKit`` (not imported: the kit imports this module)."""


def save_and_stop(kit: RecoveryKit) -> Boundary:
    """Every rank at the same boundary: save (memory, then disk, within the deadline), report,
    stop. A rank its peers' warning reached first counts from now."""
    agent, cfg = kit.agent, kit.preemption.config
    step = agent.step
    boundary_at = time.monotonic()
    # read once: the handler may note this rank's own signal while the save runs, and a rank its
    # peers' flag reached first still dates the preemption from the first warned node's signal
    own = kit.preemption.request
    request = own or Request("peer", boundary_at)
    state = kit.state.capture(step)
    save_now = getattr(kit.store, "save_now", None)
    saved: dict[str, Any] | None = None
    try:
        if save_now is not None:
            saved = save_now(step, state, timeout=max(request.left(cfg.deadline_s), 0.0))
        else:  # a store with no disk (the kit's own ring): the memory copy does not outlive the process
            kit.store.save(step, state, CheckpointKind.MEMORY)
            log.warning("preemption: the kit's store has no disk checkpoint; step %d is saved in memory only", step)
    except Exception:  # noqa: BLE001 - reported as not verified; the run still exits to be requeued
        log.exception("preemption save at step %d failed", step)
    saved_at = time.monotonic()
    leave = elastic_leave(kit, step)
    if leave is not None and own is None and leave.nodes:
        request = preempt_leave.origin(str(kit.agent.hang.plan_dir), leave.nodes, boundary_at) or request
    if leave is not None and not leave.nodes:  # torchrun's membership change: saved, no preemption
        log.warning("regroup: torchrun stops this worker group (a node joins); step %d saved, leaving for its "
                    "restart", step)
        kit.stop_reason, kit.exit_code = "regroup", preempt_leave.exit_code(leave, cfg.exit_code)
        agent.modes.move(STOPPING)
        return Boundary(False, step)
    kit.preempted = report(request, cfg, boundary_at=boundary_at, saved=saved, saved_at=saved_at)
    if leave is not None:
        kit.preempted.update(leave.report())
    if agent.rank == 0:
        agent.emit(EventType.RUN_PREEMPTED, kit.preempted, step=step)
        log.warning("preempted (%s): step %d saved in %.2f s of the %.0f s deadline (verified: %s)%s",
                    request.signal, step, kit.preempted["save_s"], cfg.deadline_s, kit.preempted["verified"],
                    "" if leave is None or leave.scope == "job" else
                    f"; node(s) {', '.join(leave.nodes)} leave, the rest go on without them")
    kit.exit_code = cfg.exit_code if leave is None else preempt_leave.exit_code(leave, cfg.exit_code)
    kit.stop_reason = "preempted" if leave is None or leave.warned else "regroup"
    if leave is not None:
        hang = kit.agent.hang
        agent.close(None, ended=False)  # the events out before the wait: the launcher may stop this process
        preempt_leave.wait_to_leave(leave, str(hang.plan_dir), hang.life.node, kit._started_wall,
                                    int(os.environ.get("LOCAL_RANK", "0") or 0), step)
    agent.modes.move(STOPPING)
    return Boundary(False, step)

def pending(kit: RecoveryKit) -> bool:
    """This rank was warned: its own signal, or (elastic) its launcher's word of one. A warning
    that reached the launcher after this worker's boundary, or while torchrun restarted the
    workers, never reaches this process as a signal: the word makes it leave at its next boundary."""
    if kit.preemption.requested:
        return True
    word = kit._launcher_word
    if word is not None and (request := word.read()) is not None:
        kit.preemption.request = request
        return True
    return False

def elastic_leave(kit: RecoveryKit, step: int) -> preempt_leave.Leave | None:
    """In an elastic launch: who leaves after this save (agent/recovery/preempt_leave.py); None otherwise."""
    hang = getattr(kit.agent, "hang", None)
    if hang is None or not preempt_leave.is_elastic():
        return None
    plan_dir = str(hang.plan_dir)
    warned = (preempt_leave.scheduler_warned(kit.preemption.request, plan_dir, hang.life.node, 0.0)
              or preempt_leave.settle(plan_dir, hang.life.node, kit._started_wall))
    return preempt_leave.decide(warned, hang.life.node, kit.agent.distributed)
