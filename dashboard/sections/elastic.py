"""Elastic scale changes: world size, global batch and LR over the run, and the goodput each
change cost (steps redone, seconds in rendezvous and reload)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import charts
from cliffguard.dashboard.sections.context import Context, show

TIMELINE_COLUMNS = ("step", "ts", "world", "global_batch")
EVENT_COLUMNS = ("step", "direction", "from_world", "to_world", "from_global_batch", "global_batch", "grad_accum",
                 "lr", "lr_factor", "lr_rule", "policy", "steps_lost", "seconds_lost", "backoff_s", "ts")


def timeline_to_end(timeline: pd.DataFrame, last_step: int) -> pd.DataFrame:
    """The timeline with its last world/batch held to ``last_step`` (so the stepped lines reach it)."""
    if timeline.empty:
        return timeline
    tail = timeline.iloc[[-1]].assign(step=max(int(last_step), int(timeline["step"].iloc[-1])))
    return pd.concat([timeline, tail], ignore_index=True)


def render(ctx: Context) -> None:
    events = ctx.frame(read.elastic_events, ctx.run_id, keys=EVENT_COLUMNS)
    if events.empty:
        return  # a run that never changed size: nothing to show (the section stays out of the way)
    st.subheader("Elastic scale changes")
    run = ctx.read(read.get_run, ctx.run_id) or {}
    timeline = timeline_to_end(ctx.frame(read.scale_timeline, ctx.run_id, keys=TIMELINE_COLUMNS),
                               int(run.get("last_step") or 0))
    lr = ctx.frame(read.step_rows, ctx.run_id, newest=ctx.cfg.max_points, keys=("step", "lr"))
    show(st, charts.scale_chart(timeline, lr), key="elastic_chart")
    now = timeline.iloc[-1]
    st.caption(f"{len(events)} scale changes · now world {int(now['world'])}, global batch {int(now['global_batch'])}"
               f" · lost in total: {int(events['steps_lost'].sum())} steps redone, "
               f"{float(events['seconds_lost'].sum()):.1f} s in rendezvous and reload"
               + (f", {float(events['backoff_s'].sum()):.0f} s flapping back-off" if events["backoff_s"].sum() else ""))
    st.dataframe(events.drop(columns=["ts"]), hide_index=True, width="stretch")
