"""``cliffguard status [RUN]``: runs and their recovery states; with RUN, its incidents and commands."""

from __future__ import annotations

import argparse
import json
import time

from cliffguard.agent.recovery.cadence import describe as describe_validation
from cliffguard.commands.controller import add_common, open_store_quietly, resolve_common
from cliffguard.commands.json_stdout import emit
from cliffguard.core.capabilities import describe, describe_lr_scale


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("status", help="list runs and their recovery states")
    p.add_argument("run", nargs="?", metavar="RUN", help="show one run's incidents, timeline and commands")
    add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _age(ts: float | None) -> str:
    if ts is None:
        return "-"
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def _ettr(g: dict | None) -> str:
    """A run's ETTR as a percentage ("-" before its ledger booked anything)."""
    return "-" if g is None or g.get("ettr") is None else f"{100 * g['ettr']:.1f}%"


DEAD_LETTER_HINTS = {
    "unsigned": "the trainer signs no events: give it CLIFFGUARD_AGENT_SECRET_FILE (a trainer that is its own "
                "launcher) or its run's CLIFFGUARD_EVENT_KEY (a worker); `cliffguard keys generate` prints each role's",
    "bad_signature": "the trainer signs with another agent secret than the controller's",
    "unknown_version": "the trainer is newer than this controller",
    "clock_skew": "the trainer's clock is far from the controller's",
}
"""Why a run's events may be refused, and what to do: printed under its dead letters."""


def _incident_notes(ev: dict) -> str:
    """Who decided, the escalation rung and every LR scale the incident set (1 -> 0.5 -> 0.125)."""
    notes = []
    if ev.get("decided_by"):
        notes.append(f"decided by the {ev['decided_by']}")
    esc = ev.get("escalation")
    rung = ev.get("escalation_rung", esc.get("level") if isinstance(esc, dict) else 0)
    if rung:
        notes.append(f"escalation rung {rung}")
    scales = ev.get("lr_scales") or []
    if scales:
        before = ev.get("lr_scale_at_open", 1)
        notes.append("lr_scale " + " -> ".join(f"{x:g}" for x in [before, *scales]))
    return f"; {', '.join(notes)}" if notes else ""


def run(args: argparse.Namespace) -> int:
    from cliffguard.controller.store import read

    store = open_store_quietly(args, "status")  # migrations' "schema at head" is not news in a status
    if store is None:
        return 2
    try:
        with store.session() as s:
            if args.run:
                run_row = read.get_run(s, args.run)
                budgets = None
                if run_row is not None:
                    budgets = _budgets(args, run_row.pop("controller_state", None))
                out = {"run": run_row, "incidents": read.incidents(s, args.run, limit=20),
                       "transitions": read.transitions(s, args.run, limit=50),
                       "commands": read.commands(s, args.run, limit=50),
                       "scale": (read.scale_timeline(s, args.run) or [None])[-1],
                       "elastic_events": read.elastic_events(s, args.run, limit=20),
                       "dead_letters": read.dlq_runs(s, args.run),
                       "goodput": read.ettr_by_run(s, [args.run]).get(args.run), "budgets": budgets}
            else:
                out = {"runs": read.list_runs(s), "dead_letters": read.dlq_runs(s), "dlq": read.dlq_counts(s),
                       "ettr": read.ettr_by_run(s)}
    finally:
        store.close()
    if args.json:
        emit(json.dumps(out, default=str, indent=1))
        return 0 if not args.run or out["run"] is not None else 1
    if not args.run:
        _print_runs(out)
        return 0
    if out["run"] is None:
        print(f"cliffguard status: run {args.run!r} is not in the store" + (
            ": none of its events was accepted" if out["dead_letters"] else ""))
        _print_dead_letters(out["dead_letters"])
        return 1
    _print_run(out)
    return 0


def _budgets(args: argparse.Namespace, controller_state: dict | None) -> dict | None:
    """Each recovery rung's uses and room for the run (controller/recovery_budgets.py ``left``), by
    the limits the controller stored with it, else by this command's ``[recovery]`` (``--config``)."""
    from cliffguard.config import ConfigError
    from cliffguard.controller.recovery_budgets import left

    try:
        cfg = resolve_common(args, ["recovery"])["recovery"]
    except ConfigError as exc:
        return {"error": str(exc)}
    try:
        found = left(cfg, controller_state, time.time())
    except (KeyError, TypeError, ValueError) as exc:  # a state this version cannot read: said, not a traceback
        return {"error": f"the run's stored recovery state is not readable here: {type(exc).__name__}: {exc}"}
    found["limits"] = "the controller's" if found["source"] == "controller" else (args.config or "the defaults")
    return found


