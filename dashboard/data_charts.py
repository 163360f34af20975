"""The data page's charts (pure: frames in, Vega-Lite specs out): the live batch statistics of the
data watch over steps, each beside its baseline (``read.data_baseline``). Colours as on the rest of
the page: blue the measured value, grey the baseline."""

from __future__ import annotations

from typing import Any

import pandas as pd

from cliffguard.dashboard.charts import AMBER, BLUE, GREY, HEIGHT, PURPLE, RED, Chart, _clean

SHARES = {"dup": ("near-duplicates", AMBER), "garbled": ("garbled", RED), "pad": ("padding", PURPLE)}
"""The per-step shares drawn together: field -> (label, colour)."""


def _rule(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"data": {"values": [{"baseline": float(value)}]}, "mark": {"type": "rule", "color": GREY, "strokeDash": [4, 3]},
             "encoding": {"y": {"field": "baseline", "type": "quantitative"}}}]


def perplexity_chart(steps: pd.DataFrame, baseline: dict[str, Any] | None) -> Chart:
    """Each batch's mean log-perplexity under the reference model, the baseline's median dashed."""
    spec = {
        "height": HEIGHT,
        "layer": [
            {"mark": {"type": "line", "color": BLUE, "point": {"size": 12}},
             "encoding": {"x": {"field": "step", "type": "quantitative"},
                          "y": {"field": "ppl", "type": "quantitative", "title": "log-perplexity (nats/token)",
                                "scale": {"zero": False}},
                          "tooltip": [{"field": "step"}, {"field": "ppl", "format": ".3f"}]}},
            *_rule((baseline or {}).get("ppl")),
        ],
    }
    return Chart(_clean(steps[["step", "ppl"]].dropna()), spec, "batch log-perplexity (baseline median dashed)")


def shares_chart(steps: pd.DataFrame) -> Chart:
    """The per-step shares of near-duplicate, garbled and padding slots, one line each."""
    fields = [f for f in SHARES if f in steps and steps[f].notna().any()]
    long = steps.melt(id_vars=["step"], value_vars=fields, var_name="share", value_name="value").dropna()
    long["share"] = [SHARES[f][0] for f in long["share"]]
    spec = {
        "height": 200, "mark": {"type": "line", "interpolate": "step-after"},
        "encoding": {
            "x": {"field": "step", "type": "quantitative"},
            "y": {"field": "value", "type": "quantitative", "title": "share of the batch", "scale": {"domain": [0, 1]}},
            "color": {"field": "share", "type": "nominal",
                      "scale": {"domain": [SHARES[f][0] for f in fields], "range": [SHARES[f][1] for f in fields]}},
            "tooltip": [{"field": "step"}, {"field": "share"}, {"field": "value", "format": ".3f"}],
        },
    }
    return Chart(_clean(long), spec, "near-duplicate, garbled and padding shares per batch")


def drift_chart(windows: pd.DataFrame, baseline: dict[str, Any] | None) -> Chart:
    """Each window's token-distribution divergence from the baseline (the data_drift statistic)."""
    spec = {
        "height": 200,
        "layer": [
            {"mark": {"type": "bar", "color": BLUE, "opacity": 0.8},
             "encoding": {"x": {"field": "first_step", "type": "quantitative", "title": "step"},
                          "x2": {"field": "step"},
                          "y": {"field": "drift", "type": "quantitative", "title": "JS divergence (nats)"},
                          "tooltip": [{"field": "first_step"}, {"field": "step"}, {"field": "drift", "format": ".4f"}]}},
            *_rule((baseline or {}).get("drift")),
        ],
    }
    return Chart(_clean(windows[["first_step", "step", "drift"]].dropna()), spec,
                 "token drift per window against the baseline (its median dashed)")
