"""``cliffguard report RUN [--html OUT] [--json OUT]``: a run's post-mortem from the store.

Without an output it prints the goodput breakdown and the incidents; ``--html OUT`` writes one
self-contained page (plots inline, the same content as JSON inside), ``--json OUT`` the content
as JSON (``-`` for standard output). ``cliffguard report --remedies [--days 7]``: what each remedy
(rollbacks, resumes, restarts, scale changes) cost across every run of the store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cliffguard.commands.controller import add_common, resolve_common
from cliffguard.commands.json_stdout import emit
from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="a run's post-mortem: goodput, incidents, costs (HTML or JSON)")
    p.add_argument("run", metavar="RUN", nargs="?", help="the run (or --remedies for every run's)")
    add_common(p)
    p.add_argument("--html", metavar="OUT", help="write the report as one self-contained HTML file")
    p.add_argument("--json", metavar="OUT", help="write the report's content as JSON ('-': standard output)")
    p.add_argument("--remedies", action="store_true",
                   help="what each remedy cost across runs (rollbacks, resumes, restarts, ...) over --days")
    p.add_argument("--days", type=float, default=7.0, help="with --remedies: the window, back from now (default 7)")
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.store_open import open_recorded_store
    from cliffguard.report.data import report_data
    from cliffguard.report.html import render

    try:
        store_cfg = resolve_common(args, ["store"])["store"]
    except ConfigError as exc:
        print(f"cliffguard report: {exc}")
        return 2
    if not args.run and not args.remedies:
        print("cliffguard report: give a RUN, or --remedies")
        return 2
    store = open_recorded_store(store_cfg, "report")
    if store is None:
        return 2
    try:
        with store.session() as s:
            if args.remedies:
                return _remedies(s, args)
            data = report_data(s, args.run)
    finally:
        store.close()
    if data is None:
        print(f"cliffguard report: run {args.run!r} is not in the store")
        return 1
    if args.json:
        text = json.dumps(data, default=str, indent=1, allow_nan=False)
        if args.json == "-":
            emit(text)
        else:
            Path(args.json).write_text(text + "\n")
            print(f"wrote {Path(args.json).resolve()}")
    if args.html:
        Path(args.html).write_text(render(data))
        print(f"wrote {Path(args.html).resolve()}")
    if not args.html and not args.json:
        print(text_summary(data))
    return 0


def _remedies(session, args: argparse.Namespace) -> int:
    import time

    from cliffguard.controller.store import read

    since = time.time() - args.days * 86400
    rows = read.remedy_costs(session, since=since, run_id=args.run)
    if args.json:
        emit(json.dumps({"since": since, "days": args.days, "remedies": rows}, indent=1))
        return 0
    print(f"what each remedy cost in the last {args.days:g} days" + (f" (run {args.run})" if args.run else ""))
    print(f"{'REMEDY':<14} {'COUNT':>6} {'SECONDS':>10} {'GPU-SECONDS':>12} {'STEPS LOST':>11}")
    for r in rows:
        print(f"{r['remedy']:<14} {r['count']:>6} {r['seconds']:>10.1f} {r['gpu_seconds']:>12.1f} {r['steps_lost']:>11}")
    if not rows:
        print("(none)")
    return 0


def text_summary(data: dict) -> str:
    """The goodput breakdown and the incidents' costs, as lines for a terminal."""
    g, run = data["goodput"], data["run"]
    lines = [f"run {run['id']}: {run['status']}, step {run['last_step']}"]
    if g is None:
        return "\n".join([*lines, "  no goodput ledger yet (the controller has booked no event of this run)"])
    lines.append(f"  ETTR {100 * (g['ettr'] or 0):.1f} % of {g['wall_s']:.1f} s wall "
                 f"({100 * (g['ettr_gpu'] or 0):.1f} % of GPU-seconds); {g['steps_lost']} steps lost")
    labels = {b["name"]: b["label"] for b in data["buckets"]}
    for b, s in sorted(g["seconds"].items(), key=lambda kv: -kv[1]):
        if s > 0:
            lines.append(f"  {labels[b]:<34} {s:>10.2f} s {100 * s / (g['wall_s'] or 1):>6.2f} %")
    for inc in data["incidents"]:
        c = inc["cost"] or {}
        lines.append(f"  incident {inc['id'][:8]} {inc['rule']} -> {inc['outcome']}: {c.get('seconds', 0):.1f} s, "
                     f"{c.get('steps_lost', 0)} steps lost")
    for r in data["restarts"]:
        lines.append(f"  {r['kind']} {r['key']}: {r['cost']['seconds']:.1f} s, {r['cost']['steps_lost']} steps lost")
    return "\n".join(lines)
