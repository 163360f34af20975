"""Chart builders (pure: frames in, Vega-Lite specs out), drawn with ``st.vega_lite_chart``.

Plain Vega-Lite dicts rather than Altair objects: Altair validates every spec against the JSON
schema on construction and again on serialisation, which cost ~5 s of CPU per page pass here;
a dict costs nothing, and live refreshes stay cheap. Each builder returns a ``Chart``: the main
frame (sent to the browser as Arrow) and the spec; small side tables (incident spans, rollbacks)
ride inline in their layers.

Colours are fixed per meaning across the page so an operator learns them once: blue = the loss
(and rank 0), grey = the healthy median, amber = warn, red = critical / rollback, green =
resumed / stable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

BLUE, GREY, AMBER, RED, GREEN, PURPLE = "#1f77b4", "#7f7f7f", "#f0a030", "#d62728", "#2ca02c", "#9467bd"
FADED_BLUE = "#aec7e8"
# abandoned (the run ended mid-recovery) is grey: nothing was decided, the run just stopped
OUTCOME_COLORS = {"open": AMBER, "resumed": GREEN, "rolled_back": RED, "halted": PURPLE, "abandoned": GREY}
STATE_COLORS = {
    "running": GREEN, "pausing": AMBER, "validating": "#bcbd22", "rolling_back": RED,
    "recovering": "#ff9896", "resuming": "#98df8a", "halted": PURPLE,
}
KIND_ORDER = ["memory", "incremental", "full"]
HEIGHT = 260

Spec = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Chart:
    data: pd.DataFrame
    spec: Spec
    title: str = ""
    """Shown above the chart by the page (a Vega-Lite title would eat into the chart's fixed height)."""


def loss_chart(bands: pd.DataFrame, spans: pd.DataFrame, rollbacks: pd.DataFrame, *, log_y: bool = False) -> Chart:
    """Loss with the sliding median, warn/critical bands, spikes, incident spans and rollbacks
    (``log_y``: a log axis, so a 10× spike does not flatten the healthy curve)."""
    # Bands of the branch that counts; an abandoned branch's loss is still drawn (faded).
    current = {"filter": "!datum.superseded"}
    y = {"field": "median", "type": "quantitative", "scale": {"type": "log"} if log_y else {"zero": False}}
    layers: list[Spec] = []
    if not spans.empty:
        layers.append({
            "data": {"values": _records(spans)},
            "mark": {"type": "rect", "opacity": 0.15},
            "encoding": {
                "x": {"field": "start", "type": "quantitative"}, "x2": {"field": "end"},
                "color": {"field": "outcome", "type": "nominal", "scale": _scale(OUTCOME_COLORS),
                          "legend": {"title": "incident"}},
                "tooltip": _tips("incident", "rule", "outcome", "start", "end", "rollback_to"),
            },
        })
    layers += [
        {"transform": [current], "mark": {"type": "area", "color": AMBER, "opacity": 0.13},
         "encoding": {"y": y, "y2": {"field": "warn"}}},
        {"transform": [current], "mark": {"type": "area", "color": RED, "opacity": 0.08},
         "encoding": {"y": {**y, "field": "warn"}, "y2": {"field": "crit"}}},
        {"transform": [current], "mark": {"type": "line", "color": RED, "strokeDash": [4, 3], "strokeWidth": 1},
         "encoding": {"y": {**y, "field": "crit"}}},
        {"transform": [current], "mark": {"type": "line", "color": AMBER, "strokeDash": [4, 3], "strokeWidth": 1},
         "encoding": {"y": {**y, "field": "warn"}}},
        {"transform": [current], "mark": {"type": "line", "color": GREY, "strokeWidth": 1.5},
         "encoding": {"y": {**y, "field": "median"}}},
        {"mark": {"type": "line", "strokeWidth": 1.6},
         # drag to pan, wheel to zoom along the steps
         "params": [{"name": "zoom", "select": {"type": "interval", "encodings": ["x"]}, "bind": "scales"}],
         "encoding": {
             "y": {**y, "field": "loss_plot", "title": "loss"},
             "detail": {"field": "branch", "type": "nominal"},
             "color": {"condition": {"test": "datum.superseded", "value": FADED_BLUE}, "value": BLUE},
             "tooltip": _tips("step", "loss", "median", "sigmas", "level", "lr_scale"),
         }},
        {"transform": [{"filter": "datum.level != 'ok'"}],
         "mark": {"type": "point", "filled": True, "size": 80, "shape": "triangle-up"},
         "encoding": {
             "y": {**y, "field": "loss_plot"},
             "color": {"field": "level", "type": "nominal",
                       "scale": {"domain": ["warn", "critical"], "range": [AMBER, RED]}, "legend": {"title": "spike"}},
             "tooltip": _tips("step", "loss", "sigmas", "level"),
         }},
    ]
    if not rollbacks.empty:
        rules = rollbacks.assign(label=[f"rollback {f} → {t}" for f, t in zip(rollbacks["from_step"], rollbacks["to_step"], strict=True)])
        values = _records(rules)
        layers.append({"data": {"values": values}, "mark": {"type": "rule", "color": RED, "strokeWidth": 2},
                       "encoding": {"x": {"field": "to_step", "type": "quantitative"}, "tooltip": _tips("label", "from_step")}})
        layers.append({"data": {"values": values},
                       "mark": {"type": "text", "color": RED, "align": "left", "dx": 4, "fontWeight": "bold", "y": 10},
                       "encoding": {"x": {"field": "to_step", "type": "quantitative"}, "text": {"field": "label"}}})
    spec = {
        "height": 340,
        "encoding": {"x": {"field": "step", "type": "quantitative", "title": "step"}},
        "layer": layers,
        "resolve": {"scale": {"color": "independent"}},
    }
    return Chart(_clean(bands), spec)


def lr_chart(bands: pd.DataFrame) -> Chart:
    """Learning rate (left axis, log when positive) and lr_scale (right axis, stepped); one line
    per branch, an abandoned branch faded, as on the loss chart."""
    lr = pd.to_numeric(bands["lr"], errors="coerce").dropna()
    scale_type = "log" if len(lr) and (lr > 0).all() else "linear"
    faded = {"condition": {"test": "datum.superseded", "value": 0.35}, "value": 1.0}
    spec = {
        "height": HEIGHT,
        "encoding": {"x": {"field": "step", "type": "quantitative"}, "detail": {"field": "branch", "type": "nominal"},
                     "opacity": faded},
        "layer": [
            {"mark": {"type": "line", "color": BLUE},
             "encoding": {"y": {"field": "lr", "type": "quantitative", "title": "learning rate",
                                "scale": {"type": scale_type}, "axis": {"format": ".0e", "titleColor": BLUE}},
                          "tooltip": _tips("step", "lr", "lr_scale")}},
            {"mark": {"type": "line", "color": RED, "interpolate": "step-after", "strokeDash": [6, 3]},
             "encoding": {"y": {"field": "lr_scale", "type": "quantitative", "title": "lr_scale",
                                "scale": {"domain": [0, 1.05]}, "axis": {"titleColor": RED}}}},
        ],
        "resolve": {"scale": {"y": "independent"}},
    }
    return Chart(_clean(bands[["step", "lr", "lr_scale", "branch", "superseded"]]), spec)


def per_rank_chart(df: pd.DataFrame, field: str, title: str, fmt: str = "") -> Chart:
    """One line per rank; a straggler's line sits apart from the others."""
    y: Spec = {"field": field, "type": "quantitative", "title": None}
    if fmt:
        y["axis"] = {"format": fmt}
    spec = {
        "height": 220, "mark": {"type": "line", "strokeWidth": 1.3},
        "encoding": {
            "x": {"field": "step", "type": "quantitative"}, "y": y,
            "color": {"field": "rank", "type": "nominal", "scale": {"scheme": "tableau10"}},
            "tooltip": [{"field": "step", "type": "quantitative"}, {"field": "rank", "type": "nominal"},
                        {"field": field, "type": "quantitative", "format": fmt or ".4g"}],
        },
    }
    return Chart(_clean(df[["step", "rank", field]]), spec, title)


def rank_summary_chart(summary: pd.DataFrame, field: str, title: str, fmt: str = "") -> Chart:
    """A bar per rank (mean over the window), the straggler highlighted in red."""
    y: Spec = {"field": field, "type": "quantitative", "title": None}
    if fmt:
        y["axis"] = {"format": fmt}
    spec = {
        "height": 220, "mark": {"type": "bar"},
        "encoding": {
            "x": {"field": "rank", "type": "nominal", "axis": {"labelAngle": 0}}, "y": y,
            "color": {"condition": {"test": "datum.straggler", "value": RED}, "value": BLUE},
            "tooltip": [{"field": "rank", "type": "nominal"}, {"field": field, "type": "quantitative", "format": fmt or ".4g"},
                        {"field": "straggler", "type": "nominal"}],
        },
    }
    return Chart(_clean(summary), spec, title)


def hist_heatmap(cells: pd.DataFrame, layer: str) -> Chart:
    """Counts per log2 |g| bin over steps for one layer (colour = log10 of the count)."""
    spec = {
        "height": HEIGHT, "mark": {"type": "rect"},
        "encoding": {
            "x": {"field": "step", "type": "ordinal", "axis": {"labelOverlap": True}},
            "y": {"field": "bin", "type": "ordinal", "title": "log2 |g| (bin lower edge)", "sort": "descending"},
            "color": {"field": "log_count", "type": "quantitative", "title": "log10 count", "scale": {"scheme": "viridis"}},
            "tooltip": _tips("step", "bin", "count"),
        },
    }
    return Chart(_clean(cells), spec, f"gradient histogram of {layer} (counts per log2 bin)")


def layer_norm_heatmap(norms: pd.DataFrame) -> Chart:
    """Per-layer gradient norm over steps (colour = log10 norm): one layer blowing up stands out."""
    df = norms.assign(log_norm=np.log10(norms["norm"].astype(float).clip(lower=1e-12)))
    spec = {
        "height": HEIGHT, "mark": {"type": "rect"},
        "encoding": {
            "x": {"field": "step", "type": "ordinal", "axis": {"labelOverlap": True}},
            "y": {"field": "layer", "type": "nominal", "title": None, "sort": None},
            "color": {"field": "log_norm", "type": "quantitative", "title": "log10 norm", "scale": {"scheme": "inferno"}},
            "tooltip": [{"field": "step", "type": "ordinal"}, {"field": "layer", "type": "nominal"},
                        {"field": "norm", "type": "quantitative", "format": ".3g"}],
        },
    }
    return Chart(_clean(df), spec, "per-layer gradient norm")


def checkpoint_timeline(ckpts: pd.DataFrame) -> Chart:
    """A mark per checkpoint: row = kind, colour = stable / verified / unverified."""
    df = ckpts.assign(
        state=["stable" if s else "verified" if v else "unverified"
               for s, v in zip(ckpts["stable"], ckpts["verified"], strict=True)],
        mb=ckpts["bytes"] / 1e6,
    )[["step", "kind", "state", "mb", "seconds", "path"]]
    spec = {
        "height": 150, "mark": {"type": "point", "filled": True, "size": 120},
        "encoding": {
            "x": {"field": "step", "type": "quantitative"},
            "y": {"field": "kind", "type": "nominal", "sort": KIND_ORDER, "title": None},
            "color": {"field": "state", "type": "nominal",
                      "scale": {"domain": ["stable", "verified", "unverified"], "range": [GREEN, BLUE, GREY]}},
            "shape": {"field": "kind", "type": "nominal", "sort": KIND_ORDER, "legend": None},
            "tooltip": _tips("step", "kind", "state", "mb", "seconds", "path"),
        },
    }
    return Chart(_clean(df), spec)


def incident_timeline(segments: pd.DataFrame) -> Chart:
    """Gantt of each incident's recovery states, in seconds since the incident opened."""
    spec = {
        "height": {"step": 36},
        "mark": {"type": "bar", "height": 22, "cornerRadius": 2},
        "encoding": {
            "x": {"field": "start_s", "type": "quantitative", "title": "seconds since the incident opened"},
            "x2": {"field": "end_s"},
            "y": {"field": "incident", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 360}},
            "color": {"field": "state", "type": "nominal", "scale": _scale(STATE_COLORS),
                      "legend": {"title": "state"}},
            "tooltip": _tips("incident", "state", "step", "reason", "seconds"),
        },
    }
    return Chart(_clean(segments), spec)


