"""Hangs: each hang incident's culprit, the collective and the frame; the sequence table it was
named by (every rank's Flight Recorder numbers side by side); each rank's stacks, as the rank
sent them; and the restarted groups' node checks. Absent for a run that never hung."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard.sections.context import Context

TABLE_COLUMNS = ("rank", "node", "verdict", "reason", "enqueued", "completed", "in_flight", "frame", "stalled_s")
SHOWN = 3
"""The newest hang incidents shown."""


def hang_incidents(ctx: Context) -> list[dict[str, Any]]:
    return [i for i in ctx.read(read.incidents, ctx.run_id, limit=50) if i["rule"] == "hang"]


def headline(h: dict[str, Any]) -> str:
    inc = h["incident"]
    who = ", ".join(map(str, h["culprit"])) or "none named"
    nodes = f" on node {', '.join(h['nodes'])}" if h["nodes"] else ""
    return (f"life {h['life']}: culprit rank {who}{nodes} ({h['kind']}) · {h['collective'] or 'no collective'} · "
            f"{inc['outcome']}")


def stack_text(report: dict[str, Any]) -> str:
    """One rank's threads, innermost frame last, as its evidence carried them."""
    lines = []
    for t in report["data"].get("stacks", []):
        lines.append(f"--- {t['name']}{' (training thread)' if t.get('main') else ''}")
        lines.extend(t.get("frames", []))
    return "\n".join(lines)


def render(ctx: Context) -> None:
    incs = hang_incidents(ctx)
    if not incs:
        return
    st.subheader("Hangs")
    for inc in incs[:SHOWN]:
        h = ctx.read(read.hang_evidence, inc["id"])
        if h is None:
            continue
        st.markdown(f"**{headline(h)}**")
        if h["frame"]:
            st.caption(f"stuck in `{h['frame']}`")
        st.dataframe(pd.DataFrame(h["table"], columns=list(TABLE_COLUMNS)), hide_index=True, width="stretch",
                     key=f"hang_table_{inc['id']}")
        for rep in h["reports"]:
            with st.expander(f"rank {rep['rank']} · {rep['reason']} · {rep['data'].get('frame') or '?'}"):
                if rep["data"].get("error"):
                    st.text(rep["data"]["error"])
                st.code(stack_text(rep), language="text")
        for c in h["checks"]:
            d = c["data"]
            st.caption(f"node check of life {c['life']}: {'passed' if d['ok'] else 'failed'} in {d['seconds']:.2f} s"
                       f" — {d['detail']}")
