"""Alerts with their delivery status (the outbox), DLQ counts and flagged data."""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from dashboard import queries
from dashboard.sections.context import Context


def render(ctx: Context) -> None:
    st.subheader("Alerts and dead letters")
    left, right = st.columns([3, 2])
    with left:
        st.markdown("**Alerts** (delivery per endpoint)")
        alerts = ctx.read(queries.alerts_with_delivery, ctx.run_id)
        if alerts.empty:
            st.caption("no alerts for this run")
        else:
            shown = alerts[["ts", "level", "rule", "title", "action", "endpoint", "delivery", "attempts", "last_error"]].copy()
            shown["ts"] = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S") for t in shown["ts"]]
            st.dataframe(shown.iloc[::-1], hide_index=True, width="stretch")
            counts = alerts["delivery"].value_counts()
            st.caption(" · ".join(f"{k}: {v}" for k, v in counts.items()))
    with right:
        st.markdown("**Dead-letter queue** (all runs)")
        dlq = ctx.read(queries.dlq_counts)
        if dlq.empty:
            st.caption("no dead letters")
        else:
            st.metric("dead letters", f"{int(dlq['count'].sum()):,}")
            st.dataframe(dlq[["reason", "count", "topic", "last_detail"]], hide_index=True, width="stretch")
        flags = ctx.read(queries.data_flags, ctx.run_id)
        st.markdown("**Flagged data**")
        if flags.empty:
            st.caption("no samples flagged")
        else:
            shown = flags.assign(samples=[len(s or []) for s in flags["sample_ids"]])
            st.dataframe(shown[["step", "rule", "score", "samples"]], hide_index=True, width="stretch")