def memory_chart(df: pd.DataFrame) -> Chart:
    """Allocated (solid) and reserved (dashed) memory per rank, in MiB."""
    long = df.melt(id_vars=["step", "rank"], value_vars=["mem_allocated", "mem_reserved"], var_name="kind", value_name="bytes")
    long["MiB"] = long["bytes"].astype(float) / 2**20
    spec = {
        "height": 220, "mark": {"type": "line"},
        "encoding": {
            "x": {"field": "step", "type": "quantitative"},
            "y": {"field": "MiB", "type": "quantitative", "title": "MiB"},
            "color": {"field": "rank", "type": "nominal", "scale": {"scheme": "tableau10"}},
            "strokeDash": {"field": "kind", "type": "nominal", "legend": {"title": None}},
            "tooltip": _tips("step", "rank", "kind", "MiB"),
        },
    }
    return Chart(_clean(long[["step", "rank", "kind", "MiB"]]), spec, "memory: allocated (solid) / reserved (dashed)")


def scale_chart(timeline: pd.DataFrame, lr: pd.DataFrame) -> Chart:
    """World size (stepped, left axis), global batch (stepped, dashed, middle) and learning rate
    (right axis) by step; a rule at each scale change. ``timeline``: step, world, global_batch
    (one row per change, the last row repeated at the final step); ``lr``: step, lr."""
    changes = timeline.iloc[1:-1] if len(timeline) > 2 else timeline.iloc[0:0]
    x = {"field": "step", "type": "quantitative"}
    spec = {
        "height": 220,
        "layer": [
            {"mark": {"type": "line", "color": PURPLE, "interpolate": "step-after", "strokeWidth": 2.5},
             "encoding": {"x": x, "y": {"field": "world", "type": "quantitative", "title": "world size",
                                        "axis": {"titleColor": PURPLE, "tickMinStep": 1}},
                          "tooltip": _tips("step", "world", "global_batch")}},
            {"mark": {"type": "line", "color": GREEN, "interpolate": "step-after", "strokeDash": [6, 3]},
             "encoding": {"x": x, "y": {"field": "global_batch", "type": "quantitative", "title": "global batch",
                                        "axis": {"titleColor": GREEN, "orient": "right"}}}},
            {"data": {"values": _records(lr[["step", "lr"]].dropna())}, "mark": {"type": "line", "color": BLUE},
             "encoding": {"x": x, "y": {"field": "lr", "type": "quantitative", "title": "learning rate",
                                        "axis": {"format": ".0e", "titleColor": BLUE, "orient": "right",
                                                 "offset": 50}},
                          "tooltip": _tips("step", "lr")}},
            {"data": {"values": _records(changes[["step"]])}, "mark": {"type": "rule", "color": AMBER},
             "encoding": {"x": x}},
        ],
        "resolve": {"scale": {"y": "independent"}},
    }
    return Chart(_clean(timeline[["step", "world", "global_batch"]]), spec,
                 "world size (purple), global batch (green, dashed), learning rate (blue)")


def _scale(colors: dict[str, str]) -> Spec:
    return {"domain": list(colors), "range": list(colors.values())}


def _tips(*fields: str) -> list[Spec]:
    return [{"field": f} for f in fields]


def _clean(df: pd.DataFrame) -> pd.DataFrame:
    """Arrow-friendly copy: object columns of mixed content become strings."""
    out = df.reset_index(drop=True).copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(lambda v: v if v is None or isinstance(v, (str, bool, int, float)) else str(v))
    return out


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Inline values: JSON-safe (NaN -> null, numpy scalars -> Python)."""
    rows = []
    for rec in df.to_dict(orient="records"):
        rows.append({k: _plain(v) for k, v in rec.items()})
    return rows


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
