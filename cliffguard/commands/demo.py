"""``cliffguard demo``: the whole loop on one machine, watched live.

Starts, in this order and each in its own process group:

1. the embedded broker (Tansu) on 127.0.0.1:9092, or a free port when 9092 is taken, and the topics;
2. the controller (``cliffguard controller``) over a fresh SQLite store ``<dir>/cliffguard.db``, with
   a throwaway key set generated for this demo in ``<dir>/keys`` (``cliffguard keys generate``):
   the controller gets the Ed25519 private key and the agent secret, the trainer launcher the
   public key and the agent secret (its workers only the public key and their run's event key);
3. the dashboard (``cliffguard dashboard``) on 127.0.0.1:8501 (or a free port) with a generated
   operator token, both printed, and without any key (its actions are requests the controller
   signs);
4. a 2-process training run (``cliffguard train --nproc 2``) of the default GPT (``--trainer
   hf|lightning|plain|deepspeed|torchtitan|accelerate-tracker``: the same scenario under that library,
   trainer/demo_trainers/; the Accelerate tracker only reports, so it expects alerts and no command) with two faults:
   corrupted data (3 consecutive batches; the bundled trainer re-runs each and finds the batch
   bad wherever it runs -> skipped and listed, an incident ``cured`` per step, no pause; a trainer
   without re-runs: validation normal -> resume, samples flagged) and an LR blow-up (validation
   abnormal -> rollback to a stable checkpoint with LR x 0.5, resume).

While it trains, progress lines come from the trainer and a line per recovery transition from
the store (polled: what you see is what the controller recorded). At the end: a summary of every
incident, the steps lost to rollbacks and the final loss; ``--json PATH`` writes it as one object.
Exit code 0 only when every injected fault was handled as expected (see ``cliffguard.demo_summary``).
Logs: ``<dir>/{broker,controller,dashboard,train}.log``. The store stays behind for the dashboard
(``cliffguard dashboard --db sqlite:///<dir>/cliffguard.db``). Ctrl-C stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import secrets
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cliffguard.demo_stack import cli as _cli
from cliffguard.demo_stack import collect  # noqa: F401 - the demo's summary facts (re-exported)
from cliffguard.trainer.config import TrainConfig

DEFAULT_STEPS = 600
DEFAULT_DIR = "cliffguard-demo"
MARKER = ".cliffguard-demo"
"""Marks a directory the demo made; only such a directory (or an empty one) is emptied at start."""
CORRUPT_AT = 0.33
"""Default corrupted-data step, as a fraction of --steps."""
CORRUPT_STEPS = 3
"""Consecutive corrupted batches: a stretch the controller's spike rule is sure of (its evidence,
counted over the newest points, passes the budget's level: ``core/spike.py``), where one
ordinary bad batch may only be skipped by the in-process guard. The guard skips all three
updates; the bundled trainer's re-runs (docs/triage.md) find each batch bad and list it, and a
trainer without re-runs is paused, validated normal and resumed."""
BLOWUP_AT = 0.62
"""Default LR blow-up step, as a fraction of --steps: late enough for a stable checkpoint between
the two incidents, early enough for the controller's recover window (50 steps) before the end."""
BLOWUP_SPEC = "x100:3"
"""LR x100 for 3 steps. Only the first of them updates the weights (the guard skips the updates
of the steps whose loss spikes), and that one must damage them enough that the loss stays >= 5σ
for 3 steps and validation is far above the baseline: x30 left the loss at 5.0σ, too close."""
TRAINERS = ("bundled", "hf", "lightning", "plain", "deepspeed", "torchtitan", "accelerate-tracker")
"""``--trainer``: the others run ``trainer/demo_trainers/<name>_run.py`` (``-`` read as ``_``): plain,
deepspeed and torchtitan under torchrun with ``--nproc`` processes, the rest in one process."""
TORCHRUN_TRAINERS = ("plain", "deepspeed", "torchtitan")
"""Trainers started with ``--nproc`` processes (deepspeed and torchtitan under torchrun even for one)."""
REPORT_ONLY_TRAINERS = ("accelerate-tracker",)
"""Trainers that declare no command: judged by their alerts and by no command sent (demo_summary.judge_alerts)."""
_PROGRESS = re.compile(r"^step\s+\d+/\d+")
_NOTABLE = re.compile(r"Traceback|Error|rollback|rolled back|resumed|paused|halt|fault", re.IGNORECASE)


