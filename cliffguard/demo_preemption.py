"""``cliffguard demo --preemption``: exploration preempts production on a real Slurm cluster, and
production shrinks instead of dying (issue 24).

On a one-machine Slurm cluster (cliffguard/slurm/, ``slurm-wlm`` 22.05 and ``munge``, started in
``<dir>/slurm`` on free ports), monitored like ``cliffguard demo`` (embedded broker, SQLite store,
controller: cliffguard/demo_stack.py):

1. a production run of two node-group jobs (``production`` class, each ``cliffguard train
   --nnodes 1:2``, one c10d rendezvous whose store this process hosts, so either group may be
   preempted) trains at the full world;
2. an exploration job is submitted (half the node's CPUs): Slurm preempts one group; every rank
   saves at the next step boundary, the preempted group leaves, and the other re-forms and keeps
   training at half the world with the declared batch policy (agent/recovery/preempt_leave.py);
3. the exploration job finishes; the requeued group starts again and the run scales back up;
4. a second exploration job takes the whole node: both groups are preempted, save, exit 75 and are
   requeued; when it finishes they start again and the run resumes where it saved and finishes.

Slurm holds a requeued job for about two minutes before it may start (its ``BeginTime``); once the
exploration job is gone the demo lifts that hold (``scontrol update JobId=N StartTime=now``, what
an operator does) so the run fits in minutes; ``--keep-requeue-delay`` leaves it. An uninterrupted
run of the same config (one launch of all the ranks, outside Slurm) trains at the same time: the
preempted run's final held-out loss must be within ``loss_tolerance`` of its.

The summary (cliffguard/demo_preemption_summary.py): ``ok``, every preemption as the controller
stored it (scope, the nodes that left, signal -> verified checkpoint seconds, steps lost, seconds
until training again), what preempted what (slurmctld's log), the scale events, both final losses.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cliffguard.demo_elastic import _kill_group, _read_json, _start

DEFAULT_DIR = "cliffguard-demo-preemption"
GROUPS = ("group-a", "group-b")


@dataclass(kw_only=True, slots=True)
class PreemptionDemoConfig:
    steps: int = 700
    """Long enough to train through both preemptions with room to spare (each is decided within seconds
    of the exploration job's submission, then the group saves and leaves; slower on a loaded machine)."""
    nproc: int = 1
    """Ranks per node group (the full world is twice this)."""
    global_batch: int = 16
    """Half of it at half the world (``proportional``); 8 made the loss noisy enough for a false spike."""
    explore_at: int = 20
    """The first exploration job is submitted once the run passes this step at the full world."""
    explore_steps: int = 30
    ckpt_every: int = 5
    grace_s: int = 30
    """The production partition's GraceTime."""
    deadline_s: float = 20.0
    """[agent.preemption] deadline_s: the save must verify this long after the signal (< grace_s)."""
    pace_s: float = 0.25
    """Rank 0 sleeps this long a step (the slow_rank fault) so the run outlasts Slurm's decisions;
    dropped after the last preemption (``config_text``)."""
    model: tuple[int, int, int] = (1, 2, 32)
    max_bytes: int = 300_000
    release_requeue_delay: bool = True
    loss_tolerance: float = 0.05
    out_dir: str = DEFAULT_DIR
    run: str = "production"
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        self.out_dir = str(Path(self.out_dir).resolve())  # the jobs run elsewhere than this process
        if self.nproc < 1 or self.global_batch % (2 * self.nproc):
            raise ValueError("global_batch: must split over the full world (2 x nproc)")
        if not 0 < self.explore_at < self.steps:
            raise ValueError("explore_at: need 0 < explore_at < steps")
        if not 0 < self.deadline_s < self.grace_s:
            raise ValueError("deadline_s: must be below grace_s (the exit needs a margin)")


def config_text(cfg: PreemptionDemoConfig, *, paced: bool) -> str:
    """The launches' config file. The pace (rank 0's ``slow_rank`` sleep) is there, not on the command
    line, because a requeued job reads it again: after the last preemption nothing is left to wait
    for, and the demo rewrites the file so the rest of the run trains at full speed (the sleep does
    not touch the math: the loss matches the reference's either way)."""
    pace = f'[train]\nfaults = ["slow_rank@0:{cfg.pace_s}"]\n' if paced else ""
    return f"{pace}[agent.preemption]\ndeadline_s = {cfg.deadline_s}\n"


def config_file(cfg: PreemptionDemoConfig, *, reference: bool = False) -> Path:
    return Path(cfg.out_dir) / ("reference.toml" if reference else "preemption.toml")


def train_args(cfg: PreemptionDemoConfig, *, run: str, rdzv: str, node: str | None, bootstrap: str | None,
               nproc: int) -> list[str]:
    layers, heads, width = cfg.model
    cfg_file = config_file(cfg, reference=node is None)  # the uninterrupted reference trains unpaced
    return ["--config", str(cfg_file), "--nnodes", "1:2" if node else "1:1", "--nproc", str(nproc), "--run", run,
            "--out-dir", cfg.out_dir, *(["--bootstrap", bootstrap] if bootstrap else ["--no-monitor"]),
            "--rdzv-endpoint", rdzv, *(["--rdzv-client", "--node-id", node] if node else []),
            "--rdzv-last-call-s", "5", "--rdzv-timeout-s", "600", "--max-restarts", "20",
            "--steps", str(cfg.steps), "--global-batch", str(cfg.global_batch), "--warmup-steps", "5",
            "--ckpt-every", str(cfg.ckpt_every), "--full-every", "0", "--snapshot-every", str(cfg.ckpt_every),
            "--val-every", "0", "--progress-every", "10", "--n-layer", str(layers), "--n-head", str(heads),
            "--n-embd", str(width), "--max-bytes", str(cfg.max_bytes), "--batch-policy", "proportional",
            "--lr-rule", "sqrt", "--collective-timeout-s", "30"]


def explore_args(cfg: PreemptionDemoConfig, n: int) -> list[str]:
    return ["--no-monitor", "--nproc", "1", "--run", f"exploration-{n}", "--out-dir", cfg.out_dir,
            "--steps", str(cfg.explore_steps), "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
            "--max-bytes", str(cfg.max_bytes), "--val-every", "0", "--ckpt-every", "0", "--full-every", "0"]


class Scenario:
    """The demo's moving parts and what it saw (the loop in ``run_preemption_demo`` drives it)."""

    def __init__(self, cfg: PreemptionDemoConfig, cluster: Any, stack: Any, rdzv: str, log) -> None:
        from cliffguard.demo_elastic import _paths

        self.cfg, self.cluster, self.stack, self.rdzv, self.log = cfg, cluster, stack, rdzv, log
        self.env = cluster.env(stack.trainer_env)
        self.mark_path, self.events_path = _paths(cfg)  # type: ignore[arg-type]  # same fields: out_dir, run
        self.jobs: dict[str, int] = {}
        self.explore: list[int] = []
        self.timeline: list[dict[str, Any]] = []
        self.t0 = time.time()

    def note(self, what: str, **data: Any) -> None:
        row = {"t": round(time.time() - self.t0, 1), "what": what, **data}
        self.timeline.append(row)
        self.log(f"preemption demo [{row['t']:>6.1f} s] {what}" + (f" {data}" if data else ""))

    def submit(self, cls: str, args: list[str], name: str, cpus: int) -> int:
        from cliffguard.slurm.jobs import batch_script, submit

        out = str(Path(self.cfg.out_dir) / "jobs" / f"{name}.out")
        job = submit(batch_script(cls, args, cpus=cpus, output=out, name=name), self.env)
        self.note(f"submitted {cls} job {job} ({name}, {cpus} CPUs)")
        return job

    def mark(self) -> dict[str, Any]:
        return _read_json(self.mark_path) or {}

    def queue(self) -> dict[int, dict[str, str]] | None:
        """The jobs squeue lists; None when it did not answer (not "no jobs")."""
        from cliffguard.slurm.jobs import jobs

        try:
            return {int(j["job"]): j for j in jobs(self.env)}
        except (RuntimeError, ValueError):
            return None

    def all_out(self, ids: list[int], state: str = "") -> bool:
        """Whether none of ``ids`` is in the queue (``state``: none of them in that state)."""
        q = self.queue()
        if q is None:
            return False
        return not any(j in q and (not state or q[j]["state"] == state) for j in ids)

    def release_held(self) -> None:
        """Lift Slurm's requeue hold (BeginTime) of the production jobs, once no exploration job is left."""
        from cliffguard.slurm.jobs import release

        q = self.queue()
        if q is None or any(j in q for j in self.explore):
            return
        for name, job in self.jobs.items():
            row = q.get(job)
            if row is not None and row["state"] == "PENDING" and row["reason"] == "BeginTime":
                try:
                    release(job, self.env)
                except RuntimeError as exc:
                    self.note(f"could not lift the requeue hold of job {job}: {exc}")
                    continue
                self.note(f"lifted the requeue hold of job {job} ({name})")


def _wait(cond, timeout_s: float, scenario: Scenario, what: str, release: bool = False) -> bool:
    end = time.time() + timeout_s
    while time.time() < end:
        if cond():
            return True
        if release and scenario.cfg.release_requeue_delay:
            scenario.release_held()
        if not scenario.stack.controller.running:
            scenario.note("the controller exited; see monitor/controller.log")
            return False
        time.sleep(0.5)
    scenario.note(f"timed out waiting for {what}; see {Path(scenario.cfg.out_dir) / 'jobs'} (the jobs' output) and "
                  f"{scenario.cluster.root} (slurmctld.log, slurmd.log)")
    return False


def drive(sc: Scenario) -> str:
    """The scenario; returns "" when every phase happened, else what did not."""
    cfg, full = sc.cfg, 2 * sc.cfg.nproc
    for name in GROUPS:
        sc.jobs[name] = sc.submit("production", train_args(cfg, run=cfg.run, rdzv=sc.rdzv, node=name,
                                                           bootstrap=sc.stack.bootstrap, nproc=cfg.nproc),
                                  name, cpus=2)
    if not _wait(lambda: sc.mark().get("world") == full and sc.mark().get("step", -1) >= cfg.explore_at, 300, sc,
                 "the production run at the full world"):
        return "the production run never trained at the full world"
    sc.note("production trains at the full world", step=sc.mark().get("step"))
    sc.explore.append(sc.submit("exploration", explore_args(cfg, 1), "exploration-1", cpus=2))
    if not _wait(lambda: sc.mark().get("world") == cfg.nproc, 240, sc, "the shrink"):
        return "production did not shrink to one group"
    sc.note("production shrank and trains on", step=sc.mark().get("step"), world=sc.mark().get("world"))
    if not _wait(lambda: sc.mark().get("world") == full, 360, sc, "the scale-up", release=True):
        return "production did not scale back up"
    back = int(sc.mark().get("step", 0))
    sc.note("production scaled back up", step=back)
    if not _wait(lambda: int(sc.mark().get("step", 0)) >= back + 10, 120, sc, "10 steps at the full world"):
        return "production did not train after the scale-up"
    sc.explore.append(sc.submit("exploration", explore_args(cfg, 2), "exploration-2", cpus=4))
    if not _wait(lambda: sc.all_out(list(sc.jobs.values()), "RUNNING"), 240, sc, "both groups preempted"):
        return "the whole-node exploration job did not preempt both groups"
    sc.note("both production groups preempted", step=sc.mark().get("step"))
    config_file(cfg).write_text(config_text(cfg, paced=False))  # read by the requeued launches
    sc.note("nothing left to wait for: the requeued groups train unpaced")
    if not _wait(lambda: sc.all_out([*sc.jobs.values(), *sc.explore]), cfg.timeout_s, sc, "the run to finish",
                 release=True):
        return "the production run did not finish"
    sc.note("production finished", step=sc.mark().get("step"))
    return ""


def run_preemption_demo(cfg: PreemptionDemoConfig, log=print) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    from cliffguard.controller.broker import free_port
    from cliffguard.demo_preemption_summary import facts, summarize
    from cliffguard.demo_stack import start_monitoring
    from cliffguard.procs import ProcessSet
    from cliffguard.slurm.cluster import Cluster, ClusterConfig

    out = Path(cfg.out_dir)
    for sub in (cfg.run, f"{cfg.run}-reference", "monitor", "jobs", "exploration-1", "exploration-2"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    config_file(cfg).write_text(config_text(cfg, paced=True))
    config_file(cfg, reference=True).write_text(config_text(cfg, paced=False))
    cluster = Cluster(ClusterConfig(dir=str(out / "slurm"), cpus=4, grace_s=cfg.grace_s, ctld_port=free_port(),
                                    slurmd_port=free_port()))
    procs, stack, reference, scenario = ProcessSet(), None, None, None
    problem = ""
    try:
        cluster.down()  # a cluster left by an interrupted demo in this directory
        cluster.up()
        log(f"preemption demo: Slurm up in {cluster.root} (SLURM_CONF={cluster.conf})")
        stack = start_monitoring(out / "monitor", procs, broker_port=0, say=log)
        port = free_port()
        rdzv_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                                   timeout=timedelta(seconds=cfg.timeout_s))  # outlives every group's job
        ref_dir = out / f"{cfg.run}-reference"
        ref_dir.mkdir(parents=True)
        reference = _start([sys.executable, "-m", "cliffguard", "train",
                            *train_args(cfg, run=f"{cfg.run}-reference", rdzv=f"127.0.0.1:{free_port()}", node=None,
                                        bootstrap=None, nproc=2 * cfg.nproc)], ref_dir / "launch.log")
        scenario = Scenario(cfg, cluster, stack, f"127.0.0.1:{port}", log)
        problem = drive(scenario)
        try:
            reference.wait(timeout=max(cfg.timeout_s - (time.time() - scenario.t0), 30))
        except Exception:  # noqa: BLE001 - judged below: no reference loss
            problem = problem or "the uninterrupted reference run did not finish"
        found = facts(cfg, scenario, stack, cluster)
        del rdzv_store
    finally:
        if reference is not None and reference.poll() is None:
            _kill_group(reference)
        cluster.down()
        procs.stop_all()
        if stack is not None:
            stack.close()
    summary = summarize(cfg, found, problem)
    summary["seconds"] = round(time.time() - scenario.t0, 1) if scenario is not None else None
    summary["timeline"] = scenario.timeline if scenario is not None else []
    summary["events_file"] = str(scenario.events_path) if scenario is not None else None
    return summary


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="cliffguard demo --preemption", description=__doc__.splitlines()[0])
    d = PreemptionDemoConfig()
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--dir", default=DEFAULT_DIR)
    p.add_argument("--keep-requeue-delay", action="store_true",
                   help="leave Slurm's ~2 minute hold on requeued jobs (the run then needs more --steps)")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    try:
        cfg = PreemptionDemoConfig(steps=args.steps, out_dir=args.dir, release_requeue_delay=not args.keep_requeue_delay)
    except ValueError as exc:
        print(f"cliffguard demo --preemption: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_preemption_demo(cfg)
    except RuntimeError as exc:  # Slurm not installed or not starting: said, not a traceback
        print(f"cliffguard demo --preemption: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2, default=str))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

