"""``cliffguard slurm up|down|status``: a one-machine Slurm cluster for local use and tests
(cliffguard/slurm/cluster.py). ``up`` prints the ``SLURM_CONF`` to export for sbatch/squeue."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("slurm", help="a one-machine Slurm cluster: up, down, status", description=__doc__)
    p.add_argument("action", choices=["up", "down", "status"])
    add_cluster_args(p)
    return p


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    from cliffguard.slurm.cluster import default_dir

    p.add_argument("--dir", default=default_dir(), help="the cluster's directory (default %(default)s)")
    p.add_argument("--cpus", type=int, default=4, help="CPUs the node claims (default 4)")
    p.add_argument("--grace-s", type=int, default=30, help="production's GraceTime in seconds (default 30)")


def cluster_from(args: argparse.Namespace):
    from cliffguard.slurm.cluster import Cluster, ClusterConfig

    return Cluster(ClusterConfig(dir=args.dir, cpus=args.cpus, grace_s=args.grace_s))


def run(args: argparse.Namespace) -> int:
    try:
        cluster = cluster_from(args)
        if args.action == "up":
            cluster.up()
            print(f"slurm up: export SLURM_CONF={cluster.conf}")
        elif args.action == "down":
            print("stopped: " + (", ".join(cluster.down()) or "nothing was running"))
        else:
            print(cluster.status())
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"cliffguard slurm {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0
