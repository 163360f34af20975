"""The suspect nodes (issue 22): nodes the controller evicted, kept out of every run until an
operator or a passing node check clears them (controller/suspects.py). Fleet-wide, not the chosen
run's: a node evicted from one run is refused by all. Absent while no node is suspect."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard.sections.context import Context

COLUMNS = ("node", "cause", "since", "run_id", "incident_id", "records", "recheck_at", "reason")


def render(ctx: Context) -> None:
    rows = ctx.frame(read.suspect_nodes, keys=COLUMNS)
    if rows.empty:
        return
    st.subheader("Suspect nodes")
    probation = int(rows["recheck_at"].notna().sum())
    refused = len(rows) - probation
    here = int((rows["run_id"] == ctx.run_id).sum())
    st.warning(f"{refused} node(s) not admitted to any run until cleared (`cliffguard nodes clear NODE --reason ...`)"
               + (f" · {probation} on probation until a node check passes" if probation else "")
               + (f" · {here} evicted from this run" if here else ""))
    st.dataframe(rows, hide_index=True, width="stretch")
