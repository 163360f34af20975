"""The triage ladder against one fault of each class, on a multi-process CPU run.

    python -m bench.triage --json OUT.json [--world 4] [--only data,sdc]

Each fault runs on its own ``--world``-process job (gloo, spawned processes): a plain data-parallel
loop (a small MLP, SGD, gradients all-reduced by the loop, every batch a function of (step, shard))
with the agent, the recovery kit and its re-runs, and the SDC watch. Rank 0's commands come from the
controller's own rules and recovery machine run in-process on rank 0's events
(bench/triage_controller.py). The faults, injected by the loop (not by product code):

- ``data``: rank 1's shard at step F is poisoned (targets x1000) wherever it is computed;
- ``transient``: rank 1's forward output at step F is x1000 the first time only (a one-off flipped
  exponent bit in its arithmetic);
- ``bad_rank``: rank 1's forward output is x1000 at every step from F on, whatever shard it gets;
- ``sdc``: one mantissa bit of the last rank's first weight flips before step F's forward (silent:
  no loss moves).

A clean run (no fault) is the reference: a correct cure of a transient or an SDC leaves the final
weights bit-identical to it (CPU runs are deterministic), so "no bad update reached the weights" is
checked exactly. Per fault: the class chosen, the remedy, the rank named, steps and seconds lost,
whether a bad update was applied, whether a skipped batch was fed again. Goals: every class right,
0 bad updates, 0 skipped batches replayed, the SDC named within the check period.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from bench.triage_worker import EVERY, FAULT_AT, STEPS, worker

FAULTS = ("data", "transient", "bad_rank", "sdc")
EXPECTED = {"data": "data", "transient": "transient", "bad_rank": "bad_rank", "sdc": "sdc"}
CONTROLLER_MOVES = {"data": ("triage_cured",), "transient": ("triage_cured",),
                    "bad_rank": ("evict", "restart_unavailable"), "sdc": ("sdc",)}
"""The recovery machine's answer to each (a bad rank is evicted; spawned processes have no torchrun
to restart without it, so it is halted for a human with the node named)."""


def run_job(fault: str, world: int, tmp: Path) -> list[dict[str, Any]]:
    out = tmp / fault
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    mp.spawn(worker, args=(fault, world, str(out / "init"), str(out)), nprocs=world)
    ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(world)]
    ranks[0]["wall_s"] = round(time.monotonic() - t0, 2)
    return ranks


def judge(fault: str, ranks: list[dict[str, Any]], clean: list[dict[str, Any]], world: int) -> dict[str, Any]:
    r0 = ranks[0]
    row: dict[str, Any] = {"fault": fault, "world": world, "expected": EXPECTED[fault], "wall_s": r0["wall_s"]}
    finals_agree = all(r["final"] == r0["final"] for r in ranks)
    replayed = sum(r["replayed"] for r in ranks)
    if fault == "sdc":
        mismatch = next((c for c in r0["checks"] if not c["agree"]), None)
        rollbacks = [c for c in r0["commands"] if c["type"] == "rollback"]
        row |= {"class": "sdc" if mismatch else "none",
                "rank": (mismatch["suspects"][0] if mismatch and mismatch["named"] and len(mismatch["suspects"]) == 1
                         else None),
                "detect_steps": None if mismatch is None else mismatch["step"] - FAULT_AT,
                "remedy": (f"rollback to {rollbacks[0]['args']['to_step']}, lr_scale {rollbacks[0]['args']['lr_scale']:g}"
                           if rollbacks else "none")}
        lost = mismatch["step"] - rollbacks[0]["args"]["to_step"] if mismatch and rollbacks else 0
        row["steps_lost"] = lost
        row["seconds_lost"] = round(lost * r0["step_s"], 3)
        # cured: the replicas agree again and the weights are the clean run's, bit for bit
        row["bad_update_applied"] = not (finals_agree and r0["final"] == clean[0]["trace"][str(STEPS[fault])])
    else:
        first = next((t for t in r0["triaged"] if t["step"] == FAULT_AT), None)
        row |= {"class": first["class"] if first else "none", "rank": first.get("rank") if first else None,
                "remedy": first["remedy"] if first else "none", "detect_steps": 0 if first else None,
                "steps_lost": sum(1 for t in r0["triaged"] if not t["update_applied"]),
                "seconds_lost": round(sum(t["rerun_s"] for t in r0["triaged"]), 3)}
        if fault == "transient":  # retried clean: the same update the clean run applied
            row["bad_update_applied"] = not (finals_agree and r0["final"] == clean[0]["trace"][str(STEPS[fault])])
        else:  # the fault step's update (and a bad rank's later ones) never applied
            bad_steps = [s for s in range(FAULT_AT, STEPS[fault]) if fault == "bad_rank" or s == FAULT_AT]
            row["bad_update_applied"] = any(r0["applied"].get(str(s), False) for s in bad_steps) or not finals_agree
    row["skipped_replayed"] = replayed
    # what the controller's recovery machine did about it: its first move at or after the fault
    moves = [m for m in r0["story"] if m["step"] is not None and m["step"] >= FAULT_AT - 1]
    row["controller"] = f"{moves[0]['trigger']} -> {moves[0]['to']}" if moves else "nothing"
    row["lr_cut"] = any(c["args"].get("lr_scale", 1.0) < 1.0 for c in r0["commands"])  # none of these is the optimizer's
    row["ok"] = (row["class"] == row["expected"] and not row["bad_update_applied"] and replayed == 0
                 and not row["lr_cut"] and row["controller"].split(" ")[0] in CONTROLLER_MOVES[fault]
                 and (fault != "sdc" or (row["detect_steps"] is not None and row["detect_steps"] <= EVERY)))
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ("fault", "class", "rank", "remedy", "controller", "lr_cut", "detect_steps", "steps_lost", "seconds_lost", "bad_update_applied",
            "skipped_replayed", "wall_s", "ok")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c)) for c in cols))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.triage", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True, help="write the rows and totals here")
    p.add_argument("--world", type=int, default=4, help="processes per job (3 or more: an SDC rank can be named)")
    p.add_argument("--only", default=",".join(FAULTS), help="comma-separated faults (default: all)")
    args = p.parse_args(argv)
    faults = [f for f in args.only.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown or args.world < 2:
        p.error(f"unknown faults {unknown} (known: {', '.join(FAULTS)})" if unknown else "--world: at least 2")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-triage-") as d:
        tmp = Path(d)
        clean = run_job("clean", args.world, tmp)
        rows = [judge(f, run_job(f, args.world, tmp), clean, args.world) for f in faults]
    totals = {"faults": len(rows), "correct_class": sum(r["class"] == r["expected"] for r in rows),
              "bad_updates_applied": sum(bool(r["bad_update_applied"]) for r in rows),
              "skipped_replayed": sum(r["skipped_replayed"] for r in rows), "ok": all(r["ok"] for r in rows)}
    print_table(rows)
    print(json.dumps(totals))
    Path(args.json).write_text(json.dumps({"world": args.world, "check_every": EVERY, "fault_at": FAULT_AT,
                                           "rows": rows, "totals": totals}, indent=2))
    return 0 if totals["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
