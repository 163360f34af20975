"""A run's post-mortem as one JSON-able dict, read through the store's read API only: the loss
curve with its incidents, the goodput breakdown and its stacked time chart, each incident's
timeline, class, remedy and cost, the restarts and scale changes, MFU and the bottleneck the MFU
rule named, the checkpoints and the checkpoint-interval counterfactual."""

from __future__ import annotations

import math
import time
from typing import Any

from sqlalchemy.orm import Session

from cliffguard.controller.goodput.buckets import BUCKETS, COLORS, LABELS
from cliffguard.controller.store import read

MAX_POINTS = 1500
MFU_STEPS = 20_000
"""The MFU curve and its mean cover the newest this many step rows."""
RUN_KEYS = ("id", "status", "recovery_state", "world_size", "last_step", "started_at", "ended_at", "error",
            "lr_scale", "lr_scale_applied")


def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else None


def report_data(session: Session, run_id: str, *, now: float | None = None) -> dict[str, Any] | None:
    """Everything the report shows, or None for a run the store does not hold."""
    run = read.get_run(session, run_id)
    if run is None:
        return None
    goodput = read.goodput(session, run_id)
    costs = read.goodput_costs(session, run_id)
    by_key = {c["key"]: c for c in costs}
    incidents = []
    for inc in read.incidents(session, run_id, limit=None)[::-1]:
        detail = read.incident_detail(session, inc["id"]) or inc
        cost = by_key.get(inc["id"])
        incidents.append({
            **{k: inc[k] for k in ("id", "rule", "level", "outcome", "spike_step", "onset_step", "rollback_to",
                                   "lr_scale", "opened_at", "closed_at")},
            "cause": (inc.get("evidence") or {}).get("cause"),
            "remedy": inc["outcome"],
            "cost": _cost(cost),
            "timeline": [{"ts": t["ts"], "step": t["step"], "from": t["from_state"], "to": t["to_state"],
                          "reason": t["reason"]} for t in detail.get("transitions", [])],
            "commands": [{"type": c["type"], "status": c["status"], "issued_at": c["issued_at"],
                          "acked_at": c.get("acked_at"), "detail": c.get("ack_detail")}
                         for c in detail.get("commands", [])],
        })
    steps = read.step_rows(session, run_id, newest=MFU_STEPS)
    stride = max(1, len(steps) // MAX_POINTS)
    mfu_alerts = [a for a in read.alerts(session, run_id, limit=None) if a["rule"] == "mfu_low"]
    return {
        "run": {k: run.get(k) for k in RUN_KEYS},
        "generated_at": time.time() if now is None else now,
        "buckets": [{"name": b.value, "label": LABELS[b], "color": COLORS[b]} for b in BUCKETS],
        "goodput": goodput,
        "loss": [{"step": r["step"], "loss": _finite(r["loss"]), "ts": r["ts"]}
                 for r in read.loss_curve(session, run_id, max_points=MAX_POINTS)],
        "mfu": {
            "series": [{"step": r["step"], "mfu": _finite(r.get("mfu"))} for r in steps[::stride]],
            "mean": _mean([r.get("mfu") for r in steps]),
            "bottleneck": [{"ts": a["ts"], "title": a["title"], "cause": (a.get("evidence") or {}).get("cause"),
                            "detail": (a.get("evidence") or {}).get("cause_detail")} for a in mfu_alerts[::-1]],
        },
        "incidents": incidents,
        "restarts": [{"key": c["key"], "kind": c["kind"], "ts": c["ts"], "cost": _cost(c)}
                     for c in costs if c["kind"] != "incident"],
        "remedies": read.remedy_costs(session, run_id=run_id),
        "checkpoints": [{k: c[k] for k in ("step", "kind", "verified", "stable", "bytes", "seconds", "ts", "detail")}
                        for c in read.checkpoints(session, run_id)[::-1]],
        "elastic": [{k: e[k] for k in ("step", "direction", "from_world", "to_world", "global_batch", "steps_lost",
                                       "seconds_lost", "ts")} for e in read.elastic_events(session, run_id)],
    }


def _cost(c: dict[str, Any] | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"seconds": c["seconds"], "gpu_seconds": c["gpu_seconds"], "steps_lost": c["steps_lost"],
            "buckets": c["buckets"]}


def _mean(values: list[Any]) -> float | None:
    xs = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None
