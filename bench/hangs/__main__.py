"""Hangs, from the stuck collective to training again: ``python -m bench.hangs --json OUT
[--kinds sleep,kill,stuck,straggler,again] [--nproc 4] [--no-baseline] [--dir DIR]``.

Each kind (bench/hangs/kinds.py) is a real ``cliffguard train`` run under torchrun on CPUs (gloo)
with the agent attached, the embedded broker and a ``cliffguard controller``: a hang fault fires
at step ``--fault-step`` (trainer/hang_faults.py, outside the product code), and the bench
measures from the fault's own clock (bench/hangs/measure.py):

- ``detect_s``: the first rank's evidence in the store (its watchdog's dump, or a failed
  collective's);
- ``named_s``: the hang incident opened, naming ``culprit`` (``culprit_correct``: the injected
  rank), the collective and the frame;
- ``new_life_process_s``: torchrun started the next life's first worker process (both modes);
  ``restart_begun_s``: that life said ``run.started`` (its imports and set-up done; cliffguard);
- ``training_again_s``: its first step; ``steps_lost``: steps redone (from the newest disk
  checkpoint);
- ``left_waiting``: ranks of the torn-down life still alive after training again, and
  ``old_life_last_seen_s``: how long the longest of them lived (nothing may wait on a timeout).

The baseline is the same run without a controller: torchrun's restart-everything behaviour with
the same declared ``--collective-timeout-s`` (torch's own default is 1800 s; the waiting ranks
would wait that long), measured from the worker processes and rank 0's progress lines. The
``straggler`` kind must never be restarted; ``again`` (two nodes, elastic) hangs twice and is
restarted without the culprit's node the second time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.hangs.kinds import Kind, kinds
from bench.hangs.launch import Watched
from bench.hangs.measure import baseline, monitored

DEFAULT_KINDS = "sleep,kill,stuck,straggler,again"


def train_argv(args: argparse.Namespace, kind: Kind, run: str, out_dir: Path, *, bootstrap: str | None,
               node: str = "", endpoint: str = "") -> list[str]:
    stream = ["--bootstrap", bootstrap] if bootstrap else ["--no-monitor"]
    layout = (["--nproc", str(args.nproc)] if kind.nodes == 1 else
              ["--nproc", str(args.nproc // kind.nodes), "--nnodes", f"1:{kind.nodes}", "--rdzv-endpoint", endpoint,
               "--node-id", node, "--rdzv-timeout-s", "300", "--rdzv-last-call-s", "5"])
    return [sys.executable, "-m", "cliffguard", "train", *layout, "--run", run, "--out-dir", str(out_dir), *stream,
            "--steps", str(args.fault_step + args.steps_after), "--global-batch", "16", "--warmup-steps", "5",
            "--ckpt-every", "5", "--full-every", "0", "--snapshot-every", "5", "--val-every", "0",
            "--progress-every", "1", "--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--max-bytes", "400000",
            "--peak-flops", "1e11", "--collective-timeout-s", str(args.collective_timeout_s),
            "--hang-dump-after-s", str(args.dump_after_s), "--max-restarts", "3",
            *(a for f in kind.faults for a in ("--fault", f))]


def run_kind(args: argparse.Namespace, kind: Kind, root: Path, stack: Any | None, say) -> dict[str, Any]:
    from cliffguard.controller.broker import free_port
    from cliffguard.procs import ProcessSet

    mode = "cliffguard" if stack is not None else "torchrun"
    run = f"hang-{kind.name}-{mode}-{uuid.uuid4().hex[:4]}"
    out_dir = root / "runs"
    env = dict(stack.trainer_env if stack is not None else {**os.environ, "PYTHONUNBUFFERED": "1"})
    bootstrap = stack.bootstrap if stack is not None else None
    procs = ProcessSet()
    t0 = time.time()
    launches: list[Watched] = []
    try:
        if kind.nodes == 1:
            launches.append(Watched.start(procs, run, train_argv(args, kind, run, out_dir, bootstrap=bootstrap), env,
                                          root / f"{run}.log"))
        else:
            endpoint = f"127.0.0.1:{free_port()}"
            for i in range(kind.nodes):
                node = f"node-{chr(ord('a') + i)}"
                argv = train_argv(args, kind, run, out_dir, bootstrap=bootstrap, node=node, endpoint=endpoint)
                launches.append(Watched.start(procs, f"{run}-{node}", argv, env, root / f"{run}-{node}.log"))
                time.sleep(3.0)  # the first agent hosts the rendezvous store
        while any(la.code is None for la in launches) and time.time() - t0 < args.kind_timeout_s:
            time.sleep(0.5)
        timed_out = any(la.code is None for la in launches)
        if stack is not None:
            time.sleep(3.0)  # the controller reads the run's tail
            figures = monitored(kind, stack.store, run, out_dir / run, launches)
        else:
            figures = baseline(kind, out_dir / run, launches[0])
    finally:
        for la in launches:
            la.close()
        procs.stop_all(grace_s=5.0)
    figures.update(kind=kind.name, what=kind.what, mode=mode, run=run, seconds=round(time.time() - t0, 1),
                   timed_out=timed_out, expected_culprit=list(kind.culprit), expected_restarts=list(kind.restarts))
    figures["ok"] = judge(kind, figures, mode, args.goal_s)
    say(f"{kind.name:<10} {mode:<10} {summary(figures)}")
    return figures


def judge(kind: Kind, f: dict[str, Any], mode: str, goal_s: float = 60.0) -> bool:
    """cliffguard: the culprit named correctly and the expected remedy each time, training again
    within ``goal_s`` of the hang, nothing left waiting, the run finished; the straggler never restarted."""
    if mode != "cliffguard":
        return True
    eps = f["episodes"]
    if not kind.restarts:
        return not eps and f["hang_incidents"] == 0 and f["lives"] == [0] and not f["timed_out"]
    return (len(eps) == len(kind.restarts) and all(e["culprit_correct"] for e in eps)
            and [e["remedy"] for e in eps] == list(kind.restarts)
            and all(e["training_again_s"] is not None and e["training_again_s"] <= goal_s for e in eps)
            and not any(e["left_waiting"] for e in eps) and not f["timed_out"])


def summary(f: dict[str, Any]) -> str:
    if not f["episodes"]:
        return f"no hang (lives {f['lives']}, last step {f.get('last_step')}); ok={f['ok']}"
    parts = []
    for e in f["episodes"]:
        parts.append(f"detect {e['detect_s']}s named {e['named_s']}s {e['culprit']} -> {e['remedy']} "
                     f"restart {e['restart_begun_s']}s again {e['training_again_s']}s lost {e['steps_lost']} "
                     f"waiting {e['left_waiting']} (old life seen until {e['old_life_last_seen_s']}s)")
    return "; ".join(parts) + f"; ok={f['ok']}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("kind", "mode", "detect s", "named s", "culprit ok", "remedy", "new life s", "run.started s",
            "training again s", "steps lost", "left waiting")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        for e in r["episodes"] or [None]:
            cells = [r["kind"], r["mode"]] + (["-"] * 9 if e is None else [
                e["detect_s"], e["named_s"], e["culprit_correct"] if r["mode"] == "cliffguard" else "no culprit named",
                e["remedy"], e["new_life_process_s"], e["restart_begun_s"], e["training_again_s"], e["steps_lost"],
                e["left_waiting"] or "none"])
            out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", dest="json_path", required=True)
    p.add_argument("--kinds", default=DEFAULT_KINDS)
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4; the 'again' kind runs 2 nodes of nproc/2)")
    p.add_argument("--fault-step", type=int, default=27, help="the step the fault fires at (checkpoints every 5)")
    p.add_argument("--steps-after", type=int, default=13)
    p.add_argument("--collective-timeout-s", type=float, default=30.0)
    p.add_argument("--dump-after-s", type=float, default=6.0)
    p.add_argument("--no-baseline", action="store_true", help="skip torchrun alone")
    p.add_argument("--kind-timeout-s", type=float, default=300.0)
    p.add_argument("--goal-s", type=float, default=60.0,
                   help="training again within this many seconds of the hang counts as ok (default 60)")
    p.add_argument("--dir", help="keep logs and stores here (default: a temporary directory, removed)")
    args = p.parse_args(argv)
    table_of = kinds(args.nproc, args.fault_step)
    names = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [n for n in names if n not in table_of]
    if unknown:
        p.error(f"--kinds: unknown {unknown}; known: {', '.join(table_of)}")
    import tempfile

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-hangs-"))
    root.mkdir(parents=True, exist_ok=True)
    from cliffguard.demo_stack import start_monitoring
    from cliffguard.procs import ProcessSet

    rows: list[dict[str, Any]] = []
    procs = ProcessSet()
    stack = start_monitoring(root, procs, broker_port=0, say=print)
    t0 = time.time()
    load0 = os.getloadavg()[0]
    try:
        for name in names:
            kind = table_of[name]
            rows.append(run_kind(args, kind, root, stack, print))
            if kind.baseline and not args.no_baseline:
                rows.append(run_kind(args, kind, root, None, print))
    finally:
        procs.stop_all()
        stack.close()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    out = {"nproc": args.nproc, "goal_s": args.goal_s, "fault_step": args.fault_step, "collective_timeout_s": args.collective_timeout_s,
           "dump_after_s": args.dump_after_s, "torch_default_timeout_s": 1800.0, "load_avg_start": load0,
           "load_avg_end": os.getloadavg()[0], "seconds": round(time.time() - t0, 1), "rows": rows,
           "ok": all(r["ok"] for r in rows)}
    print(table(rows))
    Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
