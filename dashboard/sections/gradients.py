"""Gradients: per-layer histogram heatmap over steps and per-layer gradient norms."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import charts, derive
from cliffguard.dashboard.sections.context import Context, show


def render(ctx: Context) -> None:
    st.subheader("Gradients")
    hists = ctx.read(read.grad_hists, ctx.run_id, limit=ctx.cfg.hist_limit)[::-1]
    norms = derive.layer_norm_rows(ctx.read(read.step_rows, ctx.run_id, newest=ctx.cfg.hist_limit * 10))
    if norms.empty and hists:
        norms = derive.hist_layer_norms(hists)
    if not hists and norms.empty:
        st.info("no gradient histograms or per-layer norms reported yet")
        return
    left, right = st.columns(2)
    with left:
        layers = derive.hist_layers(hists)
        if layers:
            layer = st.selectbox("layer", layers, key="hist_layer")
            show(st, charts.hist_heatmap(derive.hist_cells(hists, layer), layer), key="hist_heatmap")
        else:
            st.info("no gradient histograms yet")
    with right:
        if norms.empty:
            st.info("no per-layer norms yet")
        else:
            show(st, charts.layer_norm_heatmap(norms), key="layer_norms")
