"""The demo's verdict (pure): match the incidents the controller recorded to the injected faults.

Faults of one kind on consecutive steps (``corrupt@198 corrupt@199 corrupt@200``: a corrupted
stretch of data) count as one fault. A fault is matched to the first incident whose spike step
lies in the fault's window ``[step, end + slack)`` (a spike shows a step or two after the bad
update). What each fault should lead to:

- ``corrupt``: a trainer that re-runs a critical step (the bundled one: trainer/rerun.py) finds
  the batch bad wherever it runs and skips and lists it itself -> ``cured`` (a ``triage``
  incident per corrupted step, every one of them the fault's); a trainer without re-runs pauses,
  and the weights are fine, so validation is normal -> ``resumed``.
- ``lr_blowup``: the weights are damaged, so validation is abnormal -> ``rolled_back`` to a
  checkpoint before the blow-up with the LR scale lowered (cumulative, < 1).
- ``nan``: the guard skipped the update -> any outcome but ``halted`` (``resumed`` expected).
- ``bitflip``: one replica's weights are corrupt (SDC) -> ``rolled_back`` to before the flip with
  the LR scale kept (the optimizer is fine), found by the SDC watch's next check (within
  ``param_check_every`` steps, agent/param_check.py).
- ``slow_rank``, ``kill_rank``, ``broker_outage``: no loss incident expected; not judged here.

``ok`` is true when every judged fault has its expected incident and no incident ended ``halted``
or ``abandoned`` (the run ended before its recovery finished). A report-only run (the Accelerate
tracker: it declared no command) is judged by ``judge_alerts`` instead: an alert per fault, and
not one command sent.
"""

from __future__ import annotations

import math
from typing import Any

from cliffguard.agent.param_check import DEFAULT_EVERY
from cliffguard.core.enums import AlertAction, AlertLevel
from cliffguard.trainer.faults import FaultSpec

EXPECTED: dict[str, tuple[str, ...]] = {
    "corrupt": ("cured", "resumed"),
    "lr_blowup": ("rolled_back",),
    "nan": ("resumed", "rolled_back"),
    "bitflip": ("rolled_back",),
}
MATCH_SLACK_STEPS = 15
"""Steps after a fault's window in which its spike may still be reported."""
SLACK_STEPS_BY_KIND = {"bitflip": DEFAULT_EVERY + MATCH_SLACK_STEPS}
"""...and for faults a periodic check finds: its period more."""
KEEPS_LR = frozenset({"bitflip"})
"""Faults whose rollback must keep the LR scale (not the optimizer's fault)."""


def merge_consecutive(faults: list[FaultSpec]) -> list[tuple[FaultSpec, int]]:
    """(first spec, end step exclusive) per run of same-kind faults on adjacent/overlapping steps."""
    merged: list[tuple[FaultSpec, int]] = []
    for spec in sorted(faults, key=lambda f: (f.kind, f.step)):
        end = spec.step + spec.steps
        if merged and merged[-1][0].kind == spec.kind and spec.step <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((spec, end))
    return sorted(merged, key=lambda m: m[0].step)


def incident_summary(inc: dict[str, Any], transitions: list[dict[str, Any]]) -> dict[str, Any]:
    """One incident as the summary shows it: outcome, steps and its timeline (seconds since opened)."""
    opened = inc["opened_at"]
    timeline = [{
        "t_s": round(t["ts"] - opened, 3), "step": t["step"], "from": t["from_state"], "to": t["to_state"],
        "reason": t["reason"],
    } for t in transitions]
    closed = inc.get("closed_at")
    return {
        "id": inc["id"], "rule": inc["rule"], "level": inc["level"], "outcome": inc["outcome"],
        "spike_step": inc["spike_step"], "onset_step": inc.get("onset_step"), "rollback_to": inc.get("rollback_to"),
        "lr_scale": inc.get("lr_scale"), "lr_scale_at_open": (inc.get("evidence") or {}).get("lr_scale_at_open"),
        "duration_s": None if closed is None else round(closed - opened, 3),
        "transitions": timeline,
    }


def judge(faults: list[FaultSpec], incidents: list[dict[str, Any]]) -> tuple[bool, list[dict[str, Any]], list[str]]:
    """(ok, per-fault results, unmatched incident ids). ``incidents`` as ``incident_summary`` makes them."""
    by_step = sorted(incidents, key=lambda i: i["spike_step"])
    used: set[str] = set()
    results: list[dict[str, Any]] = []
    ok = True
    for spec, end in merge_consecutive(faults):
        if spec.kind not in EXPECTED:
            continue
        lo, hi = spec.step, end + SLACK_STEPS_BY_KIND.get(spec.kind, MATCH_SLACK_STEPS)
        inc = next((i for i in by_step if i["id"] not in used and lo <= i["spike_step"] < hi), None)
        expected = EXPECTED[spec.kind]
        problem = None
        if inc is None:
            problem = "no incident"
        else:
            used.add(inc["id"])
            if inc["outcome"] == "cured":  # cured in-process step by step: each bad step of the stretch its own
                used.update(i["id"] for i in by_step if i["outcome"] == "cured" and lo <= i["spike_step"] < hi)
            if inc["outcome"] not in expected:
                problem = f"outcome {inc['outcome']}, expected {' or '.join(expected)}"
            elif inc["outcome"] == "rolled_back":
                if inc["rollback_to"] is None or inc["rollback_to"] >= spec.step:
                    problem = f"rolled back to {inc['rollback_to']}, not before the fault at {spec.step}"
                elif spec.kind in KEEPS_LR:
                    before = inc.get("lr_scale_at_open")
                    if inc["lr_scale"] != (1.0 if before is None else before):
                        problem = (f"lr_scale {before} -> {inc['lr_scale']}: a corrupt replica is no optimizer "
                                   "trouble; the LR stays")
                elif inc["lr_scale"] is None or not inc["lr_scale"] < 1:
                    problem = f"lr_scale {inc['lr_scale']} not lowered"
        ok = ok and problem is None
        name = f"{spec.kind}@{spec.step}" + (f"..{end - 1}" if end - spec.step > 1 else "")
        results.append({"fault": name, "kind": spec.kind, "step": spec.step, "end": end,
                        "expected": list(expected), "incident": None if inc is None else inc["id"],
                        "outcome": None if inc is None else inc["outcome"], "ok": problem is None,
                        "problem": problem})
    if any(i["outcome"] in ("halted", "abandoned") for i in incidents):
        ok = False
    unmatched = [i["id"] for i in by_step if i["id"] not in used]
    return ok, results, unmatched


