"""The invariants about data (pure): the run finished, and every step and witnessed event is stored
exactly as often as the trainer produced it."""

from __future__ import annotations

from collections import Counter

from bench.soak.ledger import executed_steps, ranges
from bench.soak.observed import Check, Observed

STORED_BY_ID = ("step", "grad_hist", "ranks", "validation", "data.flag")
"""Event types the store keeps one row of per event id."""


def run_finished(o: Observed, c: Check) -> None:
    end = next((r for r in reversed(o.record) if r.get("kind") == "end"), None)
    if end is None or end["step"] < o.steps:
        c.fail(
            1,
            f"trainer ended at step {None if end is None else end['step']} of {o.steps}"
            + (f" ({end['stop_reason']})" if end and end.get("stop_reason") else ""),
        )
    if o.train_rc != 0:
        c.fail(1, f"training exited {o.train_rc}")
    run = o.store.get("run") or {}
    if run.get("status") != "finished":
        c.fail(1, f"the store says the run is {run.get('status')!r}")


def _step_counts(o: Observed) -> tuple[Counter[int], Counter[int], int]:
    below = int((o.store.get("run") or {}).get("downsampled_below") or 0)
    expected = Counter({s: n for s, n in executed_steps(o.record).items() if s >= below})
    stored = Counter(
        r["step"] for r in o.store["steps"] if r["rank"] == 0 and r["resolution"] == 1 and r["step"] >= below
    )
    return expected, stored, below


def steps_lost(o: Observed, c: Check) -> None:
    expected, stored, below = _step_counts(o)
    lost = {s: expected[s] - stored[s] for s in expected if expected[s] > stored[s]}
    if lost:
        c.fail(
            sum(lost.values()),
            f"steps run but not stored: {ranges(lost)}"
            + (f" (below {below} folded by retention)" if below else ""),
        )


def steps_repeated(o: Observed, c: Check) -> None:
    expected, stored, _ = _step_counts(o)
    extra = {s: stored[s] - expected[s] for s in stored if stored[s] > expected[s]}
    if extra:
        c.fail(sum(extra.values()), f"steps stored more often than run: {ranges(extra)}")


def witnessed_stored(o: Observed, c: Check) -> None:
    below = int((o.store.get("run") or {}).get("downsampled_below") or 0)
    missing = [
        e
        for e in o.events.values()
        if e["type"] in STORED_BY_ID
        and e["run"] == o.run
        and e["id"] not in o.store["ids"].get(e["type"], ())
        and not (e["type"] == "step" and (e["step"] or 0) < below)
    ]
    by_type = Counter(e["type"] for e in missing)
    for kind, n in sorted(by_type.items()):
        c.fail(
            n,
            f"{n} {kind} event(s) read from the topic, not stored: steps "
            f"{ranges(e['step'] for e in missing if e['type'] == kind)}",
        )
