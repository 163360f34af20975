"""Goodput: the run's ETTR, where every second went (a stacked time chart of the buckets), and
what each incident, restart and scale change cost (``controller/goodput``, read through
``read.goodput`` and ``read.goodput_costs``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from cliffguard.controller.goodput.buckets import BUCKETS, COLORS, LABELS
from cliffguard.controller.store import read
from cliffguard.dashboard.charts import Chart
from cliffguard.dashboard.sections.context import Context, show

COST_COLUMNS = ("key", "kind", "remedy", "rule", "ts", "seconds", "gpu_seconds", "steps_lost", "buckets")


def timeline_frame(goodput: dict[str, Any]) -> pd.DataFrame:
    """The ledger's stacked-chart points as long rows: t (s since the first start), bucket label, seconds."""
    tl = goodput.get("timeline") or {}
    names, rows = tl.get("buckets") or [], []
    for point in tl.get("points") or []:
        for i, name in enumerate(names):
            rows.append({"t": point[0], "bucket": LABELS[BUCKETS[[b.value for b in BUCKETS].index(name)]],
                         "seconds": point[i + 1], "order": i})
    return pd.DataFrame(rows, columns=["t", "bucket", "seconds", "order"])


def goodput_chart(frame: pd.DataFrame) -> Chart:
    """Cumulative seconds per bucket over the run, stacked, in the buckets' fixed colours."""
    spec = {
        "height": 240, "mark": {"type": "area", "interpolate": "step-after"},
        "encoding": {
            "x": {"field": "t", "type": "quantitative", "title": "seconds since the first start"},
            "y": {"field": "seconds", "type": "quantitative", "stack": "zero", "title": "seconds (cumulative)"},
            "color": {"field": "bucket", "type": "nominal",
                      "scale": {"domain": [LABELS[b] for b in BUCKETS], "range": [COLORS[b] for b in BUCKETS]},
                      "legend": {"title": None}},
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [{"field": "bucket"}, {"field": "t"}, {"field": "seconds", "format": ".1f"}],
        },
    }
    return Chart(frame, spec, title="Where the time went")


def render(ctx: Context) -> None:
    g = ctx.read(read.goodput, ctx.run_id)
    st.subheader("Goodput")
    if g is None:
        st.caption("no goodput ledger yet: the controller has booked no event of this run")
        return
    cols = st.columns(5)
    cols[0].metric("ETTR", "—" if g["ettr"] is None else f"{100 * g['ettr']:.1f} %",
                   help="productive seconds (steps kept) / wall seconds since the run's first start")
    cols[1].metric("ETTR (GPU-seconds)", "—" if g["ettr_gpu"] is None else f"{100 * g['ettr_gpu']:.1f} %")
    window = g.get("window_ettr")
    cols[2].metric(f"ETTR, last {g.get('window_s', 0) / 60:.0f} min", "—" if window is None else f"{100 * window:.1f} %")
    cols[3].metric("wall time", f"{g['wall_s']:.0f} s")
    cols[4].metric("steps lost", g["steps_lost"])
    frame = timeline_frame(g)
    if not frame.empty:
        show(st, goodput_chart(frame), key="goodput_chart")
    wall = g["wall_s"] or 1.0
    table = pd.DataFrame([{"bucket": LABELS[b], "seconds": round(g["seconds"].get(b.value, 0.0), 2),
                           "share": f"{100 * g['seconds'].get(b.value, 0.0) / wall:.2f} %",
                           "GPU-seconds": round(g["gpu_seconds"].get(b.value, 0.0), 1)}
                          for b in BUCKETS if g["seconds"].get(b.value, 0.0) > 0])
    st.dataframe(table, hide_index=True, width="stretch")
    unknown = g["seconds"].get("unknown", 0.0)
    if unknown > 0.01 * wall:
        st.warning(f"{unknown:.1f} s ({100 * unknown / wall:.1f} %) of this run no event explains (unknown)")
    costs = ctx.frame(read.goodput_costs, ctx.run_id, keys=COST_COLUMNS)
    if not costs.empty:
        st.markdown("**What each incident, restart and scale change cost**")
        costs["buckets"] = [", ".join(f"{LABELS[next(b for b in BUCKETS if b.value == k)]} {v['seconds']:.1f} s"
                                      for k, v in (bs or {}).items()) for bs in costs["buckets"]]
        st.dataframe(costs.drop(columns=["ts"]), hide_index=True, width="stretch")
