"""The randomised combined-fault soak: ``python -m bench.soak --seeds N --json OUT [--store sqlite|postgres]
[--steps S] [--seed-base B]``.

Per seed: a fresh embedded broker, store and ``cliffguard controller``; a 2-process run of the
bundled trainer with the demo's two training faults (a corrupted stretch, an LR blow-up); the
seed's schedule of 6-10 combined faults (bench/soak/schedule.py); an independent witness reading
the topics; at the end every invariant of bench/soak/invariants.py counted. Prints each seed's
schedule, one row per seed and the totals; writes them as JSON. A failing seed is re-run exactly
with ``--seed-base SEED --seeds 1`` (the schedule is drawn from the seed alone). Exit code 1 when an
invariant broke in any seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.soak.invariants import CHECKS
from bench.soak.runner import run_seed
from bench.soak.schedule import ScheduleConfig, make_schedule

PG_ENV = "CLIFFGUARD_TEST_PG_URL"


def table(rows: list[dict[str, Any]]) -> str:
    """One row per seed (a count per invariant), the totals last; the legend names the columns."""
    cols = [inv.short for inv in CHECKS]
    head = f"{'seed':>6} {'events':>6} {'wall s':>7} " + " ".join(f"{c:>5}" for c in cols) + "  ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        fired = sum(1 for f in r["fired"] if f.get("fired"))
        counts = [r["checks"][inv.name]["count"] for inv in CHECKS]
        lines.append(
            f"{r['seed']:>6} {fired:>6} {r['wall_s']:>7.0f} "
            + " ".join(f"{n:>5}" for n in counts)
            + f"  {'yes' if r['ok'] else 'NO'}"
        )
    t = totals(rows)
    lines.append("-" * len(head))
    lines.append(
        f"{'total':>6} {t['events_fired']:>6} {t['wall_s']:>7.0f} "
        + " ".join(f"{t['checks'][inv.name]:>5}" for inv in CHECKS)
        + f"  {t['seeds_ok']}/{t['seeds']}"
    )
    lines.append("")
    lines += [f"  {inv.short:>5}  {inv.name}: {inv.doc}" for inv in CHECKS]
    return "\n".join(lines)


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "seeds": len(rows),
        "seeds_ok": sum(1 for r in rows if r["ok"]),
        "events_fired": sum(1 for r in rows for f in r["fired"] if f.get("fired")),
        "wall_s": round(sum(r["wall_s"] for r in rows), 1),
        "seconds_per_seed": round(sum(r["wall_s"] for r in rows) / len(rows), 1) if rows else None,
        "checks": {inv.name: sum(r["checks"][inv.name]["count"] for r in rows) for inv in CHECKS},
    }


def evidence(row: dict[str, Any]) -> str:
    out = [f"seed {row['seed']} ({row['dir']}):"]
    for name, c in row["checks"].items():
        for line in c["detail"]:
            out.append(f"  {name}: {line}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    p.add_argument("--seed-base", type=int, default=1, help="the first seed (default 1); seeds are B..B+N-1")
    p.add_argument("--json", required=True, help="write the rows and totals here")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite", help="the controller's store")
    p.add_argument(
        "--pg-url", help=f"PostgreSQL for --store postgres (default ${PG_ENV}, else a throwaway cluster)"
    )
    p.add_argument("--steps", type=int, default=600, help="training steps per seed (default 600; >= 50)")
    p.add_argument("--events", default="6:10", metavar="MIN:MAX", help="faults per seed (default 6:10)")
    p.add_argument(
        "--keep", help="keep each seed's directory (logs, store, trainer record) under this folder"
    )
    p.add_argument(
        "--settle-s",
        type=float,
        default=90.0,
        help="after training, wait at most this long for the store to hold everything (default 90)",
    )
    args = p.parse_args(argv)
    if args.steps < 50 or args.seeds < 1:
        p.error("--steps must be >= 50 and --seeds >= 1")
    try:
        lo, _, hi = args.events.partition(":")
        cfg = ScheduleConfig(events_min=int(lo), events_max=int(hi or lo))
    except ValueError as exc:
        p.error(f"--events: {exc}")
    out_path = Path(args.json).resolve()
    root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="cliffguard-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        pg_url = args.pg_url or os.environ.get(PG_ENV)
        if args.store == "postgres" and not pg_url:
            from bench.faults.pg import ThrowawayPostgres

            pg_url = stack.enter_context(ThrowawayPostgres()).url
            print(f"soak: throwaway PostgreSQL on {pg_url.rsplit('@', 1)[1]}", flush=True)
        for seed in range(args.seed_base, args.seed_base + args.seeds):
            schedule = make_schedule(seed, args.steps, cfg)
            print(schedule.describe(), flush=True)
            row = run_seed(schedule, root, store=args.store, pg_url=pg_url, settle_s=args.settle_s)
            rows.append(row)
            bad = [f"{n} {c['count']}" for n, c in row["checks"].items() if c["count"]]
            print(
                f"seed {seed}: {'ok' if row['ok'] else 'BROKEN: ' + ', '.join(bad)} ({row['wall_s']:.0f} s)",
                flush=True,
            )
            if not row["ok"]:
                print(evidence(row), flush=True)
    result = {
        "store": args.store,
        "steps": args.steps,
        "seed_base": args.seed_base,
        "totals": totals(rows),
        "seconds": round(time.monotonic() - t0, 1),
        "loadavg_1m": os.getloadavg()[0],
        "invariants": {inv.name: inv.doc for inv in CHECKS},
        "seeds": rows,
    }
    out_path.write_text(json.dumps(result, indent=1))
    print(table(rows), flush=True)
    print(
        f"soak: {len(rows)} seed(s) in {result['seconds']:.0f} s; JSON in {out_path}"
        + (f"; seed directories in {root}" if args.keep else ""),
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
