"""The fault-injection suite: ``python -m bench.faults --json OUT [--only A,B] [--smoke] [--pg-url URL]``.

Every scenario attacks the real parts (the embedded broker, ``cliffguard controller`` processes,
the agent, the trainer's checkpoints, SQLite and PostgreSQL) and counts what came out: events
produced vs stored, commands sent vs obeyed, forged commands obeyed, rollbacks, time to recover.
Without ``--pg-url`` a throwaway PostgreSQL cluster is started when a selected scenario needs one
and removed afterwards. Writes one row per scenario plus ``totals`` (goal: every count 0);
exits 1 when a scenario that ran did not pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from bench.faults.pg import ThrowawayPostgres
from bench.faults.registry import scenarios
from bench.faults.runner import markdown, run_one, table, totals
from cliffguard.controller.broker import EmbeddedBroker


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the rows and totals here")
    p.add_argument("--only", help="comma-separated scenario names")
    p.add_argument("--smoke", action="store_true", help="the CI subset: fast, broker + SQLite only")
    p.add_argument("--pg-url", help="a PostgreSQL database to use (default: a throwaway cluster)")
    p.add_argument("--budget-s", type=float, default=1500.0,
                   help="the whole run's time limit (default 1500 = 25 min); a scenario gets what is left at most")
    p.add_argument("--keep", help="keep each scenario's directory (logs, stores) under this folder")
    p.add_argument("--list", action="store_true", help="print the scenarios and exit")
    p.add_argument("--markdown", action="store_true", help="also print the README's table")
    args = p.parse_args(argv)
    known = scenarios()
    if args.list:
        for sc in known.values():
            print(f"{sc.name:<36}{sc.family:<15}{sc.hole}")
        return 0
    selected = list(known.values())
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            p.error(f"--only: unknown scenario(s) {', '.join(unknown)}; --list shows them")
        selected = [known[n] for n in names]
    if args.smoke:
        selected = [sc for sc in selected if sc.smoke]
    keep = Path(args.keep) if args.keep else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows = []
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(EmbeddedBroker(port=0))
        pg_url = args.pg_url
        if pg_url is None and any(sc.postgres for sc in selected):
            pg_url = stack.enter_context(ThrowawayPostgres()).url
            print(f"faults: throwaway PostgreSQL on {pg_url.rsplit('@', 1)[1]}", flush=True)
        for i, sc in enumerate(selected, 1):
            row = run_one(sc, broker.bootstrap, pg_url, keep, args.budget_s - (time.monotonic() - t0))
            rows.append(row)
            print(f"[{i:>2}/{len(selected)}] {sc.name:<36} {row['status']:<8} {row['seconds']:6.1f}s  "
                  f"{row['detail'][:110]}", flush=True)
    out = {"totals": totals(rows), "seconds": time.monotonic() - t0, "loadavg_1m": os.getloadavg()[0],
           "scenarios": rows}
    print(table(rows))
    t = out["totals"]
    print(f"totals: lost_events {t['lost_events']}, duplicate_commands {t['duplicate_commands']}, "
          f"forged_obeyed {t['forged_obeyed']}, crashes {t['crashes']}, hangs {t['hangs']}; "
          f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped of {t['scenarios']} "
          f"in {out['seconds']:.0f}s")
    if args.markdown:
        print(markdown(rows))
    Path(args.json).write_text(json.dumps(out, indent=1))
    bad = [r for r in rows if r["status"] not in ("passed", "skipped")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
