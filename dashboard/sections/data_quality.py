"""The data-quality page: the chosen run's live batch statistics (sections/data_live.py) beside
the offline report, what ``cliffguard data`` kept, removed and reweighted, and the curriculum the
trainer's sampler follows."""

from __future__ import annotations

import streamlit as st

from cliffguard.dashboard import data_quality as dq
from cliffguard.dashboard.config import DashboardConfig
from cliffguard.dashboard.sections import data_live
from cliffguard.dashboard.sections.context import Context


def render(cfg: DashboardConfig, ctx: Context | None = None, every: float | None = None) -> None:
    """``ctx``: the run whose live statistics to show (None: no run in the store), refreshed
    every ``every`` seconds (a fragment, like the run view's sections)."""
    st.title("Data quality")
    both = (cfg.data_report or cfg.data_manifest) and ctx is not None
    live, offline = st.columns(2) if both else (st.container(), st.container())
    if ctx is not None:
        with live:
            st.fragment(data_live.render, run_every=every)(ctx)
    with offline:
        if cfg.data_report:
            st.subheader("Offline report (`cliffguard data`)")
            _report(cfg.data_report)
        if cfg.data_manifest:
            _curriculum(cfg.data_manifest)
    if ctx is None and not (cfg.data_report or cfg.data_manifest):
        st.info("no run in the store and no `cliffguard data` report configured "
                "(`[dashboard] data_report`, `data_manifest`)")


def _report(path: str) -> None:
    try:
        report = dq.load_json(path)
    except dq.DataFileError as exc:
        st.error(str(exc))
        return
    st.caption(f"report: `{path}` · corpus `{report.get('root', '?')}`")
    for col, (label, value) in zip(st.columns(4), dq.report_counts(report).items(), strict=True):
        col.metric(label, f"{value:,}")
    left, right = st.columns(2)
    left.markdown("**why documents were removed or reweighted**")
    left.dataframe(dq.reasons_frame(report), hide_index=True, key="dq_reasons")
    dedup = report.get("dedup") or {}
    right.markdown(f"**near-duplicate clusters** (threshold {dedup.get('threshold', '?')}, "
                   f"precision estimate {dedup.get('precision_estimate', '?')})")
    right.dataframe(dq.clusters_frame(report), hide_index=True, key="dq_clusters")
    contamination = dq.contamination_frame(report)
    st.markdown(f"**benchmark contamination: {len(contamination)} removed**")
    if not contamination.empty:
        st.dataframe(contamination, hide_index=True, key="dq_contamination")


def _curriculum(path: str) -> None:
    try:
        manifest = dq.load_json(path)
        phases = dq.curriculum_frame(manifest)
        weights = dq.weights_frame(manifest)
    except (dq.DataFileError, KeyError, TypeError, ValueError) as exc:
        st.error(f"{path}: {exc}")
        return
    st.subheader("Curriculum")
    if phases.empty:
        st.info("the manifest has no curriculum: every category keeps weight 1 all run long")
    else:
        spec = {
            "height": 220,
            "mark": {"type": "bar"},
            "encoding": {
                "x": {"field": "start", "type": "quantitative", "title": "fraction of training",
                      "scale": {"domain": [0, 1]}},
                "x2": {"field": "until"},
                "y": {"field": "weight", "type": "quantitative", "title": "mixture weight"},
                "yOffset": {"field": "category"},
                "color": {"field": "category", "type": "nominal"},
                "tooltip": [{"field": c} for c in ("phase", "category", "weight", "start", "until")],
            },
        }
        st.vega_lite_chart(phases, spec, key="dq_curriculum")
    if not weights.empty:
        st.caption(f"{len(weights):,} kept documents · mean sampling weight {weights['weight'].mean():.3f}")
