"""``cliffguard queue``: the priority classes, the jobs of the local cluster and what preempted what."""

from __future__ import annotations

import argparse
import json
import sys

from cliffguard.commands.json_stdout import emit


def add_parser(sub) -> argparse.ArgumentParser:
    from cliffguard.commands.slurm import add_cluster_args

    p = sub.add_parser("queue", help="the priority classes, the Slurm jobs and what preempted what",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print JSON")
    add_cluster_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.slurm import cluster_from
    from cliffguard.slurm.classes import CLASSES
    from cliffguard.slurm.jobs import jobs, preemptions

    cluster = cluster_from(args)
    try:
        rows = jobs(cluster.env())
    except (RuntimeError, OSError) as exc:
        print(f"cliffguard queue: {exc}", file=sys.stderr)
        return 1
    pre = preemptions(cluster.root / "slurmctld.log")
    if args.json:
        emit(json.dumps({"classes": [{"name": c.name, "tier": c.tier} for c in CLASSES], "jobs": rows,
                          "preemptions": pre}, indent=2))
        return 0
    print("classes: " + ", ".join(f"{c.name} (tier {c.tier})" for c in sorted(CLASSES, key=lambda c: -c.tier)))
    print(f"{'job':>6}  {'class':<12} {'state':<10} {'reason':<14} name")
    for r in rows:
        print(f"{r['job']:>6}  {r['class']:<12} {r['state']:<10} {r['reason']:<14} {r['name']}")
    for p in pre:
        print(f"{p['ts']}: job {p['job']} preempted (requeued) for job {p['by']}")
    return 0
