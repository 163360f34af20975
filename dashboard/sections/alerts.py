"""Alerts with their delivery status (the outbox), DLQ counts and flagged data."""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import derive
from cliffguard.dashboard.sections.context import Context

ALERT_COLUMNS = ["ts", "level", "action", "title", "endpoint", "delivery", "attempts", "last_error", "rule"]


def render(ctx: Context) -> None:
    st.subheader("Alerts and dead letters")
    st.markdown("**Alerts** (one row per endpoint; delivery from the outbox)")
    alerts = derive.alert_deliveries(ctx.read(read.alerts, ctx.run_id, limit=None))
    if alerts.empty:
        st.caption("no alerts for this run")
    else:
        shown = alerts[ALERT_COLUMNS].copy()
        shown["ts"] = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S") for t in shown["ts"]]
        st.dataframe(shown.iloc[::-1], hide_index=True, width="stretch")
        counts = alerts["delivery"].value_counts()
        st.caption(" · ".join(f"{k}: {v}" for k, v in counts.items()))
    left, right = st.columns(2)
    with left:
        st.markdown("**Dead-letter queue** (all runs)")
        dlq = ctx.frame(read.dlq_counts, keys=("topic", "reason", "count", "last_ts", "last_detail"))
        if dlq.empty:
            st.caption("no dead letters")
        else:
            st.metric("dead letters", f"{int(dlq['count'].sum()):,}")
            st.dataframe(dlq[["reason", "count", "topic", "last_detail"]], hide_index=True, width="stretch")
    with right:
        st.markdown("**Flagged data**")
        flags = ctx.frame(read.data_flags, ctx.run_id, limit=None, oldest_first=True,
                          keys=("step", "ts", "rule", "score", "sample_ids"))
        if flags.empty:
            st.caption("no samples flagged")
        else:
            shown = flags.assign(samples=[len(s or []) for s in flags["sample_ids"]])
            st.dataframe(shown[["step", "rule", "score", "samples"]], hide_index=True, width="stretch")
