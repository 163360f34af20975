"""The recovery kit's side of a hang: a restart applied at a step boundary, the halt a plan may
say at start, and the pre-flight node check of a restarted worker group.

- ``restart_outcome``: a ``restart`` command reaching the boundary (the training thread is not
  stalled, so every rank has it): rank 0 writes the plan and every rank leaves once the ack is out
  (the kit raises ``RestartRequested``); one for an earlier life is acked without acting.
- ``refuse_if_halted``: a worker whose job's plan says ``halt`` ends before it trains or speaks.
- ``preflight``: a restarted group (life > 0) checks its ranks (agent/hang/node_check.py); rank 0
  reports ``node.check``; a failed check leaves the run ``paused`` for the controller, which
  restarts it without the slow node or halts it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.hang.node_check import CheckResult, run_check
from cliffguard.agent.hang.part import HangPart, NotThisLife
from cliffguard.agent.modes import PAUSED, ModeMachine
from cliffguard.core.enums import EventType
from cliffguard.core.events import Command
from cliffguard.core.restart_plan import RestartPlan, plan_path

log = logging.getLogger(__name__)


def restart_outcome(hang: HangPart, cmd: Command) -> tuple[Outcome, RestartPlan | None]:
    """The ack for a restart at the boundary and the plan to leave with (None: nothing to do)."""
    try:
        plan = hang.plan_for(cmd)
    except NotThisLife as exc:
        return Outcome.applied(str(exc)), None
    path = hang.write(plan)
    where = f"; plan {path}" if path is not None else ""
    return Outcome.applied(f"{plan.mode}: every rank leaves worker group life {plan.life} at step boundary "
                           f"for torchrun to restart it{where}"), plan


def refuse_if_halted(hang: HangPart) -> None:
    """SystemExit (naming the plan) when this job's plan says halt."""
    plan = hang.halted()
    if plan is None:
        return
    msg = (f"run halted for a human by incident {plan.incident or '?'} ({plan.reason or 'restart budget spent'}); "
           f"this worker does not train. Clear {plan_path(hang.plan_dir)} (a fresh `cliffguard train` launch does) "
           f"to run again")
    log.error("%s", msg)
    raise SystemExit(msg)


def preflight(hang: HangPart, modes: ModeMachine, emit: Callable[[EventType, dict], None], *, device: object,
              before_round: Callable[[int], None] | None = None) -> CheckResult | None:
    """The node check of a restarted group (every rank; None when not due)."""
    life, ranks = hang.life, hang.ranks
    if not (hang.config.enabled and hang.config.preflight and ranks.distributed and life.restarted):
        return None
    result = run_check(hang.config, ranks.rank, ranks.world, life.node, life=life.life, device=device,
                       before_round=before_round)
    if ranks.rank == 0:
        emit(EventType.NODE_CHECK, result.event_data())
    if result.ok:
        log.info("node check of life %d passed in %.2f s: %s", life.life, result.seconds, result.detail)
        return result
    log.error("node check of life %d failed: %s (nodes %s); waiting for the controller", life.life, result.detail,
              ", ".join(result.slow_nodes))
    modes.move(PAUSED)
    return result
