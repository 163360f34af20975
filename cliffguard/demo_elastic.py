"""``cliffguard demo --elastic``: scale down and back up under torchrun's elastic agent, on CPUs.

Two ``cliffguard train --nnodes 1:2 --nproc 2`` launches (two torchrun agents of 2 processes,
one c10d rendezvous on a free local port) train one run at world 4. When the run passes
``kill_at`` the second agent and its worker group are killed (SIGKILL to its process group):
the survivors' next collective fails, their agent restarts them, the rendezvous completes with
one node, and they resume from the newest disk checkpoint at world 2 with half the global batch
(``proportional``) and the LR factor of the ``sqrt`` rule. When the run passes ``rejoin_at`` the
agent is started again: the first agent sees a node waiting, restarts its workers, and the run
resumes at world 4 with the declared batch. The trainers' rank 0 appends each scale event to
``elastic-events-<tag>.jsonl`` and keeps a progress mark (step, loss) beside the checkpoints;
the scale events and the final loss come from those.

Monitored like ``cliffguard demo`` (cliffguard/demo_stack.py: embedded broker, SQLite store
``<dir>/cliffguard.db``, controller) with its spike faults, injected before the kill: corrupted
data (3 batches: validation normal -> ``resumed``) and an LR blow-up (-> ``rolled_back`` before
it, LR x 0.5). The controller's windows are shortened for a run this short (``stable_window`` and
``recover_window``); the kill waits until no incident is open, so a scale change never lands in
the middle of a recovery. ``incidents`` and their verdict come from the store
(cliffguard/demo_summary.py).

``ok`` only when exactly the expected scale events happened (a scale-down 4 -> 2 with global
batch B/2, then a scale-up 2 -> 4 with B), every injected fault had its expected incident, and
the run reached its last step.

It runs from any directory: ``out_dir`` is made absolute before anything starts, and every path
handed to a child process (the run directory, the key files) is absolute; the children run in the
caller's directory with the caller's environment (the installed ``cliffguard``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = "cliffguard-demo-elastic"
"""Under the directory it is run from (made absolute at once)."""
AFTER_REJOIN = 60
"""Steps left after the rejoin by default: the rejoining agent takes tens of seconds to start, and
the run must still be training when it joins (~24 s at ``pace_s``)."""


@dataclass(kw_only=True, slots=True)
class ElasticDemoConfig:
    steps: int = 170
    kill_at: int = 100
    """The earliest kill step; the kill also waits until no incident is open."""
    rejoin_at: int = 110
    global_batch: int = 16
    ckpt_every: int = 5
    out_dir: str = DEFAULT_DIR
    run: str = "elastic-demo"
    timeout_s: float = 1100.0
    model: tuple[int, int, int] = (2, 2, 64)  # layers, heads, width
    max_bytes: int = 400_000
    pace_s: float = 0.4
    """Rank 0 sleeps this long every step (the slow_rank fault), so that on 2 loaded cores the
    rejoining agent (tens of seconds to start) joins while the run still has steps to go. The
    rejoining agent is started without it: both agents' workers read the run's one ``config.json``
    when the join restarts them, which the rejoining launcher writes, so the steps after the join
    run at full speed."""
    last_call_s: int = 10
    """The rendezvous' last call (``--rdzv-last-call-s``): how long the agent left alone after the
    kill waits for more nodes before it trains at world 2 (torchrun's default 30 s was most of the
    scale-down's 46 s); the second agent starts 3 s after the first, well inside it."""

    batch_policy: str = "proportional"
    """trainer/elastic.py's policies: ``proportional``/``halve`` (world 2 trains at B/2, the issue's
    scenario and the default) or ``keep`` (B via gradient accumulation)."""
    lr_rule: str = "sqrt"
    monitor: bool = True
    """Broker, store and controller, with ``faults``; False: a plain elastic run (the loss bench)."""
    faults: tuple[str, ...] = ("corrupt@45", "corrupt@46", "corrupt@47", "lr_blowup@75x100:3")
    """Spike faults as ``cliffguard train --fault`` takes them (those of ``cliffguard demo``). Not
    earlier: while the first ~30 steps' fast descent is in the spike rule's window its σ is wide
    (measured: corrupted batches at step 30, loss 6.1 vs 3.0, stayed below 5σ); the blow-up needs a
    stable checkpoint ``stable_window`` steps behind it."""
    stable_window: int = 15
    recover_window: int = 15
    """The controller's recovery windows (controller/recovery_types.py), short for a short run."""

    def __post_init__(self) -> None:
        self.out_dir = str(Path(self.out_dir).resolve())  # the children run elsewhere than this process
        if not 0 < self.kill_at < self.rejoin_at < self.steps:
            raise ValueError("kill_at: need 0 < kill_at < rejoin_at < steps")
        if self.global_batch % 8:
            raise ValueError("global_batch: must split over 4 ranks and, halved, over 2 (a multiple of 8)")
        if self.ckpt_every < 1 or self.ckpt_every >= self.rejoin_at - self.kill_at:
            raise ValueError("ckpt_every: must be >= 1 and below rejoin_at - kill_at")
        from cliffguard.trainer.elastic import BATCH_POLICIES, LR_RULES
        from cliffguard.trainer.faults import FaultSpec

        if self.batch_policy not in BATCH_POLICIES or self.lr_rule not in LR_RULES:
            raise ValueError(f"batch_policy: one of {BATCH_POLICIES}, lr_rule one of {LR_RULES}")
        for f in self.faults:
            try:
                spec = FaultSpec.parse(f)
            except ValueError as exc:
                raise ValueError(f"faults: {exc}") from None
            if spec.step >= self.kill_at:
                raise ValueError(f"faults: {f} is not before kill_at (spike faults run at world 4)")
        if self.faults and not self.monitor:
            raise ValueError("faults: need monitor (the controller handles them)")


def train_argv(cfg: ElasticDemoConfig, endpoint: str, world_nodes: str = "1:2", nproc: int = 2,
               bootstrap: str | None = None, paced: bool = True) -> list[str]:
    layers, heads, width = cfg.model
    stream = ["--bootstrap", bootstrap, *(a for f in cfg.faults for a in ("--fault", f))] if bootstrap else ["--no-monitor"]
    return [sys.executable, "-m", "cliffguard", "train", "--nnodes", world_nodes, "--nproc", str(nproc),
            "--run", cfg.run, "--out-dir", cfg.out_dir, *stream, "--rdzv-endpoint", endpoint,
            "--steps", str(cfg.steps), "--global-batch", str(cfg.global_batch), "--warmup-steps", "5",
            "--ckpt-every", str(cfg.ckpt_every), "--full-every", "0", "--snapshot-every", str(cfg.ckpt_every),
            "--val-every", "10" if bootstrap else "0", "--progress-every", "5", "--n-layer", str(layers), "--n-head", str(heads),
            "--n-embd", str(width), "--max-bytes", str(cfg.max_bytes), "--batch-policy", cfg.batch_policy,
            "--lr-rule", cfg.lr_rule, "--collective-timeout-s", "30", "--rdzv-timeout-s", "300", "--max-restarts", "6",
            "--rdzv-last-call-s", str(cfg.last_call_s),
            *(["--fault", f"slow_rank@0:{cfg.pace_s}"] if cfg.pace_s and paced else [])]


def _paths(cfg: ElasticDemoConfig) -> tuple[Path, Path]:
    from cliffguard.trainer.checkpoint_io import run_tag

    ckpt = Path(cfg.out_dir) / cfg.run / "checkpoints"
    tag = run_tag(cfg.run)
    return ckpt / f"elastic-progress-{tag}.json", ckpt / f"elastic-events-{tag}.jsonl"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def run_uninterrupted(cfg: ElasticDemoConfig) -> dict[str, Any]:
    """The same run on one agent of 4 processes, never interrupted (the loss baseline)."""
    from cliffguard.controller.broker import free_port

    run_dir = Path(cfg.out_dir) / cfg.run
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    t0 = time.time()
    proc = _start(train_argv(cfg, f"127.0.0.1:{free_port()}", world_nodes="1:1", nproc=4), run_dir / "agent.log")
    try:
        code = proc.wait(timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        code = -1
    mark = _read_json(_paths(cfg)[0]) or {}
    return {"exit": code, "final_loss": mark.get("loss"), "final_step": mark.get("step"),
            "seconds": round(time.time() - t0, 1)}


def _start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    fh = log.open("ab")
    return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ if env is None else env),
                            start_new_session=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launch and every process under it: torchrun starts each worker in a session of
    its own, so killing the launch's process group alone would leave the workers training."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in [psutil.Process(proc.pid), *tree] if proc.poll() is None else tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _open_incidents(store: Any, run_id: str) -> int | None:
    from cliffguard.controller.store import read

    try:
        with store.session() as s:
            return len(read.incidents(s, run_id, open_only=True))
    except Exception:  # noqa: BLE001 - a busy SQLite moment: ask again next poll
        return None


def run_elastic_demo(cfg: ElasticDemoConfig, log=print) -> dict[str, Any]:
    from cliffguard.controller.broker import free_port
    from cliffguard.procs import ProcessSet

    run_dir = Path(cfg.out_dir) / cfg.run
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    mark_path, events_path = _paths(cfg)
    t0 = time.time()
    procs = ProcessSet()
    stack = None
    first = second = None
    killed_at = rejoined_at = None
    try:
        env = None
        bootstrap = None
        if cfg.monitor:
            from cliffguard.demo_stack import start_monitoring

            monitor_dir = Path(cfg.out_dir) / "monitor"  # fresh store and keys: the summary is this run's
            if monitor_dir.exists():
                import shutil

                shutil.rmtree(monitor_dir)
            monitor_dir.mkdir(parents=True)
            stack = start_monitoring(monitor_dir, procs, broker_port=0, say=log, controller_env={
                "CLIFFGUARD_RECOVERY__STABLE_WINDOW": str(cfg.stable_window),
                "CLIFFGUARD_RECOVERY__RECOVER_WINDOW": str(cfg.recover_window)})
            env, bootstrap = stack.trainer_env, stack.bootstrap
        endpoint = f"127.0.0.1:{free_port()}"
        argv = train_argv(cfg, endpoint, bootstrap=bootstrap)
        first = _start(argv, run_dir / "agent-a.log", env)
        time.sleep(3.0)  # the first agent hosts the rendezvous store: it must outlive the second
        second = _start(argv, run_dir / "agent-b.log", env)
        while first.poll() is None and time.time() - t0 < cfg.timeout_s:
            time.sleep(0.5)
            if stack is not None and not stack.controller.running:
                log("elastic demo: the controller exited; see controller.log")
                break
            mark = _read_json(mark_path) or {}
            step = int(mark.get("step", -1))
            if killed_at is None and step >= cfg.kill_at and (stack is None or _open_incidents(stack.store, cfg.run) == 0):
                log(f"elastic demo: step {step}: killing the second agent's worker group")
                _kill_group(second)
                killed_at = step
            elif killed_at is not None and rejoined_at is None and step >= cfg.rejoin_at and _events(events_path):
                log(f"elastic demo: step {step} at world 2: the second agent rejoins")
                # unpaced: it rewrites the run's config.json, which every worker reads at the join's restart
                second = _start(train_argv(cfg, endpoint, bootstrap=bootstrap, paced=False), run_dir / "agent-b.log",
                                env)
                rejoined_at = step
        if first.poll() is None:
            log("elastic demo: timed out")
        if rejoined_at is not None:
            try:
                second.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        facts = _monitored_facts(cfg, stack, log) if stack is not None else None
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                _kill_group(proc)
        procs.stop_all()
        if stack is not None:
            stack.close()
    return summarize(cfg, _events(events_path), _read_json(mark_path) or {}, first.returncode, facts) | {
        "killed_at": killed_at, "rejoined_at": rejoined_at, "seconds": round(time.time() - t0, 1),
        "logs": [str(run_dir / "agent-a.log"), str(run_dir / "agent-b.log")]
        + ([str(Path(cfg.out_dir) / "monitor" / "controller.log")] if stack is not None else [])}


def _monitored_facts(cfg: ElasticDemoConfig, stack: Any, log) -> dict[str, Any]:
    """The store's view once the controller has read the run's tail (open incidents closed, or
    ``settle_s`` passed)."""
    from cliffguard.demo_stack import collect

    deadline = time.time() + 60
    while time.time() < deadline and _open_incidents(stack.store, cfg.run) != 0:
        time.sleep(1.0)
    facts = collect(stack.store, cfg.run)
    from cliffguard.controller.store import read

    with stack.store.session() as s:
        facts["stored_scale_events"] = read.elastic_events(s, cfg.run, limit=None)
    log(f"elastic demo: {len(facts['incidents'])} incidents in the store")
    return facts


def _judge_kill(kill_at: int, incidents: list[dict[str, Any]], unmatched: list[str]) -> dict[str, Any] | None:
    """The killed worker group as a fault of its own: the controller's hang rule may name it (its
    survivors wait in a collective) and the run trains again on the remaining node, an incident
    ``restarted``; or torchrun's elastic agent re-forms the group before the watchdog's dump, and
    there is none. Either is right; an incident of the kill with another outcome is not."""
    from cliffguard.demo_summary import MATCH_SLACK_STEPS

    inc = next((i for i in incidents if i["id"] in unmatched and i["rule"] == "hang"
                and kill_at <= i["spike_step"] < kill_at + MATCH_SLACK_STEPS), None)
    if inc is None:
        return None
    ok = inc["outcome"] == "restarted"
    return {"fault": f"kill@{kill_at}", "kind": "kill", "step": kill_at, "end": kill_at + 1, "expected": ["restarted"],
            "incident": inc["id"], "outcome": inc["outcome"], "ok": ok,
            "problem": None if ok else f"outcome {inc['outcome']}, expected restarted"}


def summarize(cfg: ElasticDemoConfig, events: list[dict[str, Any]], mark: dict[str, Any], exit_code: int | None,
              facts: dict[str, Any] | None) -> dict[str, Any]:
    """The verdict (pure): the scale events as expected, the faults' incidents as
    cliffguard/demo_summary.py judges them, and the run at its last step."""
    from cliffguard.demo_summary import judge
    from cliffguard.trainer.faults import FaultSpec

    scale = [{"step": e["step"], "from_world": e["from_world"], "to_world": e["to_world"],
              "global_batch": e["global_batch"], "lr": e["lr"], "lr_factor": e["lr_factor"],
              "steps_lost": e["steps_lost"], "seconds_lost": e["seconds_lost"]} for e in events]
    expected = [(4, 2, cfg.global_batch if cfg.batch_policy == "keep" else cfg.global_batch // 2),
                (2, 4, cfg.global_batch)]
    got = [(e["from_world"], e["to_world"], e["global_batch"]) for e in scale]
    finished = int(mark.get("step", -1)) >= cfg.steps and exit_code == 0
    incidents = [] if facts is None else facts["incidents"]
    faults_ok, fault_results, unmatched = judge([FaultSpec.parse(f) for f in cfg.faults], incidents)
    kill = _judge_kill(cfg.kill_at, incidents, unmatched)
    if kill is not None:
        fault_results.append(kill)
        unmatched = [i for i in unmatched if i != kill["incident"]]
        faults_ok = faults_ok and kill["ok"]
    stored = None if facts is None else [(e["from_world"], e["to_world"], e["global_batch"])
                                         for e in facts["stored_scale_events"]]
    fault_problems = "; ".join(f"{r['fault']}: {r['problem']}" for r in fault_results if r["problem"])
    problems = [f"scale events {got}, expected {expected}" if got != expected else "",
                "" if finished else f"run ended at step {mark.get('step')} (exit {exit_code})",
                "" if faults_ok else f"faults: {fault_problems or 'an incident halted or was abandoned'}",
                "" if stored in (None, got) else f"the store holds scale events {stored}, the trainer logged {got}"]
    return {"ok": not any(problems), "scale_events": scale,
            "incidents": [{k: i[k] for k in ("id", "rule", "outcome", "spike_step", "rollback_to", "lr_scale")}
                          for i in incidents],
            "faults": fault_results, "unmatched_incidents": unmatched, "final_loss": mark.get("loss"),
            "final_step": mark.get("step"), "steps_lost_to_rollbacks": None if facts is None else facts["steps_lost"],
            "problems": [p for p in problems if p]}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="cliffguard demo --elastic", description=__doc__.splitlines()[0])
    d = ElasticDemoConfig()
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--kill-at", type=int, help=f"default: {AFTER_REJOIN + 10} steps before the end with the spike "
                   "faults (which come first), step 12 without")
    p.add_argument("--rejoin-at", type=int, help=f"default: {AFTER_REJOIN} steps before the end with the faults, "
                   "6 after the kill without")
    p.add_argument("--no-faults", action="store_true", help="no spike faults: only the scale-down and -up")
    p.add_argument("--dir", default=DEFAULT_DIR)
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    kill_at = args.kill_at if args.kill_at is not None else 12 if args.no_faults else args.steps - AFTER_REJOIN - 10
    rejoin_at = args.rejoin_at if args.rejoin_at is not None else kill_at + 6 if args.no_faults else args.steps - AFTER_REJOIN
    try:
        cfg = ElasticDemoConfig(steps=args.steps, kill_at=kill_at, rejoin_at=rejoin_at, out_dir=args.dir,
                                **({"faults": ()} if args.no_faults else {}))
    except ValueError as exc:
        print(f"cliffguard demo --elastic: {exc}", file=sys.stderr)
        return 2
    summary = run_elastic_demo(cfg)
    print(json.dumps(summary, indent=2))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
