"""Pure reshaping of what ``controller.store.read`` returns into what the charts draw (no
Streamlit, no SQL), and the columns each section frames the read API's rows in."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

STRAGGLER_RATIO = 1.25
"""A rank whose mean step time is this much above the median of the others is a straggler."""

INCIDENT_COLUMNS = ("id", "opened_at", "closed_at", "rule", "level", "spike_step", "onset_step", "outcome",
                    "rollback_to", "lr_scale", "evidence")
TRANSITION_COLUMNS = ("incident_id", "ts", "step", "from_state", "to_state", "reason", "evidence")
CHECKPOINT_COLUMNS = ("step", "kind", "verified", "stable", "stable_reason", "bytes", "seconds", "path", "sha256", "ts",
                      "detail")
ALERT_DELIVERY_COLUMNS = ("id", "ts", "level", "rule", "title", "action", "suppressed", "incident_id",
                          "endpoint", "delivery", "attempts", "last_error", "delivered_at")


def incident_spans(incidents: pd.DataFrame, transitions: pd.DataFrame) -> pd.DataFrame:
    """Step span of each incident: from its onset (or spike) step to its last transition's step."""
    rows = []
    for inc in incidents.itertuples(index=False):
        start = inc.onset_step if _is_num(inc.onset_step) else inc.spike_step
        steps = transitions.loc[transitions["incident_id"] == inc.id, "step"].dropna() if len(transitions) else []
        end = max([int(inc.spike_step), *(int(s) for s in steps)]) + 1
        rows.append({
            "incident": inc.id[:8], "rule": inc.rule, "outcome": inc.outcome, "start": int(start), "end": end,
            "rollback_to": inc.rollback_to if _is_num(inc.rollback_to) else None,
        })
    return pd.DataFrame(rows, columns=["incident", "rule", "outcome", "start", "end", "rollback_to"])


def state_segments(incidents: pd.DataFrame, transitions: pd.DataFrame, now: float) -> pd.DataFrame:
    """Each transition's target state as a bar until the next transition of the same incident
    (the last one until the incident closed, or ``now`` while it is open; 'running' gets a sliver).
    Times are seconds since the incident's first transition; ``incident`` is a readable label."""
    rows = []
    closed = dict(zip(incidents["id"], incidents["closed_at"], strict=True)) if len(incidents) else {}
    labels = {
        i.id: f"step {i.spike_step} · {i.rule} · {i.outcome.replace('_', ' ')} · {i.id[:6]}"
        for i in incidents.itertuples(index=False)
    } if len(incidents) else {}
    for inc_id, group in transitions.dropna(subset=["incident_id"]).groupby("incident_id", sort=False):
        group = group.sort_values("ts")
        ts = list(group["ts"])
        t0 = ts[0]
        for i, tr in enumerate(group.itertuples(index=False)):
            if i + 1 < len(ts):
                end = ts[i + 1]
            else:
                close = closed.get(inc_id)
                end = close if _is_num(close) and close > tr.ts else (tr.ts + 1.0 if tr.to_state == "running" else now)
            rows.append({
                "incident": labels.get(inc_id, str(inc_id)[:8]), "state": tr.to_state, "start_s": tr.ts - t0,
                "end_s": max(end, tr.ts + 0.2) - t0, "seconds": float(end - tr.ts), "step": tr.step, "reason": tr.reason,
            })
    return pd.DataFrame(rows, columns=["incident", "state", "start_s", "end_s", "seconds", "step", "reason"])


