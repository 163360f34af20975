"""The run at a glance: status, recovery state, step, applied LR scale, last loss, the commands the run
applies, the recovery ladder's room (each rung's budget), rank heartbeats."""

from __future__ import annotations

import time

import streamlit as st

from cliffguard.controller.recovery_budgets import left
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.store import read
from cliffguard.core.capabilities import describe, describe_lr_scale
from cliffguard.dashboard import derive
from cliffguard.dashboard.sections.context import Context


def render(ctx: Context) -> None:
    run = ctx.read(read.get_run, ctx.run_id)
    if run is None:
        st.warning(f"run {ctx.run_id} is not in the store")
        return
    newest = ctx.read(read.step_rows, ctx.run_id, newest=1)
    now = time.time()
    live = ctx.read(read.liveness, ctx.run_id, now=now)
    cols = st.columns(6)
    cols[0].metric("status", run["status"])
    cols[1].metric("recovery state", run["recovery_state"].replace("_", " "))
    cols[2].metric("last step", f"{run['last_step']:,}")
    # what the trainer applied, never what the controller asked for (a rollback in flight or refused)
    cols[3].metric("lr_scale applied", describe_lr_scale(run.get("lr_scale_applied"), run["lr_scale"]))
    last_loss = newest[-1]["loss"] if newest else None
    cols[4].metric("loss", "—" if last_loss is None else f"{last_loss:.4f}")
    cols[5].metric("world size", run["world_size"])
    st.caption(f"commands this run applies: {describe(run.get('capabilities'))}")
    st.caption("recovery budgets — " + budgets_line(left(RecoveryConfig(), run.get("controller_state"), now)))
    if live["ranks"]:
        st.caption("heartbeats — " + liveness_line(live, now))


def budgets_line(found: dict) -> str:
    """Each recovery rung's room in one line (``recovery_budgets.left``): uses in its window of its
    budget, what is left and what comes after; whose limits (the controller's, stored with the run)."""
    parts = [f"{r['rung']} {r['in_window']}/{r['budget']}: {r['left']} left, then {r['escalates_to']}"
             for r in found["rungs"]]
    whose = "" if found["source"] == "controller" else " (default limits: the controller stored none for this run)"
    return " · ".join(parts) + whose


def liveness_line(live: dict, now: float) -> str:
    """``read.liveness`` in one line: a run of 16k ranks is a few ranges, not a line per rank."""
    steps = (f"step {live['highest_step']:,}" if live["lowest_step"] == live["highest_step"]
             else f"steps {live['lowest_step']:,}-{live['highest_step']:,} (lowest: ranks {live['lowest_ranks']})")
    parts = [f"{live['ranks']:,} ranks, {'/'.join(live['states'])}", steps,
             f"newest {derive.age(now - live['newest_ts'])} ago"]
    if live["silent"]:
        parts.append(f"silent: ranks {live['silent']}")
    if live["in_collective"]:
        parts.append("in " + ", ".join(f"{name}: {n:,}" for name, n in sorted(live["in_collective"].items())))
    return " · ".join(parts)
