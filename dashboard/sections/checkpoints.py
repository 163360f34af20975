"""Checkpoint timeline: memory / incremental / full, verified, stable."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import charts, derive
from cliffguard.dashboard.sections.context import Context, show


def render(ctx: Context) -> None:
    st.subheader("Checkpoints")
    ckpts = ctx.frame(read.checkpoints, ctx.run_id, keys=derive.CHECKPOINT_COLUMNS, oldest_first=True)
    if ckpts.empty:
        st.info("no checkpoints reported yet")
        return
    show(st, charts.checkpoint_timeline(ckpts), key="ckpt_timeline")
    stable = ckpts[ckpts["stable"].astype(bool)]
    newest = int(stable["step"].max()) if len(stable) else None
    st.caption(
        f"{len(ckpts)} checkpoints · {int(ckpts['verified'].astype(bool).sum())} verified · {len(stable)} stable"
        + (f" · newest stable: step {newest}" if newest is not None else "")
    )
    failed = ckpts[~ckpts["verified"].astype(bool)]
    if len(failed):
        st.warning("failed verification (not a rollback target): " + "; ".join(
            f"step {int(r.step)} {r.kind}" + (f" ({r.detail})" if r.detail else "") for r in failed.itertuples()))
    with st.expander("checkpoint table"):
        st.dataframe(ckpts.drop(columns=["sha256"]), hide_index=True, width="stretch")
