"""The loss curve with the spike rule's median and bands (as the controller stored them), spikes,
incident spans and rollbacks; then the learning rate and lr_scale."""

from __future__ import annotations

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.core.enums import Level
from cliffguard.dashboard import charts, derive
from cliffguard.dashboard.bands import loss_bands, rollbacks
from cliffguard.dashboard.sections.context import Context, show

LOSS_COLUMNS = ("step", "ts", "loss", "nonfinite", "lr", "lr_scale", "grad_norm", "guard", "skipped", "loss_scale")


def render(ctx: Context) -> None:
    head, opt = st.columns([5, 1])
    head.subheader("Loss")
    log_y = opt.toggle("log scale", value=False, key="loss_log_y")
    curve = ctx.frame(read.step_rows, ctx.run_id, newest=ctx.cfg.max_points, keys=LOSS_COLUMNS)
    if curve.empty:
        st.info("no steps reported yet")
        return
    stats = ctx.read(read.spike_rule_stats, ctx.run_id, ctx.cfg.max_points)
    bands = loss_bands(curve, stats)
    spans = derive.incident_spans(
        ctx.frame(read.incidents, ctx.run_id, limit=None, keys=derive.INCIDENT_COLUMNS, oldest_first=True),
        ctx.frame(read.transitions, ctx.run_id, limit=None, keys=derive.TRANSITION_COLUMNS))
    backs = rollbacks(curve)
    show(st, charts.loss_chart(bands, spans, backs, log_y=log_y), key="loss_chart")
    n_warn = int((bands["level"] == Level.WARN).sum())
    n_crit = int((bands["level"] == Level.CRITICAL).sum())
    rule = stats.rule
    bands_text = ("no bands: the controller stored no spike-rule statistics for this run" if rule is None else
                  f"grey: the controller's sliding median of the last {rule['window']} healthy losses · amber/red "
                  f"dashed: median + {rule['k_warn']:g}σ / + {rule['k_crit']:g}σ (robust σ = 1.4826·MAD)")
    st.caption(
        f"{bands_text} · ▲ spikes: {n_warn} warn, {n_crit} critical · shaded: incidents · red rule: rollback "
        f"({len(backs)}) · faded: steps later redone"
    )
    st.markdown("**Learning rate and lr_scale**")
    show(st, charts.lr_chart(bands), key="lr_chart")
