"""The launcher's side of a restart plan (core/restart_plan.py): ``cliffguard train`` waits for its
torchrun agent while watching the job's plan.

A plan written after this launch that leaves this node out (``exclude`` naming it) or halts the
job makes the launcher stop its torchrun agent (SIGTERM: torchrun stops its workers, then
exits) before the next rendezvous can take the node in, and say why. A plan that leaves one of
this node's devices out (``exclude_devices``: a device-level eviction) stops the agent the same way,
and the launcher starts a new one with one process fewer, that device left out (``Outcome.devices``;
cliffguard/commands/train.py): the new agent joins the restarted group's rendezvous, so the
rendezvous's last call (``--rdzv-last-call-s``) must outlast a torchrun start (a few seconds), or
the group first forms without the node and grows back at the next round. Other plans (``in_place``)
are torchrun's to act on: it restarts the worker group by itself when rank 0 leaves.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cliffguard.core.restart_plan import RestartPlan, clear_plan, plan_path, read_plan

log = logging.getLogger(__name__)

POLL_S = 0.25
EXCLUDED_EXIT = 3
"""The launcher's exit status when the controller left its node out or halted the job."""


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    plan: RestartPlan | None = None
    """The plan that stopped this node (None: torchrun ended by itself)."""
    devices: tuple[int, ...] = ()
    """The slots of this node the plan left out, the node staying (the launcher starts torchrun again)."""

    def message(self, node: str, keeps: int | None = None) -> str:
        p = self.plan
        if p is None:
            return ""
        if self.devices:
            kept = f" (the node keeps {keeps})" if keeps is not None else ""
            what = (f"left device{'s' if len(self.devices) > 1 else ''} {', '.join(map(str, self.devices))} of node "
                    f"{node} out of the restarted group{kept}")
        else:
            what = "halted the job for a human" if p.mode == "halt" else f"left node {node} out of the restarted group"
        return (f"the controller {what} (incident {p.incident or '?'}, worker group life {p.life}): "
                f"{p.reason or '-'}; the evidence is in the store (cliffguard status RUN, the dashboard)")


def start_fresh(plan_dir: str | Path) -> RestartPlan | None:
    """A new launch clears an old plan (a node a human starts again is meant to run); returns it."""
    old = clear_plan(plan_dir)
    if old is not None:
        log.warning("cleared an earlier restart plan (%s, incident %s) in %s", old.mode, old.incident or "?",
                    plan_path(plan_dir))
    return old


def stops(plan: RestartPlan | None, node: str, since: float) -> bool:
    """Whether ``plan`` (written after ``since``) tells this node's launcher to stop its torchrun agent:
    the node left out or the job halted, or one of its devices left out (``plan.devices_out``)."""
    return plan is not None and plan.written_at >= since and (plan.excludes(node) or bool(plan.devices_out(node)))


def wait(proc: subprocess.Popen[bytes], plan_dir: str | Path, node: str, *, since: float,
         poll_s: float = POLL_S, stop_timeout_s: float = 60.0, tick: Callable[[], None] | None = None) -> Outcome:
    """Wait for torchrun (``proc``); stop it when a plan says so. ``tick`` runs every poll (the
    launcher passes the scheduler's warning signals on there)."""
    while True:
        code = proc.poll()
        if code is not None:
            return Outcome(code)
        if tick is not None:
            tick()
        try:
            plan = read_plan(plan_dir)
        except ValueError as exc:
            log.warning("%s", exc)
            plan = None
        if stops(plan, node, since):
            assert plan is not None
            out = () if plan.excludes(node) else plan.devices_out(node)
            log.error("restart plan %s for life %d: stopping this node's torchrun agent%s", plan.mode, plan.life,
                      f" (to start it again without device(s) {list(out)})" if out else "")
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return Outcome(EXCLUDED_EXIT, plan, out)
        time.sleep(poll_s)