def default_faults(steps: int) -> list[str]:
    corrupt = int(steps * CORRUPT_AT)
    return [*(f"corrupt@{corrupt + i}" for i in range(CORRUPT_STEPS)), f"lr_blowup@{int(steps * BLOWUP_AT)}{BLOWUP_SPEC}"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="run the whole loop locally: broker, controller, dashboard, 2-process training "
                       "with faults", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"training steps (default {DEFAULT_STEPS})")
    p.add_argument("--faults", nargs="+", metavar="SPEC",
                   help="fault specs as in `cliffguard train --fault` (default: corrupt at 0.33*steps for "
                        f"{CORRUPT_STEPS} steps, lr_blowup@0.62*steps{BLOWUP_SPEC})")
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"store, logs and checkpoints (default ./{DEFAULT_DIR}; "
                   "emptied at start; a non-empty directory the demo did not make is refused)")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the summary as one JSON object")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--keep-running", action="store_true", help="leave the dashboard up after the run, until Ctrl-C")
    p.add_argument("--broker-port", type=int, default=9092, help="broker port (default 9092; a free one if taken)")
    p.add_argument("--dashboard-port", type=int, default=8501, help="dashboard port (default 8501; a free one if taken)")
    p.add_argument("--nproc", type=int, default=2, help="training processes (default 2; bundled, plain, "
                   "deepspeed and torchtitan run that many, hf, lightning and accelerate-tracker run 1)")
    p.add_argument("--preemption", action="store_true",
                   help="the preemption demo instead: on a one-machine Slurm cluster an exploration job preempts one "
                        "of two production node groups, production shrinks, scales back, then a whole-job preemption "
                        "(cliffguard/demo_preemption.py; --dir, --json and --steps apply)")
    p.add_argument("--elastic", action="store_true",
                   help="the elastic demo instead: two torchrun agents of 2 processes, one killed and brought back "
                        "(cliffguard/demo_elastic.py; --dir, --json, --steps and --clean apply)")
    p.add_argument("--trainer", choices=TRAINERS, default="bundled",
                   help="who trains: the bundled GPT trainer (default), or the same scenario under the Hugging "
                        "Face Trainer (extra [hf]), PyTorch Lightning (extra [lightning]), a DeepSpeed ZeRO-2 engine "
                        "(extra [deepspeed]) or torchtitan's Trainer (extra [torchtitan]) through their integrations, "
                        "a plain loop on the recovery kit, or an Accelerate loop with the report-only tracker "
                        "(expects alerts and no command)")
    p.add_argument("--clean", action="store_true",
                   help="no faults (a baseline run: same steps and seed, to compare the final loss with)")
    p.add_argument("--settle-s", type=float, default=60.0,
                   help="after training ends, wait at most this long for the controller to close open incidents")
    return p


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _pick_port(wanted: int, what: str) -> int:
    from cliffguard.demo_stack import pick_port

    return pick_port(wanted, what, _say)


def _wait_for(pred, timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll_s)
    return False


def halted_hint(run_id: str, db_url: str | None, dashboard: bool) -> str:
    """What a halted run waits for, and how to give it: a demo run with no dashboard otherwise just
    stood there until the trainer's own wait for a decision ran out."""
    db = f" --db {db_url}" if db_url else ""
    where = "the dashboard's operator actions, or " if dashboard else ""
    return (f"the run is HALTED and waits for a human: {where}in another shell "
            f"`cliffguard command {run_id} resume{db}` (or `rollback`, `stop`)")


class StoreWatch:
    """Polls the store for the run's transitions and prints each new one once."""

    def __init__(self, store: Any, run_id: str, db_url: str | None = None, dashboard: bool = True) -> None:
        self.store, self.run_id = store, run_id
        self.seen: set[int] = set()
        self.db_url, self.dashboard = db_url, dashboard

    def poll(self) -> None:
        from cliffguard.controller.store import read

        try:
            with self.store.session() as s:
                rows = read.transitions(s, self.run_id)
        except Exception as exc:  # noqa: BLE001 - a busy SQLite moment must not end the demo
            _say(f"store poll failed (retrying): {exc}")
            return
        for t in rows:
            if t["id"] in self.seen:
                continue
            self.seen.add(t["id"])
            _say(f"controller: step {t['step']}: {t['from_state']} -> {t['to_state']}: {t['reason']}")
            if t["to_state"] == "halted":
                _say(halted_hint(self.run_id, self.db_url, self.dashboard))

    def settled(self) -> bool:
        from cliffguard.controller.store import read

        with self.store.session() as s:
            run = read.get_run(s, self.run_id)
            open_incs = read.incidents(s, self.run_id, open_only=True)
        return run is not None and run["status"] != "running" and not open_incs


