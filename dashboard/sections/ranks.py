"""Per-rank throughput and timing (a straggler stands out) and memory."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import charts, derive
from cliffguard.dashboard.sections.context import Context, show

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
    _detail(ctx)


def _detail(ctx: Context) -> None:
    """Every rank's own step events, when a detail command (an operator's or a rule's) asked for them."""
    df = ctx.frame(read.rank_detail, ctx.run_id, keys=("step", "rank", *read.DETAIL_COLUMNS))
    if df.empty:
        st.caption("per-rank detail: none yet (ask for it with the operator action `detail`, or "
                   "`cliffguard command RUN detail --steps N`)")
        return
    st.markdown(f"**Per-rank detail**, steps {int(df['step'].min())}–{int(df['step'].max())}")
    cols = st.columns(2)
    show(cols[0], charts.per_rank_chart(df, "loss_local", "loss per rank", ".3f"), key="detail_loss")
    show(cols[1], charts.per_rank_chart(df, "step_time_s", "step time per rank (s)", ".3f"), key="detail_time")
    table = df.pivot_table(index="rank", columns="step", values="step_time_s")
    st.dataframe(table, key="detail_table")