def _print_budgets(b: dict | None) -> None:
    if b is None:
        return
    if "error" in b:
        print(f"  recovery budgets: not shown ({b['error']})")
        return
    parts = [f"{r['rung']} {r['in_window']}/{r['budget']}" + (f", {r['in_run']} in the run" if r["per_run"] else "")
             + f" ({r['left']} left, then {r['escalates_to']})" for r in b["rungs"]]
    print(f"  recovery budgets ({b['limits']} limits): " + "; ".join(parts))


def _print_runs(out: dict) -> None:
    runs = out["runs"]
    if not runs:
        print("no runs in the store")
    else:
        print(f"{'RUN':<28} {'STATUS':<9} {'RECOVERY':<13} {'STEP':>8} {'ETTR':>6} {'LR× APPLIED':>16} {'SEEN':>6}  "
              "COMMANDS")
        for r in runs:
            print(f"{r['id']:<28} {r['status']:<9} {r['recovery_state']:<13} {r['last_step']:>8} "
                  f"{_ettr(out['ettr'].get(r['id'])):>6} {describe_lr_scale(r.get('lr_scale_applied'), r['lr_scale']):>16} "
                  f"{_age(r.get('last_event_ts')):>6}  {describe(r.get('capabilities'))}")
    _print_dead_letters(out["dead_letters"])
    if out["dlq"]:
        print()
        for d in out["dlq"]:
            print(f"dead letters {d['topic']} {d['reason']}: {d['count']}")


def _print_dead_letters(rows: list[dict]) -> None:
    """Runs whose events the controller refuses: by run, reason and count, with what to do."""
    if not rows:
        return
    print()
    print("runs whose events are dead-lettered (the controller never sees them):")
    print(f"  {'RUN':<28} {'REASON':<16} {'COUNT':>8} {'LAST':>6}  NEWEST")
    for d in rows:
        print(f"  {d['run_id']:<28} {d['reason']:<16} {d['count']:>8} {_age(d.get('last_ts')):>6}  "
              f"{(d.get('last_detail') or '')[:80]}")
    for reason in sorted({d["reason"] for d in rows} & DEAD_LETTER_HINTS.keys()):
        print(f"  {reason}: {DEAD_LETTER_HINTS[reason]}")


def _print_run(out: dict) -> None:
    r = out["run"]
    print(f"run {r['id']}: {r['status']}, recovery {r['recovery_state']}, step {r['last_step']}, "
          f"lr_scale applied {describe_lr_scale(r.get('lr_scale_applied'), r['lr_scale'])}, "
          f"commands it applies: {describe(r.get('capabilities'))}")
    g = out["goodput"]
    if g is not None:
        print(f"  goodput: ETTR {_ettr(g)} of {g['wall_s']:.0f} s wall, {g['steps_lost']} steps lost "
              f"(`cliffguard report {r['id']}` for where the time went)")
    if out["scale"] is not None:
        batch = out["scale"]["global_batch"]
        print(f"  world {out['scale']['world']}, global batch {batch if batch else 'not declared'}"
              + (f" ({len(out['elastic_events'])} scale changes)" if out["elastic_events"] else ""))
    validation = (r.get("summary") or {}).get("validation")
    if validation:
        print(f"  {describe_validation(validation)}")
    for e in out["elastic_events"]:
        print(f"  scaled {e['direction']:<4} at step {e['step']}: world {e['from_world']} -> {e['to_world']}, "
              f"global batch {e['from_global_batch']} -> {e['global_batch']}, lr {e['lr']:.3g}; "
              f"{e['steps_lost']} steps redone, {e['seconds_lost']:.1f} s lost")
    _print_budgets(out.get("budgets"))
    for inc in out["incidents"]:
        print(f"  incident {inc['id'][:8]} {inc['rule']} {inc['level']} spike@{inc['spike_step']} "
              f"onset@{inc['onset_step']} -> {inc['outcome']}" + (f" (rollback to {inc['rollback_to']})"
                                                                  if inc.get("rollback_to") is not None else "")
              + _incident_notes(inc.get("evidence") or {}))
    for t in out["transitions"]:
        step = "-" if t.get("step") is None else t["step"]
        print(f"  step {step:>7} {t['from_state']:>12} -> {t['to_state']:<12} {t['reason'][:100]}")
    for c in out["commands"]:
        print(f"  command {c['id'][:8]} {c['type']:<9} {c['source']:<10} {c['status']:<9} {c.get('ack_detail') or ''}")
    _print_dead_letters(out["dead_letters"])
