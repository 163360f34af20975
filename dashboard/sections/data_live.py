"""The run's live data statistics (the data watch, agent/data_watch/): each batch's perplexity,
duplicate, garbled and padding shares over steps, the token drift per window against the run's
baseline, the data rules' alerts and the latest window's outlier sequences by sample id."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import data_charts
from cliffguard.dashboard.sections.context import Context, show

STEP_KEYS = ("step", "rank", "window", "dup", "pad", "garbled", "ppl")
WINDOW_KEYS = ("first_step", "step", "rank", "batches", "sequences", "tokens", "pad_share", "dup_share", "garbled",
               "ppl", "dropped", "drift", "outliers")
OUTLIER_COLUMNS = ["step", "sample_id", "reason", "score"]


def render(ctx: Context) -> None:
    st.subheader("Live batch statistics")
    windows = ctx.frame(read.data_windows, ctx.run_id, limit=500, keys=WINDOW_KEYS)
    if windows.empty:
        st.info("no data statistics for this run: the data watch (`[agent.data_watch]`) sends them from the "
                "watching ranks every `every` steps")
        return
    base = ctx.read(read.data_baseline, ctx.run_id)
    steps = ctx.frame(read.data_steps, ctx.run_id, limit=500, keys=STEP_KEYS)
    latest = windows.iloc[-1]
    state = (f"baseline steps {base['steps'][0]}-{base['steps'][1]}" if base and base["complete"]
             else f"baseline filling ({base['windows'] if base else 0} windows so far)")
    st.caption(f"rank {int(latest['rank'])} · {state} · newest window steps {int(latest['first_step'])}-{int(latest['step'])}")
    cols = st.columns(5)
    cols[0].metric("log-perplexity", _fmt(latest["ppl"]), _delta(latest["ppl"], base, "ppl"))
    cols[1].metric("near-duplicates", _pct(latest["dup_share"]))
    cols[2].metric("garbled", _pct(latest["garbled"]))
    cols[3].metric("padding", _pct(latest["pad_share"]))
    cols[4].metric("token drift", _fmt(latest["drift"], ".4f"))
    if int(windows["dropped"].fillna(0).sum()):
        st.warning(f"the watcher skipped {int(windows['dropped'].sum())} batches it could not keep up with")
    left, right = st.columns(2)
    if steps["ppl"].notna().any():
        show(left, data_charts.perplexity_chart(steps, base), key="data_ppl")
    show(right, data_charts.shares_chart(steps), key="data_shares")
    show(st, data_charts.drift_chart(windows, base), key="data_drift")
    alerts = [a for a in ctx.read(read.alerts, ctx.run_id, limit=None) if str(a["rule"]).startswith("data_")]
    st.markdown(f"**Data alerts** ({len(alerts)})")
    if alerts:
        st.dataframe(pd.DataFrame([{"rule": a["rule"], "level": a["level"], "title": a["title"],
                                    "samples": ", ".join(map(str, (a.get("evidence") or {}).get("window", {})
                                                             .get("sample_ids", [])[:12]))} for a in alerts]),
                     hide_index=True, width="stretch", key="data_alerts")
    outliers = pd.DataFrame(latest["outliers"] or [], columns=OUTLIER_COLUMNS)
    st.markdown("**Outlier sequences of the newest window** (by sample id)")
    st.dataframe(outliers, hide_index=True, width="stretch", key="data_outliers")


def _fmt(value: object, spec: str = ".3f") -> str:
    return "–" if value is None or pd.isna(value) else format(float(value), spec)


def _pct(value: object) -> str:
    return "–" if value is None or pd.isna(value) else f"{100 * float(value):.1f} %"


def _delta(value: object, base: dict | None, key: str) -> str | None:
    if base is None or base.get(key) is None or value is None or pd.isna(value):
        return None
    return f"{float(value) - base[key]:+.3f} vs baseline"