def rank_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per-rank means over the window plus ratios and a straggler flag (step time far above the rest)."""
    cols = ["rank", "step_time_s", "mfu", "tokens_per_s", "data_wait_ratio", "comm_exposed_ratio", "straggler"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby("rank").agg(
        step_time_s=("step_time_s", "mean"), mfu=("mfu", "mean"), tokens_per_s=("tokens_per_s", "mean"),
        data_wait_s=("data_wait_s", "sum"), comm_exposed_s=("comm_exposed_s", "sum"), total=("step_time_s", "sum"),
    ).reset_index()
    total = g["total"].where(g["total"] > 0)
    g["data_wait_ratio"] = g["data_wait_s"] / total
    g["comm_exposed_ratio"] = g["comm_exposed_s"] / total
    flags = []
    for i, t in enumerate(g["step_time_s"]):
        others = g["step_time_s"].drop(index=i)
        flags.append(bool(len(others) and others.median() > 0 and t > STRAGGLER_RATIO * others.median()))
    g["straggler"] = flags
    return g[cols]


def with_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per-row data-wait and comm-exposed fractions of the step time."""
    t = df["step_time_s"].where(df["step_time_s"] > 0)
    return df.assign(data_wait_ratio=df["data_wait_s"] / t, comm_exposed_ratio=df["comm_exposed_s"] / t)


def hist_cells(hists: list[dict[str, Any]], layer: str) -> pd.DataFrame:
    """Long-form heatmap cells (step, bin, count, log_count) of one layer; bin = log2 of the lower edge."""
    rows = []
    for h in hists:
        entry = (h["layers"] or {}).get(layer)
        if not entry:
            continue
        edges = h["edges"]
        for i, count in enumerate(entry.get("counts", [])):
            lower = edges[i] if i < len(edges) else edges[-1]
            rows.append((h["step"], round(math.log2(lower), 1) if lower > 0 else -math.inf, int(count)))
    df = pd.DataFrame(rows, columns=["step", "bin", "count"])
    df["log_count"] = np.log10(df["count"].clip(lower=0) + 1)
    return df


def hist_layers(hists: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for h in hists:
        for name in h["layers"] or {}:
            seen.setdefault(name, None)
    return list(seen)


def hist_layer_norms(hists: list[dict[str, Any]]) -> pd.DataFrame:
    """(step, layer, norm) from the histograms, for runs whose step rows carry no per-layer norms."""
    rows = [(h["step"], name, float(e.get("norm", math.nan))) for h in hists for name, e in (h["layers"] or {}).items()]
    return pd.DataFrame(rows, columns=["step", "layer", "norm"])


def layer_norm_rows(steps: list[dict[str, Any]]) -> pd.DataFrame:
    """(step, layer, norm) long form of step rows' per-layer grad norms (a missing norm is NaN)."""
    rows = [(r["step"], name, math.nan if v is None else float(v))
            for r in steps for name, v in (r["layer_grad_norms"] or {}).items()]
    return pd.DataFrame(rows, columns=["step", "layer", "norm"])


def alert_deliveries(alerts: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (alert, endpoint), oldest alert first, from ``read.alerts`` (newest first, with
    deliveries): ``delivery`` is the outbox status, "suppressed", or "no endpoint" (endpoint "-")."""
    rows = []
    for a in reversed(alerts):
        base = {k: a[k] for k in ALERT_DELIVERY_COLUMNS[:8]}
        for d in a["deliveries"] or [None]:
            status = "no endpoint" if d is None else d["status"]
            rows.append({**base, "endpoint": "-" if d is None else d["target"],
                         "delivery": "suppressed" if a["suppressed"] else status,
                         "attempts": None if d is None else d["attempts"],
                         "last_error": None if d is None else d["last_error"],
                         "delivered_at": None if d is None else d["delivered_at"]})
    return pd.DataFrame(rows, columns=list(ALERT_DELIVERY_COLUMNS))


def stable_targets(ckpts: pd.DataFrame) -> list[int]:
    """Steps an operator may roll back to: verified and stable checkpoints, newest first."""
    if ckpts.empty:
        return []
    ok = ckpts[ckpts["verified"].astype(bool) & ckpts["stable"].astype(bool)]
    return sorted({int(s) for s in ok["step"]}, reverse=True)


def age(seconds: float) -> str:
    """'4s', '3m', '2h', '5d': how long ago, for humans."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not (isinstance(value, float) and math.isnan(value))
