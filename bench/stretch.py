"""A corrupted stretch of N batches: from its first bad batch to training again.

    python -m bench.stretch --json OUT.json [--bad 1,3,5,10] [--trainers nanogpt,hf] [--repeat 1]
                            [--steps 110] [--at 60]

Per trainer (testing/held_runs.py: a nanoGPT-style plain loop with its own step counter, and a
Hugging Face ``Trainer``) and per stretch length N: one run with the batches of steps
``at .. at+N-1`` corrupted (random bytes, trainer/faults.py), the embedded broker and a
``ControllerService`` on a thread (SQLite store, the test recovery settings). Reported:

- ``back_s``: from the emit of the first bad step to the first applied update after the last resume
  or rollback the controller sent: how long the stretch kept the run from training;
- ``stall_s``: the longest gap between two step events (the longest wait at a boundary);
- ``step_s``: the median gap, for scale;
- ``skipped``: the stretch's updates skipped on their first pass (of N), ``holds``: the guard's
  holds, ``incidents`` with their outcomes and rungs, ``timeouts``: trainer-side timeouts that fired
  (0 expected: every hold answered), ``lr_scale``: the LR scale at the end (1 expected).

Runs are sequential, one intra-op thread each; the load average is recorded beside them. With
``--repeat N`` each (trainer, N bad) runs N times and a summary gives the median and the largest
``back_s`` and ``stall_s`` of each (a shared machine's load makes single runs noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.core.enums import EventType
from testing.held_runs import Outcome, Scenario, controller, run_scenario, stretch

TRAINERS = ("nanogpt", "hf")


def row(trainer: str, bad: int, at: int, out: Outcome, incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures (pure, from its events and its incidents)."""
    first_pass = [out.first_pass(s) for s in range(at, at + bad)]
    back = out.back_to_training_s(at)
    return {
        "trainer": trainer, "bad": bad, "at": at,
        "back_s": None if back is None else round(back, 3), "stall_s": round(out.max_gap_s(), 3),
        "step_s": round(out.median_step_s(), 4),
        "skipped": sum(bool(e.data["skipped"]) for e in first_pass),
        "holds": sum(e.data["guard"] == "hold" for e in out.steps()),
        "incidents": [{"rule": i["rule"], "outcome": i["outcome"],
                       "rung": (i["evidence"] or {}).get("escalation_rung",
                                                         ((i["evidence"] or {}).get("escalation") or {}).get("level", 0))}
                      for i in reversed(incidents)],
        "timeouts": len(out.of(EventType.TRAINER_TIMEOUT)),
        "lr_scale": out.steps()[-1].data["lr_scale"], "final_val": round(out.final_val, 4),
        "wall_s": round(out.wall_s, 1),
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'trainer':<8} {'bad':>3} {'back s':>7} {'stall s':>7} {'step s':>7} {'skipped':>7} {'holds':>5} "
            f"{'timeouts':>8} {'lr':>4}  incidents (outcome/rung)")
    lines = [head, "-" * len(head)]
    for r in rows:
        incs = ", ".join(f"{i['outcome']}/{i['rung']}" for i in r["incidents"]) or "none"
        lines.append(f"{r['trainer']:<8} {r['bad']:>3} {_f(r['back_s'], '.2f'):>7} {r['stall_s']:>7.2f} "
                     f"{r['step_s']:>7.3f} {r['skipped']:>3}/{r['bad']:<3} {r['holds']:>5} {r['timeouts']:>8} "
                     f"{r['lr_scale']:>4g}  {incs}")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (trainer, bad): runs, and the median and largest back_s and stall_s."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trainer"], r["bad"]), []).append(r)
    out = []
    for (trainer, bad), rs in groups.items():
        backs = [r["back_s"] for r in rs if r["back_s"] is not None]
        stalls = [r["stall_s"] for r in rs]
        out.append({"trainer": trainer, "bad": bad, "runs": len(rs),
                    "back_s_median": statistics.median(backs) if backs else None, "back_s_max": max(backs, default=None),
                    "stall_s_median": statistics.median(stalls), "stall_s_max": max(stalls)})
    return out


def summary_table(groups: list[dict[str, Any]]) -> str:
    head = f"{'trainer':<8} {'bad':>3} {'runs':>4} {'back s median':>13} {'max':>6} {'stall s median':>14} {'max':>6}"
    lines = [head, "-" * len(head)]
    lines += [f"{g['trainer']:<8} {g['bad']:>3} {g['runs']:>4} {_f(g['back_s_median'], '.2f'):>13} "
              f"{_f(g['back_s_max'], '.2f'):>6} {g['stall_s_median']:>14.2f} {g['stall_s_max']:>6.2f}" for g in groups]
    return "\n".join(lines)


def measure(trainer: str, bad: int, at: int, steps: int, broker: EmbeddedBroker, workdir: Path) -> dict[str, Any]:
    kafka = broker.kafka_config(topic_prefix=f"s{uuid.uuid4().hex[:10]}", partitions=2)
    ensure_topics(kafka)
    run = f"{trainer}-stretch-{bad}"
    here = workdir / kafka.topic_prefix  # a store and a spill of its own for each run
    with controller(kafka, here) as (engine, _url):
        out = run_scenario(Scenario(trainer=trainer, steps=steps, faults=stretch(at, bad)), run, kafka, here)
        with session_scope(engine) as s:
            incidents = read.incidents(s, run)
    return row(trainer, bad, at, out, incidents)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bad", default="1,3,5,10", help="stretch lengths, comma-separated")
    ap.add_argument("--trainers", default=",".join(TRAINERS), help=f"of {', '.join(TRAINERS)}")
    ap.add_argument("--repeat", type=int, default=1, help="runs per (trainer, length)")
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--at", type=int, default=60, help="the stretch's first step (after the baseline validations)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    bads = [int(x) for x in args.bad.split(",") if x.strip()]
    trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    if unknown := [t for t in trainers if t not in TRAINERS]:
        ap.error(f"--trainers: unknown {', '.join(unknown)}")
    if any(n < 1 for n in bads) or args.at + max(bads) + 10 > args.steps:
        ap.error("--bad: each length >= 1, and the stretch must end 10 steps before --steps")
    rows = []
    broker = EmbeddedBroker(port=0).start()
    try:
        with tempfile.TemporaryDirectory(prefix="cliffguard-bench-stretch-") as tmp:
            for _ in range(max(1, args.repeat)):
                for trainer in trainers:
                    for bad in bads:
                        rows.append(measure(trainer, bad, args.at, args.steps, broker, Path(tmp)))
                        print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        broker.stop()
    print(table(rows))
    groups = summary(rows)
    if args.repeat > 1:
        print(summary_table(groups))
    load = os.getloadavg()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load)}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"steps": args.steps, "at": args.at, "load_avg": load,
                                                    "rows": rows, "summary": groups}, indent=2, allow_nan=False))
    ok = all(r["back_s"] is not None and r["skipped"] == r["bad"] and not r["timeouts"] and r["lr_scale"] == 1
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
