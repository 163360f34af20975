"""Per-rank throughput and timing (a straggler stands out) and memory."""

from __future__ import annotations

import streamlit as st

from controller.store import read
from dashboard import charts, derive
from dashboard.sections.context import Context, show

RANK_COLUMNS = ("mfu", "tokens_per_s", "step_time_s", "data_wait_s", "comm_exposed_s", "compute_s", "mem_allocated",
                "mem_reserved")


def render(ctx: Context) -> None:
    st.subheader("Ranks: throughput, stalls, memory")
    df = ctx.frame(read.rank_metrics, ctx.run_id, columns=RANK_COLUMNS, last_steps=ctx.cfg.rank_window,
                   max_points=None, keys=("step", "rank", *RANK_COLUMNS))
    if df.empty:
        st.info("no per-rank step metrics yet")
        return
    df = derive.with_ratios(df)
    summary = derive.rank_summary(df)
    stragglers = [int(r) for r in summary.loc[summary["straggler"], "rank"]]
    if stragglers:
        st.warning(f"straggler rank(s): {', '.join(map(str, stragglers))} — mean step time "
                   f"> {derive.STRAGGLER_RATIO:g}× the other ranks' median")
    row1 = st.columns(3)
    show(row1[0], charts.per_rank_chart(df, "mfu", "MFU", ".0%"), key="rank_mfu")
    show(row1[1], charts.per_rank_chart(df, "tokens_per_s", "tokens/s", ",.0f"), key="rank_tps")
    show(row1[2], charts.rank_summary_chart(summary, "step_time_s", "mean step time (s), straggler in red", ".3f"),
                         width="stretch", key="rank_step_time")
    row2 = st.columns(3)
    show(row2[0], charts.per_rank_chart(df, "data_wait_ratio", "data-wait ratio", ".0%"), key="rank_data_wait")
    show(row2[1], charts.per_rank_chart(df, "comm_exposed_ratio", "comm-exposed ratio", ".0%"), key="rank_comm")
    show(row2[2], charts.memory_chart(df), key="rank_memory")
