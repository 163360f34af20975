"""``cliffguard status [RUN]``: runs and their recovery states; with RUN, its incidents and commands."""

from __future__ import annotations

import argparse
import json
import logging
import time

from cliffguard.commands.controller import add_common, resolve_common
from cliffguard.core.capabilities import describe, describe_lr_scale
from cliffguard.core.settings import ConfigError


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
    from cliffguard.controller.store.db import Store

    logging.getLogger("alembic").setLevel(logging.WARNING)  # migrations are not news here
    try:
        store_cfg = resolve_common(args, ["store"])["store"]
    except ConfigError as exc:
        print(f"cliffguard status: {exc}")
        return 2
    store = Store.open(store_cfg)
    try:
        with store.session() as s:
            if args.run:
                run_row = read.get_run(s, args.run)
                if run_row is None:
                    print(f"cliffguard status: run {args.run!r} is not in the store")
                    return 1
                run_row.pop("controller_state", None)
                out = {"run": run_row, "incidents": read.incidents(s, args.run, limit=20),
                       "transitions": read.transitions(s, args.run, limit=50),
                       "commands": read.commands(s, args.run, limit=50),
                       "scale": (read.scale_timeline(s, args.run) or [None])[-1],
                       "elastic_events": read.elastic_events(s, args.run, limit=20)}
            else:
                out = {"runs": read.list_runs(s), "dlq": read.dlq_counts(s)}
    finally:
        store.close()
    if args.json:
        print(json.dumps(out, default=str, indent=1))
        return 0
    if not args.run:
        runs = out["runs"]
        if not runs:
            print("no runs in the store")
        print(f"{'RUN':<28} {'STATUS':<9} {'RECOVERY':<13} {'STEP':>8} {'LR× APPLIED':>16} {'SEEN':>6}  COMMANDS")
        for r in runs:
            print(f"{r['id']:<28} {r['status']:<9} {r['recovery_state']:<13} {r['last_step']:>8} "
                  f"{describe_lr_scale(r.get('lr_scale_applied'), r['lr_scale']):>16} "
                  f"{_age(r.get('last_event_ts')):>6}  {describe(r.get('capabilities'))}")
        for d in out["dlq"]:
            print(f"dead letters {d['topic']} {d['reason']}: {d['count']}")
        return 0
    r = out["run"]
    print(f"run {r['id']}: {r['status']}, recovery {r['recovery_state']}, step {r['last_step']}, "
          f"lr_scale applied {describe_lr_scale(r.get('lr_scale_applied'), r['lr_scale'])}, "
          f"commands it applies: {describe(r.get('capabilities'))}")
    if out["scale"] is not None:
        print(f"  world {out['scale']['world']}, global batch {out['scale']['global_batch']}"
              + (f" ({len(out['elastic_events'])} scale changes)" if out["elastic_events"] else ""))
    for e in out["elastic_events"]:
        print(f"  scaled {e['direction']:<4} at step {e['step']}: world {e['from_world']} -> {e['to_world']}, "
              f"global batch {e['from_global_batch']} -> {e['global_batch']}, lr {e['lr']:.3g}; "
              f"{e['steps_lost']} steps redone, {e['seconds_lost']:.1f} s lost")
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
    return 0