def judge_alerts(faults: list[FaultSpec], alerts: list[dict[str, Any]],
                 commands_sent: int) -> tuple[bool, list[dict[str, Any]], list[str]]:
    """The verdict on a report-only run (one that declared no command): every judged fault must
    raise a warn/critical alert whose evidence step lies in the fault's window, and the controller
    must have sent no command at all. (ok, per-fault results, ids of alerts no fault explains)."""
    raised = [a for a in alerts if a["level"] in (AlertLevel.WARN, AlertLevel.CRITICAL)
              and a.get("action", AlertAction.TRIGGER) == AlertAction.TRIGGER]
    used: set[str] = set()
    results: list[dict[str, Any]] = []
    ok = commands_sent == 0
    for spec, end in merge_consecutive(faults):
        if spec.kind not in EXPECTED:
            continue
        lo, hi = spec.step, end + SLACK_STEPS_BY_KIND.get(spec.kind, MATCH_SLACK_STEPS)
        hits = [a for a in raised if isinstance((a.get("evidence") or {}).get("step"), int)
                and lo <= a["evidence"]["step"] < hi]
        used.update(a["id"] for a in hits)
        problem = None if hits else "no alert"
        if commands_sent:
            problem = f"{commands_sent} command(s) sent to a report-only run"
        ok = ok and problem is None
        name = f"{spec.kind}@{spec.step}" + (f"..{end - 1}" if end - spec.step > 1 else "")
        results.append({"fault": name, "kind": spec.kind, "step": spec.step, "end": end, "expected": ["alert"],
                        "incident": None, "alerts": len(hits), "outcome": "alert" if hits else None,
                        "ok": problem is None, "problem": problem})
    return ok, results, [a["id"] for a in raised if a["id"] not in used]


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def render(summary: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of the demo."""
    lines = ["", "=" * 72, f"cliffguard demo: run {summary['run']}  "
             f"({summary['steps']} steps, {summary['wall_s']:.0f} s)", "=" * 72]
    for inc in summary["incidents"]:
        head = (f"incident {inc['id'][:8]}  {inc['rule']}/{inc['level']}  spike at step {inc['spike_step']}"
                f"  -> {inc['outcome']}")
        if inc["rollback_to"] is not None:
            head += f" (rolled back to step {inc['rollback_to']}, lr_scale {inc['lr_scale']})"
        if inc["duration_s"] is not None:
            head += f"  in {inc['duration_s']:.1f} s"
        lines.append(head)
        for t in inc["transitions"]:
            lines.append(f"   +{t['t_s']:6.2f}s  step {t['step']!s:>5}  {t['from']:>12} -> {t['to']:<12} {t['reason']}")
    if not summary["incidents"]:
        lines.append("no incidents recorded")
    lines.append("")
    for f in summary["faults"]:
        mark = "ok  " if f["ok"] else "FAIL"
        lines.append(f"[{mark}] {f['fault']:<16} expected {'/'.join(f['expected']):<12} got {f['outcome']}"
                     + (f"  ({f['problem']})" if f["problem"] else ""))
    if summary.get("commands_sent") is not None:
        lines.append(f"commands sent to the run: {summary['commands_sent']}")
    if summary["unmatched_incidents"]:
        what = "alerts" if summary.get("incidents") == [] and summary.get("alerts") else "incidents"
        lines.append(f"{what} not caused by an injected fault: {len(summary['unmatched_incidents'])}")
    fl, il = summary["final_loss"], summary["initial_loss"]
    lines.append(f"samples flagged after transient spikes: {summary['flagged_samples']}")
    if summary.get("listed_samples"):
        lines.append(f"samples on the bad-batch list (triage: cliffguard badbatches): {summary['listed_samples']}")
    lines.append(f"steps lost to rollbacks: {summary['steps_lost']}   "
                 f"loss {il if il is None else f'{il:.3f}'} -> {fl if fl is None else f'{fl:.3f}'}")
    if summary.get("validation"):
        from cliffguard.agent.recovery.cadence import describe

        lines.append(describe(summary["validation"]))
    lines.append("RESULT: " + ("every injected fault was handled as expected" if summary["ok"] else "NOT OK"))
    return "\n".join(lines)
