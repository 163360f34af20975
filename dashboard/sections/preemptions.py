"""Each run's preemptions: when the scheduler took the nodes back, how close the save came to the
grace time, the work lost and how long until the run trained again (issue 24). ``scope`` ``nodes``:
an elastic run lost only those nodes and went on without them (outcome ``shrunk``)."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard.sections.context import Context

COLUMNS = ("opened_at", "signal", "scope", "nodes", "saved_step", "save_s", "deadline_s", "verified", "outcome",
           "steps_lost", "seconds_to_train")


def render(ctx: Context) -> None:
    rows = ctx.frame(read.preemptions, ctx.run_id, keys=COLUMNS)
    if rows.empty:
        return  # never preempted: the section stays out of the way
    st.subheader("Preemptions")
    down = rows["outcome"] == "open"
    closest = float((rows["save_s"] / rows["deadline_s"]).max())
    st.caption(f"{len(rows)} preemption(s) · the slowest save took {100 * closest:.0f} % of its grace time"
               + (" · down now: waiting to be requeued" if bool(down.any()) else ""))
    st.dataframe(rows, hide_index=True, width="stretch")
