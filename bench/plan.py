"""The planner's estimate against published training runs.

``python -m bench.plan [--json OUT.json] [--mfu 0.5]``

For each row of ``cliffguard.plan.published.PUBLISHED`` (each citing its paper), the published
degrees are pinned, the estimator picks the fastest micro-batch (and recomputation, where the paper
leaves it open) that fits in memory, and its per-GPU TFLOP/s is compared with the published figure.
"""

from __future__ import annotations

import argparse
import json
import sys

from cliffguard.plan.layout import Cluster
from cliffguard.plan.published import check_all


def table(rows: list[dict]) -> str:
    lines = [f"{'run':<24}{'TP':>4}{'PP':>4}{'DP':>5}{'GPUs':>7}{'published':>11}{'estimate':>10}{'error':>8}"
             f"{'GiB':>7}  source"]
    for r in rows:
        est = "-" if r["estimated_tflops_per_gpu"] is None else f"{r['estimated_tflops_per_gpu']:.1f}"
        err = "no fit" if r["error"] is None else f"{r['error']:+.1%}"
        mem = "-" if r["estimate"] is None else f"{r['estimate']['memory_gb_per_device']:.1f}"
        lines.append(f"{r['name']:<24}{r['tp']:>4}{r['pp']:>4}{r['dp']:>5}{r['gpus']:>7}"
                     f"{r['published_tflops_per_gpu']:>11.1f}{est:>10}{err:>8}{mem:>7}  {r['source']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--mfu", type=float, default=Cluster.mfu, help="compute efficiency the estimator assumes")
    args = p.parse_args(argv)
    rows = [c.to_dict() for c in check_all(args.mfu)]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "plan", "mfu": args.mfu, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
