"""The integrations matrix: the demo's 2-fault scenario and a clean run under every trainer.

    python -m bench.integrations --json OUT.json
                                 [--trainers bundled,hf,lightning,plain,deepspeed,torchtitan,accelerate-tracker]
                                 [--steps 240] [--nproc 2]

Per trainer, ``cliffguard demo --trainer T --no-dashboard`` twice on the embedded broker and a
fresh controller: with the default faults (corrupted batches at 0.33 x steps, LR x100 at 0.62 x
steps) and ``--clean`` (no fault, same steps and seed). Reported per trainer: the demo's verdict
(``ok``), its incidents (outcome, spike_step, rollback_to, lr_scale), the LR scale the trainer
applied, the final loss (mean of the last 10 steps) faulted and clean and their ratio (the goal:
within 5 %), the commands the controller sent (0 for the report-only Accelerate tracker) and the
wall seconds of each run. Runs are sequential: each demo is a broker, a controller and a trainer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cliffguard.commands.demo import TRAINERS

DEFAULT_STEPS = 240
"""The demo tests' length: ~1 minute per run for the bundled trainer on 2 idle cores."""
GOAL = 0.05
"""Faulted final loss within 5 % of the clean run's."""
RUN_TIMEOUT_S = 1800


def run_demo(trainer: str, steps: int, nproc: int, out: Path, *, clean: bool) -> dict[str, Any]:
    """One ``cliffguard demo`` run; its JSON summary (or ``{"ok": False, "error": ...}``)."""
    name = f"{trainer}-{'clean' if clean else 'faulted'}"
    summary_path = out / f"{name}.json"
    argv = [sys.executable, "-m", "cliffguard.cli", "demo", "--trainer", trainer, "--steps", str(steps),
            "--nproc", str(nproc), "--no-dashboard", "--broker-port", "0", "--dir", str(out / name),
            "--json", str(summary_path), *(["--clean"] if clean else [])]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {RUN_TIMEOUT_S} s", "wall_s": RUN_TIMEOUT_S}
    if not summary_path.exists():
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stdout[-2000:]}",
                "wall_s": round(time.monotonic() - t0, 1)}
    return json.loads(summary_path.read_text())


def row(trainer: str, faulted: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """One trainer's figures from its two summaries (pure)."""
    fl, cl = faulted.get("final_loss"), clean.get("final_loss")
    ratio = fl / cl if fl is not None and cl else None
    return {
        "trainer": trainer, "ok": bool(faulted.get("ok")), "clean_ok": bool(clean.get("ok")),
        "incidents": [{k: i.get(k) for k in ("outcome", "spike_step", "rollback_to", "lr_scale")}
                      for i in faulted.get("incidents", [])],
        "alerts": faulted.get("alerts"), "lr_scale_applied": faulted.get("lr_scale_applied"),
        "steps_lost": faulted.get("steps_lost"), "final_loss_faulted": fl, "final_loss_clean": cl,
        "ratio": ratio, "within_5pct": ratio is not None and abs(ratio - 1) <= GOAL,
        "commands_sent": faulted.get("commands_sent"), "commands_sent_clean": clean.get("commands_sent"),
        "wall_s_faulted": faulted.get("wall_s"), "wall_s_clean": clean.get("wall_s"),
        "error": faulted.get("error") or clean.get("error"),
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'trainer':<19} {'ok':<3} {'incidents (outcome spike->to lr)':<44} {'applied':>7} {'loss faulted':>12} "
            f"{'clean':>7} {'ratio':>6} {'5%':<3} {'cmds':>4} {'wall s':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        incs = "; ".join(f"{i['outcome']} {i['spike_step']}" + (f"->{i['rollback_to']} x{i['lr_scale']:g}"
                                                                 if i["rollback_to"] is not None else "")
                         for i in r["incidents"]) or (f"{r['alerts']} alerts" if r["alerts"] else "none")
        wall = f"{_f(r['wall_s_faulted'], '.0f')}/{_f(r['wall_s_clean'], '.0f')}"
        lines.append(f"{r['trainer']:<19} {'yes' if r['ok'] else 'NO':<3} {incs[:44]:<44} "
                     f"{_f(r['lr_scale_applied'], 'g'):>7} {_f(r['final_loss_faulted'], '.4f'):>12} "
                     f"{_f(r['final_loss_clean'], '.4f'):>7} {_f(r['ratio'], '.3f'):>6} "
                     f"{'yes' if r['within_5pct'] else 'no':<3} {_f(r['commands_sent'], 'd'):>4} {wall:>11}")
        if r["error"]:
            lines.append(f"  error: {r['error'][:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainers", default=",".join(TRAINERS), help=f"comma-separated, of {', '.join(TRAINERS)}")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--nproc", type=int, default=2, help="processes for bundled, plain, deepspeed and torchtitan "
                    "(the others run 1)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    unknown = [t for t in trainers if t not in TRAINERS]
    if unknown:
        ap.error(f"--trainers: unknown {', '.join(unknown)} (known: {', '.join(TRAINERS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cliffguard-bench-integrations-") as tmp:
        for t in trainers:
            faulted = run_demo(t, args.steps, args.nproc, Path(tmp), clean=False)
            clean = run_demo(t, args.steps, args.nproc, Path(tmp), clean=True)
            rows.append(row(t, faulted, clean))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    out = {"steps": args.steps, "nproc": args.nproc, "load_avg": os.getloadavg(), "goal": GOAL, "rows": rows}
    print(table(rows))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2, allow_nan=False))
    return 0 if all(r["ok"] and r["clean_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
