"""Incident timeline: each incident's recovery states over time, with its evidence — the
rule's window stats, the validation numbers, and the commands sent with their acks."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

from cliffguard.controller.store import read
from cliffguard.dashboard import charts, derive
from cliffguard.dashboard.incident_cause import cause_line, rerun_table
from cliffguard.dashboard.sections.context import Context, show

OUTCOME_BADGES = {"open": ":orange[**open**]", "resumed": ":green[**resumed**]", "rolled_back": ":red[**rolled back**]",
                  "halted": ":violet[**halted**]", "abandoned": ":gray[**abandoned**]", "cured": ":green[**cured**]",
                  "restarted": ":blue[**restarted**]", "requeued": ":blue[**requeued**]",
                  "shrunk": ":blue[**shrunk**]"}
COMMAND_COLUMNS = ("id", "incident_id", "type", "args", "source", "status", "ack_detail", "issued_at", "acked_at",
                   "attempt")


def render(ctx: Context) -> None:
    st.subheader("Incidents")
    incs = ctx.frame(read.incidents, ctx.run_id, limit=None, keys=derive.INCIDENT_COLUMNS, oldest_first=True)
    trans = ctx.frame(read.transitions, ctx.run_id, limit=None, keys=derive.TRANSITION_COLUMNS)
    if incs.empty:
        st.success("no incidents in this run")
        return
    segments = derive.state_segments(incs, trans, time.time())
    if not segments.empty:
        show(st, charts.incident_timeline(segments), key="incident_timeline")
    cmds = ctx.frame(read.commands, ctx.run_id, limit=None, keys=COMMAND_COLUMNS, oldest_first=True)
    vals = ctx.frame(read.validations, ctx.run_id, limit=None, keys=("step", "ts", "cmd", "val_loss", "batches"))
    for inc in reversed(list(incs.itertuples(index=False))):
        title = (f"{OUTCOME_BADGES.get(inc.outcome, inc.outcome)} · {inc.rule} ({inc.level}) at step {inc.spike_step}"
                 + (f" → rolled back to {int(inc.rollback_to)}" if derive._is_num(inc.rollback_to) else "")
                 + (f", lr_scale {inc.lr_scale:g}" if derive._is_num(inc.lr_scale) else "")
                 + f" · {inc.id[:8]}")
        with st.expander(title, expanded=inc.outcome == "open"):
            _cause(inc.rule, inc.evidence or {})
            _evidence(inc.evidence or {})
            _data(ctx, inc)
            inc_trans = trans[trans["incident_id"] == inc.id]
            if len(inc_trans):
                st.markdown("**Transitions**")
                st.dataframe(_with_time(inc_trans[["ts", "step", "from_state", "to_state", "reason"]]),
                             hide_index=True, width="stretch")
            inc_cmds = cmds[cmds["incident_id"] == inc.id]
            if len(inc_cmds):
                st.markdown("**Commands and acks**")
                st.dataframe(_with_time(inc_cmds[["issued_at", "type", "args", "source", "status", "ack_detail", "acked_at"]],
                                        col="issued_at"), hide_index=True, width="stretch")
            inc_vals = vals[vals["cmd"].isin(set(inc_cmds["id"]))] if len(vals) else vals
            if len(inc_vals):
                st.markdown("**Validation**")
                st.dataframe(inc_vals[["step", "val_loss", "batches", "cmd"]], hide_index=True, width="stretch")
    others = cmds[cmds["incident_id"].isna()] if len(cmds) else cmds
    if len(others):
        with st.expander(f"commands outside incidents ({len(others)})"):
            st.dataframe(_with_time(others[["issued_at", "type", "args", "source", "status", "ack_detail"]], col="issued_at"),
                         hide_index=True, width="stretch")


def _cause(rule: str, ev: dict[str, Any]) -> None:
    """The triage ladder's cause and remedy, and each re-run's loss per rank (dashboard/incident_cause.py)."""
    line = cause_line(rule, ev)
    if line is None:
        return
    st.markdown(line)
    table = rerun_table(ev)
    if table is not None:
        st.markdown("**Re-runs: loss per rank**")
        st.dataframe(table, hide_index=True, width="stretch")


def _evidence(ev: dict[str, Any]) -> None:
    """The rule's numbers first (median, σ, how many σ), then the rest as JSON."""
    window = ev.get("window") if isinstance(ev.get("window"), dict) else ev
    if ev.get("message"):
        st.caption(str(ev["message"]))
    picks = [(k, window.get(k)) for k in ("loss", "median", "sigma", "sigmas", "n") if window.get(k) is not None]
    if picks:
        cols = st.columns(len(picks))
        for col, (k, v) in zip(cols, picks, strict=True):
            col.metric(k if k != "sigmas" else "σ above median", f"{v:.4g}" if isinstance(v, float) else str(v))
    with st.popover("evidence (JSON)"):
        st.json(ev)


def _data(ctx: Context, inc: Any) -> None:
    """The batch statistics of the incident's steps beside the baseline (``read.data_evidence``)."""
    onset = int(inc.onset_step) if derive._is_num(inc.onset_step) else int(inc.spike_step)
    data = ctx.read(read.data_evidence, ctx.run_id, onset, int(inc.spike_step))
    if not data or not data["steps"]:
        return
    base = data["baseline"] or {}
    rows = [{"step": "baseline", **{k: base.get(k) for k in ("ppl", "dup", "garbled", "pad")}},
            *({"step": str(r["step"]), **{k: r[k] for k in ("ppl", "dup", "garbled", "pad")}} for r in data["steps"])]
    st.markdown(f"**Batch statistics of steps {onset}-{int(inc.spike_step)}** (rank {data['rank']}; baseline: "
                f"medians of steps {base.get('steps', ['?', '?'])[0]}-{base.get('steps', ['?', '?'])[1]})")
    st.dataframe(pd.DataFrame(rows, columns=["step", "ppl", "dup", "garbled", "pad"]), hide_index=True, width="stretch")
    named = [o for w in data["windows"] for o in w["outliers"] if onset <= o[0] <= int(inc.spike_step)
             and o[2] != "novelty"]
    if named:
        st.caption("outlier sequences: " + ", ".join(f"{o[1]} ({o[2]} at step {o[0]})" for o in named[:12]))


def _with_time(df: pd.DataFrame, col: str = "ts") -> pd.DataFrame:
    out = df.copy()
    out[col] = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S") if pd.notna(t) else "" for t in out[col]]
    if "acked_at" in out:
        out["acked_at"] = [datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S") if pd.notna(t) else "" for t in out["acked_at"]]
    return out
