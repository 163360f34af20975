"""Step rows written at a coarser resolution: one batch's step rows folded into buckets in Python,
before they are inserted (``RetentionConfig.write_bucket``), instead of every step written and
thinned later by ``store.retention``.

A bucket is a run's and rank's steps ``[k * width, (k + 1) * width)`` within one batch. Its row
sits at its first step, with ``resolution`` = the steps it holds, and summarises them as
``store.retention`` summarises a bucket (``Fold`` in ``store/step_metrics.py``: weighted means,
peaks, minima, sums; the loss's mean, min and max). A bucket that a batch boundary splits becomes
two rows, both finer than ``width``, which retention's mid tier later folds into one.

Kept exact (one row per step, ``resolution`` 1, the event's id), so nothing a person or a rule
must see is averaged away:

- each run's and rank's newest step in the batch (the dashboard's latest figures);
- the steps the caller names (``exact``: the loss rule judged them above ok, or an incident was
  open), a non-finite loss, a guard decision other than ``ok``;
- a bucket of one step.

A bucket row's id derives from its steps' event ids, so the same batch applied again (a retry
after a rollback of the transaction) writes nothing twice; a duplicate of a folded step that
arrives in a later batch is counted once more in its own row (the newest step of a batch, where
a producer's retry lands, is exact and so deduplicated by its id). ``guard``,
``layer_grad_norms`` and the rule's ``rule_*`` figures are dropped, as in retention's buckets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from cliffguard.controller.store.step_metrics import STEP_METRICS, Fold

_MEANS = tuple(m.name for m in STEP_METRICS if m.fold in (Fold.MEAN, Fold.MEAN_FINITE))
_MAXES = tuple(m.name for m in STEP_METRICS if m.fold in (Fold.MAX, Fold.MAX_FINITE))
_MINS = tuple(m.name for m in STEP_METRICS if m.fold is Fold.MIN)
_SUMS = tuple(m.name for m in STEP_METRICS if m.fold is Fold.SUM)
_ANYS = tuple(m.name for m in STEP_METRICS if m.fold is Fold.ANY)


def bucket_rows(rows: list[dict[str, Any]], width: int, exact: Iterable[str] = ()) -> list[dict[str, Any]]:
    """``rows`` (step rows of one batch, as ``store.ingest`` builds them) with the foldable ones
    folded into ``width``-step buckets (see the module docstring); ``exact``: event ids kept as
    they are. ``width`` 1 returns ``rows`` unchanged."""
    if width <= 1 or len(rows) < 2:
        return rows
    keep = set(exact)
    newest: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r["run_id"], r["rank"])
        if r["step"] > newest.get(key, -1):
            newest[key] = r["step"]
    out: list[dict[str, Any]] = []
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if (r["event_id"] in keep or r["nonfinite"] is not None or r["guard"] not in (None, "ok")
                or r["step"] == newest[(r["run_id"], r["rank"])] or r["resolution"] != 1):
            out.append(r)
        else:
            groups.setdefault((r["run_id"], r["rank"], r["step"] // width), []).append(r)
    for members in groups.values():
        out.append(members[0] if len(members) == 1 else _fold(members))
    return out


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fold(members: list[dict[str, Any]]) -> dict[str, Any]:
    members.sort(key=lambda r: (r["step"], r["event_id"]))
    first = members[0]
    losses = [r["loss"] for r in members if r["loss"] is not None]
    ids = ",".join(r["event_id"] for r in members)
    row: dict[str, Any] = {
        **first,
        "event_id": hashlib.blake2b(f"bucket:{ids}".encode(), digest_size=16).hexdigest(),
        "ts": max(r["ts"] for r in members),
        "resolution": len(members),
        "loss": _mean(losses),
        "loss_min": min(losses) if losses else None,
        "loss_max": max(losses) if losses else None,
        "nonfinite": None,
        "guard": None,
        "layer_grad_norms": None,
        "rule_median": None,
        "rule_sigma": None,
        "rule_level": None,
    }
    for name in _MEANS:
        row[name] = _mean([r[name] for r in members])
    for name in _MAXES:
        vals = [r[name] for r in members if r[name] is not None]
        row[name] = max(vals) if vals else None
    for name in _MINS:
        vals = [r[name] for r in members if r[name] is not None]
        row[name] = min(vals) if vals else None
    for name in _SUMS:
        vals = [r[name] for r in members if r[name] is not None]
        row[name] = sum(vals) if vals else None
    for name in _ANYS:
        row[name] = any(bool(r[name]) for r in members)
    return row