def trainer_command(args: argparse.Namespace, run_id: str, kafka: Any, out_dir: Path,
                    faults: list[str]) -> tuple[list[str], dict[str, str]]:
    """The training process's argv and the environment it needs beyond the demo's own."""
    progress_every = str(max(10, args.steps // 30))
    if args.trainer == "bundled":
        argv = _cli("train", "--nproc", str(args.nproc), "--bootstrap", kafka.bootstrap, "--run", run_id,
                    "--out-dir", str(out_dir / "runs"), "--steps", str(args.steps), "--progress-every", progress_every)
        batch = TrainConfig.__dataclass_fields__["global_batch"].default
        if batch % args.nproc:  # 16 does not split over 3 ranks: the next multiple of the world does
            argv += ["--global-batch", str(-(-batch // args.nproc) * args.nproc)]
        for f in faults:
            argv += ["--fault", f]
        return argv, {}
    module = f"cliffguard.trainer.demo_trainers.{args.trainer.replace('-', '_')}_run"
    launch = [sys.executable, "-m", module]
    if args.trainer in TORCHRUN_TRAINERS and (args.nproc > 1 or args.trainer in ("deepspeed", "torchtitan")):
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                  "-m", module, "--"]  # "--": torchrun would read --run as its own --run-path
    argv = [*launch, "--run", run_id, "--steps", str(args.steps), "--progress-every", progress_every]
    for f in faults:
        argv += ["--fault", f]
    # the integrations read Kafka from the deployment config, as every process does
    env = {"CLIFFGUARD_KAFKA__BOOTSTRAP": kafka.bootstrap, "CLIFFGUARD_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
           "CLIFFGUARD_KAFKA__PARTITIONS": str(kafka.partitions)}
    return argv, env


def run(args: argparse.Namespace) -> int:
    from cliffguard.trainer.faults import FaultSpec

    if args.preemption:
        from cliffguard import demo_preemption

        argv = ["--dir", args.dir if args.dir != DEFAULT_DIR else demo_preemption.DEFAULT_DIR]
        argv += ["--steps", str(args.steps)] if args.steps != DEFAULT_STEPS else []
        return demo_preemption.main(argv + (["--json", args.json_path] if args.json_path else []))
    if args.elastic:
        from cliffguard import demo_elastic

        argv = ["--dir", args.dir if args.dir != DEFAULT_DIR else demo_elastic.DEFAULT_DIR]
        argv += ["--steps", str(args.steps)] if args.steps != DEFAULT_STEPS else []  # its own default otherwise
        argv += ["--no-faults"] if args.clean else []
        return demo_elastic.main(argv + (["--json", args.json_path] if args.json_path else []))

    if args.steps < 50:
        print("cliffguard demo: --steps: must be >= 50", file=sys.stderr)
        return 2
    fault_texts = [] if args.clean else (args.faults or default_faults(args.steps))
    try:
        faults = [FaultSpec.parse(f) for f in fault_texts]
    except ValueError as exc:
        print(f"cliffguard demo: --faults: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    logging.getLogger("alembic").setLevel(logging.WARNING)  # schema setup is not news here
    # `kill <demo>` cleans up like Ctrl-C does (the finally below stops every child).
    previous = {sig: signal.signal(sig, h) for sig, h in ((signal.SIGTERM, _raise_interrupt),
                                                          (signal.SIGINT, signal.default_int_handler))}
    out_dir = Path(args.dir).resolve()
    marker = out_dir / MARKER
    if out_dir.exists() and any(out_dir.iterdir()) and not marker.exists():
        print(f"cliffguard demo: --dir {out_dir} is not empty and not a demo directory; not clearing it",
              file=sys.stderr)
        return 2
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a clean store each run: the summary must be about this run only
    out_dir.mkdir(parents=True)
    marker.write_text("made by `cliffguard demo`, which empties this directory at start\n")

    from cliffguard.commands.dashboard import without_command_secret
    from cliffguard.demo_stack import start_monitoring
    from cliffguard.procs import ProcessSet

    procs = ProcessSet()
    stopping = False
    stack = None
    try:
        stack = start_monitoring(out_dir, procs, broker_port=args.broker_port, say=_say)
        controller, env, db_url, store = stack.controller, stack.env, stack.db_url, stack.store

        if not args.no_dashboard:
            port = _pick_port(args.dashboard_port, "dashboard")
            token = secrets.token_urlsafe(12)
            # No secret for the dashboard: its operator actions are requests the controller signs.
            procs.spawn("dashboard", _cli("dashboard", "--db", db_url, "--port", str(port)),
                        env={**without_command_secret(env), "CLIFFGUARD_OPERATOR_TOKEN": token},
                        log_path=out_dir / "dashboard.log")
            _say(f"dashboard at http://127.0.0.1:{port}  (operator token: {token})")

        run_id = f"demo-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
        train_argv, train_env = trainer_command(args, run_id, stack.broker.kafka_config(partitions=1), out_dir, fault_texts)
        nproc = args.nproc if args.trainer in ("bundled", *TORCHRUN_TRAINERS) else 1
        _say(f"training run {run_id} ({args.trainer} trainer): {nproc} process(es), {args.steps} steps, "
             f"faults: {' '.join(fault_texts) or 'none'}")

        def show(line: str) -> None:
            if stopping:
                return  # the workers' KeyboardInterrupt tracebacks are in train.log; not news here
            if _PROGRESS.match(line) or _NOTABLE.search(line):
                print(f"  {line}", flush=True)

        trainer = procs.spawn("train", train_argv, log_path=out_dir / "train.log", on_line=show,
                              env={**stack.trainer_env, **train_env})
        watch = StoreWatch(store, run_id, db_url, dashboard=not args.no_dashboard)
        while trainer.running:
            if not controller.running:
                _say(f"the controller exited (code {controller.proc.returncode}); see {out_dir / 'controller.log'}")
                break
            watch.poll()
            time.sleep(1.0)
        train_rc = trainer.proc.wait() if controller.running else None
        if train_rc is not None and train_rc != 0:
            _say(f"training exited with code {train_rc}; see {out_dir / 'train.log'}")
        # The controller may still be reading the tail of the run (and closing the last incident).
        if controller.running:
            _wait_for(lambda: (watch.poll(), _safe(watch.settled))[1], args.settle_s, 1.0)
        watch.poll()

        facts = collect(store, run_id)
        summary = summarize(args, run_id, faults, facts, train_rc)
        summary.update({"wall_s": round(time.monotonic() - t0, 1), "db": db_url, "logs": str(out_dir)})
        ok = summary["ok"]
        from cliffguard.demo_summary import render

        print(render(summary), flush=True)
        if args.json_path:
            Path(args.json_path).write_text(json.dumps(summary, indent=2, allow_nan=False))
            _say(f"summary written to {args.json_path}")
        _say(f"the store stays in {out_dir / 'cliffguard.db'} "
             f"(cliffguard dashboard --db {db_url})")
        if args.keep_running and not args.no_dashboard:
            # The controller and broker stay too: the dashboard's operator actions go through them.
            _say("the dashboard stays up (with the controller and broker); Ctrl-C to stop")
            try:
                while any(c.running for c in procs.children if c.name == "dashboard"):
                    time.sleep(1.0)
            except KeyboardInterrupt:
                _say("stopping")
        return 0 if ok else 1
    except KeyboardInterrupt:
        stopping = True
        _say("interrupted; stopping everything")
        return 130
    finally:
        # A second Ctrl-C must not cut the cleanup short (each stop is bounded: ~20 s at most).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop_all()
        if stack is not None:
            stack.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def summarize(args: argparse.Namespace, run_id: str, faults: list[Any], facts: dict[str, Any],
              train_rc: int | None) -> dict[str, Any]:
    """The demo's summary of one run, ``ok`` judged per trainer: a recovering trainer by its
    incidents and by applying the LR scale the controller asked for; a report-only one by its
    alerts and by not one command sent."""
    from cliffguard.demo_summary import finite_or_none, judge, judge_alerts

    if args.trainer in REPORT_ONLY_TRAINERS:
        ok, fault_results, unmatched = judge_alerts(faults, facts["alerts"], facts["commands_sent"])
        ok = ok and not facts["incidents"]  # alert-only: the controller opens no incident it cannot act on
    else:
        ok, fault_results, unmatched = judge(faults, facts["incidents"])
        # the LR scale the controller asked for must be the one the trainer reports applying
        ok = ok and facts["lr_scale_applied"] is not None and math.isclose(facts["lr_scale_applied"],
                                                                           facts["lr_scale"] or 1.0)
    return {
        "ok": ok and train_rc == 0, "run": run_id, "trainer": args.trainer, "steps": args.steps,
        "clean": not faults, "faults": fault_results, "incidents": facts["incidents"],
        "unmatched_incidents": unmatched, "final_loss": finite_or_none(facts["final_loss"]),
        "initial_loss": finite_or_none(facts["initial_loss"]), "steps_lost": facts["steps_lost"],
        "flagged_samples": facts["flagged_samples"], "listed_samples": facts.get("listed_samples", 0),
        "lr_scale": facts["lr_scale"],
        "lr_scale_applied": facts["lr_scale_applied"], "run_status": facts["run_status"],
        "alerts": len(facts["alerts"]), "commands_sent": facts["commands_sent"], "train_exit_code": train_rc,
        "validation": facts.get("validation"),  # what the trainer's validations cost (run.finished)
    }


def _safe(fn) -> bool:
    try:
        return bool(fn())
    except Exception:  # noqa: BLE001 - retried by the caller's loop
        return False


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt
