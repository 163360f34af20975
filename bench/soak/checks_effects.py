"""The invariants about effects (pure): one incident per training fault (a hang incident of a stopped
rank explained by that stop), one command per incident,
type and attempt, none applied twice, no incident rolled back twice, every LR change an incident's,
and each training fault's expected outcome (or an incident saying what happened instead)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from bench.soak.ledger import ranges
from bench.soak.observed import Check, Observed
from cliffguard.demo_summary import MATCH_SLACK_STEPS, judge, merge_consecutive
from cliffguard.trainer.faults import FaultSpec

LR_FACTOR = 0.5
"""The rollback's LR cut (core/policy.py's default): the blow-up's rollback sets lr_scale 0.5."""


def _windows(o: Observed) -> list[tuple[FaultSpec, int, int]]:
    faults = [FaultSpec.parse(f) for f in o.training_faults]
    return [(spec, spec.step, end + MATCH_SLACK_STEPS) for spec, end in merge_consecutive(faults)]


def _by_fault(o: Observed) -> tuple[dict[int, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Incidents per training fault (the latest fault whose window holds the spike), and the rest."""
    windows = _windows(o)
    per: dict[int, list[dict[str, Any]]] = {n: [] for n in range(len(windows))}
    rest = []
    for inc in sorted(o.store["incidents"], key=lambda i: i["opened_at"]):
        hits = [n for n, (_, lo, hi) in enumerate(windows) if lo <= inc["spike_step"] < hi]
        (per[max(hits, key=lambda n: windows[n][1])] if hits else rest).append(inc)
    return per, rest


def incidents_repeated(o: Observed, c: Check) -> None:
    per, _ = _by_fault(o)
    for n, hits in per.items():
        spec = _windows(o)[n][0]
        if len(hits) > 1:
            c.fail(
                len(hits) - 1,
                f"{spec.kind}@{spec.step}: {len(hits)} incidents (spikes at "
                f"{', '.join(str(i['spike_step']) for i in hits)})",
            )


HANG_SLACK_S = 30.0
"""How long after a stopped rank continued a hang it caused may still be reported: the watchdog
dumps after ``dump_after_s`` of no step, and a rank that reports late (a collective failing after
the stop) still reports that stall."""


def _stalled_by_a_stopped_rank(o: Observed, inc: dict[str, Any]) -> bool:
    """A hang whose first rank report came while a rank was SIGSTOPped (``rank_stop``), or soon
    after: the rank really did stall the collective, so the incident is the controller doing its job.
    The report's time is the trainer's (the hang rule's evidence), not the incident's opening: a
    controller stopped or behind a locked store opens it as late as it gets to it (the PostgreSQL
    soak's seed 102 opened one 65 s after the stop ended, right when its stopped controller went on).
    Incidents kept before the report time was collected fall back to their opening time."""
    if inc["rule"] != "hang":
        return False
    at = inc.get("first_report_ts") or inc.get("opened_at")
    return at is not None and any(
        kind == "rank_stop" and start <= at <= end + HANG_SLACK_S for kind, _, start, end in o.fault_windows
    )


def incidents_unexplained(o: Observed, c: Check) -> None:
    for i in _by_fault(o)[1]:
        if _stalled_by_a_stopped_rank(o, i):
            continue
        c.fail(
            1,
            f"incident {i['id'][:8]} ({i['rule']}, spike at {i['spike_step']}, {i['outcome']}) "
            "matches no training fault",
        )


def _applied(o: Observed) -> list[dict[str, Any]]:
    return [r for r in o.record if r.get("kind") == "command" and r.get("status") == "applied"]


def commands_repeated(o: Observed, c: Check) -> None:
    groups = Counter(
        (r["incident_id"], r["type"], r["attempt"]) for r in o.store["commands"] if r["incident_id"]
    )
    for (inc, kind, attempt), n in sorted(groups.items()):
        if n > 1:
            c.fail(n - 1, f"incident {inc[:8]}: {n} {kind} commands for attempt {attempt}")


def applied_twice(o: Observed, c: Check) -> None:
    for cmd, n in Counter(r["id"] for r in _applied(o)).items():
        if n > 1:
            c.fail(n - 1, f"command {cmd[:12]} applied {n} times")


def rolled_back_twice(o: Observed, c: Check) -> None:
    by_id = {r["id"]: r for r in o.store["commands"]}
    per_incident = Counter(
        by_id[r["id"]]["incident_id"]
        for r in _applied(o)
        if r["type"] == "rollback" and r["id"] in by_id and by_id[r["id"]]["incident_id"]
    )
    for inc, n in per_incident.items():
        if n > 1:
            c.fail(n - 1, f"incident {inc[:8]} rolled back {n} times")


def lr_unexplained(o: Observed, c: Check) -> None:
    by_id = {r["id"]: r for r in o.store["commands"]}
    incidents = {i["id"]: i for i in o.store["incidents"]}
    for r in o.record:
        if r.get("kind") not in ("command", "timeout") or math.isclose(r["lr_scale"], r["lr_scale_before"]):
            continue
        new = r["lr_scale"]
        if r["kind"] == "command":
            inc = incidents.get((by_id.get(r["id"]) or {}).get("incident_id") or "")
            ok = inc is not None and (r["type"] == "set_lr_scale" or math.isclose(inc["lr_scale"] or 0, new))
            who = f"command {r['id'][:12]} ({r['type']})"
        else:
            ok = any(
                i["rollback_to"] == r["step_after"] and math.isclose(i["lr_scale"] or 0, new)
                for i in incidents.values()
            )
            who = f"the trainer's own {r['wait']} timeout ({r['policy']})"
        if not ok:
            c.fail(
                1,
                f"lr_scale {r['lr_scale_before']:g} -> {new:g} at step {r['step_before']} by {who}: "
                "no incident in the store says so",
            )
    end = next((r for r in reversed(o.record) if r.get("kind") == "end"), None)
    asked = (o.store.get("run") or {}).get("lr_scale")
    if end is not None and asked is not None and not math.isclose(asked, end["lr_scale"]):
        c.fail(1, f"the store asked lr_scale {asked:g}, the trainer ended with {end['lr_scale']:g}")


def fault_outcomes(o: Observed, c: Check) -> None:
    faults = [FaultSpec.parse(f) for f in o.training_faults]
    incs = sorted(o.store["incidents"], key=lambda i: i["opened_at"])
    _, results, _ = judge(faults, incs)
    by_id = {i["id"]: i for i in incs}
    rolled = [i["id"] for i in incs if i["outcome"] == "rolled_back"]
    for res in results:
        inc = by_id.get(res["incident"] or "")
        if not res["ok"]:
            if inc is not None and inc["outcome"] not in ("open", "abandoned"):
                c.detail.append(
                    f"{res['fault']}: {inc['outcome']} instead ({res['problem']}); explained by "
                    f"incident {inc['id'][:8]}"
                )
                continue
            c.fail(1, f"{res['fault']}: {res['problem']}")
        elif res["kind"] == "corrupt":
            first: dict[int, dict[str, Any]] = {}
            for e in sorted(o.events.values(), key=lambda e: e["ts"] or 0):
                if e["type"] == "step" and e["rank"] == 0 and res["step"] <= (e["step"] or -1) < res["end"]:
                    first.setdefault(e["step"], e)
            applied = sorted(s for s, e in first.items() if not e.get("skipped"))
            if applied:
                c.fail(
                    1,
                    f"{res['fault']}: resumed, but the corrupted update(s) of step(s) {ranges(applied)} "
                    "were applied",
                )
        elif inc is not None and res["kind"] == "lr_blowup":
            want = LR_FACTOR ** (rolled.index(inc["id"]) + 1)
            if not math.isclose(inc["lr_scale"] or 0, want):
                c.fail(1, f"{res['fault']}: rolled back with lr_scale {inc['lr_scale']}, expected {want:g}")
