"""``cliffguard submit --class exploration|production [--] TRAIN ARGS``: ``cliffguard train`` as a
Slurm batch job of a priority class (cliffguard/slurm/jobs.py; the classes: cliffguard/slurm/classes.py).
A requeued job restarts with ``--resume``. Prints the job id."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    from cliffguard.commands.slurm import add_cluster_args

    p = sub.add_parser("submit", help="submit cliffguard train to Slurm as an exploration or production job",
                       description=__doc__)
    p.add_argument("--class", dest="cls", required=True, help="exploration | production")
    p.add_argument("--job-cpus", type=int, default=4, help="CPUs the job asks for (default 4: the whole node)")
    p.add_argument("--signal-before-s", type=int, default=0,
                   help="ask for SIGUSR1 this many seconds before the time limit (--signal=B:USR1@N; 0 = none)")
    p.add_argument("--output", help="the job's log (default <cluster dir>/jobs/%%j.out)")
    p.add_argument("--name", default="cliffguard", help="job name")
    add_cluster_args(p)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="arguments of cliffguard train (after --)")
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.slurm import cluster_from
    from cliffguard.slurm.jobs import batch_script, submit

    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    try:
        cluster = cluster_from(args)
        output = args.output or str(Path(cluster.root) / "jobs" / "%j.out")
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        script = batch_script(args.cls, train_args, cpus=args.job_cpus, output=str(Path(output).resolve()),
                              signal_before_s=args.signal_before_s, name=args.name)
        job = submit(script, cluster.env())
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"cliffguard submit: {exc}", file=sys.stderr)
        return 2
    print(job)
    return 0
