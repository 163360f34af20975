"""A ledger's figures as plain data: what the store's ``goodput`` row, ``cliffguard status``,
the dashboard, ``/metrics`` and ``cliffguard report`` show."""

from __future__ import annotations

import statistics
from typing import Any

from cliffguard.controller.goodput.buckets import BUCKETS, INDEX, Bucket
from cliffguard.controller.goodput.counterfactual import interval_table
from cliffguard.controller.goodput.ledger import Ledger

_PROD = INDEX[Bucket.PRODUCTIVE]
_SKIP = INDEX[Bucket.SKIPPED]
_RESTART_BUCKETS = (INDEX[Bucket.RESTART], INDEX[Bucket.CHECKPOINT_RESTORE], INDEX[Bucket.HANG])


def summarize(ledger: Ledger) -> dict[str, Any]:
    """Wall time, ETTR (of seconds and of GPU-seconds), each bucket, the counts, the checkpoint
    figures and their counterfactual and the ETTR over the alert window (the stacked time chart:
    ``ledger.window.chart``)."""
    wall = (ledger.cursor - ledger.started_at) if ledger.cursor is not None and ledger.started_at is not None else 0.0
    booked, gpu_total = sum(ledger.seconds), sum(ledger.gpu)
    k = ledger.kept.now
    step_s = (k.prod + k.wait) / k.steps if k.steps else None
    return {
        "started_at": ledger.started_at, "booked_until": ledger.cursor, "ended": ledger.ended,
        "saw_start": ledger.saw_start, "world": ledger.world, "wall_s": wall, "booked_s": booked,
        "ettr": ledger.seconds[_PROD] / wall if wall > 0 else None,
        "ettr_gpu": ledger.gpu[_PROD] / gpu_total if gpu_total > 0 else None,
        "window_ettr": ledger.window.ettr, "window_s": ledger.config.ettr_window_s,
        "seconds": {b.value: ledger.seconds[i] for i, b in enumerate(BUCKETS)},
        "gpu_seconds": {b.value: ledger.gpu[i] for i, b in enumerate(BUCKETS)},
        "kept_steps": int(k.steps), "mean_step_s": step_s, "phase": str(ledger.phase),
        **ledger.counts,
        "checkpoints": checkpoint_figures(ledger, step_s),
        "guard": guard_savings(ledger),
    }


def checkpoint_figures(ledger: Ledger, step_s: float | None) -> dict[str, Any]:
    c = dict(ledger.ckpt.c)
    c["mean_stall_s"] = c["stall_s"] / c["stalls"] if c["stalls"] else None
    steps = ledger.ckpt.disk_steps
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False) if b > a]
    c["disk_interval_steps"] = int(statistics.median(gaps)) if gaps else None
    c["counterfactual"] = counterfactual(ledger, step_s, c)
    return c


def counterfactual(ledger: Ledger, step_s: float | None, c: dict[str, Any]) -> dict[str, Any] | None:
    """Young/Daly for the run's disk checkpoint interval, from its measured step time, stall per
    checkpoint (at the disk checkpoints' steps when known), restore and restart cost per restart,
    and MTBF (wall time per restart; ``[goodput] mtbf_prior_s`` until the run has restarted)."""
    interval = c["disk_interval_steps"]
    stall = (c["disk_stall_s"] / c["disk_stalls"]) if c["disk_stalls"] else c["mean_stall_s"]
    if not interval or not step_s or not stall:
        return None
    restarts = [x for x in ledger.costs.values() if x.kind in ("restart", "elastic")]
    restore = (sum(sum(x.seconds[i] for i in _RESTART_BUCKETS) for x in restarts) / len(restarts)
               if restarts else 0.0)
    n = ledger.counts["restarts"]
    wall = (ledger.cursor or 0.0) - (ledger.started_at or 0.0)
    measured = n > 0 and wall > 0
    mtbf = wall / n if measured else ledger.config.mtbf_prior_s
    out = interval_table(step_s=step_s, interval_steps=interval, stall_s=stall, restore_s=restore, mtbf_s=mtbf)
    out["mtbf_source"] = f"measured ({n} restarts)" if measured else "assumed ([goodput] mtbf_prior_s)"
    return out


def costs(ledger: Ledger) -> dict[str, dict[str, Any]]:
    """Each cost record in the ledger's state: kind, when, steps lost, and seconds by bucket."""
    return {key: {"kind": c.kind, "ts": c.ts, "steps_lost": c.steps_lost, "seconds": sum(c.seconds),
                  "gpu_seconds": sum(c.gpu), "buckets": c.by_bucket()} for key, c in ledger.costs.items()}


def guard_savings(ledger: Ledger) -> dict[str, Any]:
    """What the guard's skipped updates saved, estimated: each run of skips that no redo followed
    (the run went on without a rollback) is counted as one rollback avoided, at the mean cost of
    the rollbacks this run did pay for (its incidents that lost steps). None without one to go by."""
    c = ledger.counts
    absorbed = max(0, c["skip_episodes"] - c["skip_episodes_redone"])
    paid = [x for x in ledger.costs.values() if x.kind == "incident" and x.steps_lost > 0]
    per = sum(sum(x.seconds) for x in paid) / len(paid) if paid else None
    return {"skip_episodes": c["skip_episodes"], "absorbed": absorbed, "skipped_s": ledger.seconds[_SKIP],
            "rollback_cost_s": per, "estimated_saved_s": None if per is None else absorbed * per - ledger.seconds[_SKIP]
            if absorbed else 0.0,
            "basis": f"the mean of {len(paid)} rollbacks of this run" if paid else "no rollback of this run to go by"}
