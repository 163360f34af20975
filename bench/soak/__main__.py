"""The randomised combined-fault soak (issue 29), run as ``python -m bench.soak --seeds N --json OUT``.

``[--store sqlite|postgres] [--steps S] [--seed-base B] [--events MIN:MAX] [--controllers N]
[--replay JSON --only SEED]``.

Per seed: a fresh embedded broker, store and ``cliffguard controller`` (``--controllers 2``: two in
one consumer group, one standing by, each controller fault hitting one of them); a 2-process run of the
bundled trainer with the demo's two training faults (a corrupted stretch, an LR blow-up); the
seed's schedule of 6-10 combined faults (bench/soak/schedule.py); an independent witness reading
the topics; at the end every invariant of bench/soak/invariants.py counted. Prints each seed's
schedule, one row per seed and the totals; writes them as JSON. A failing seed is re-run exactly
with ``--replay OUT --only SEED`` (the schedule stored in the JSON), or ``--seed-base SEED --seeds 1``
with the same ``--steps``/``--events`` (the schedule is drawn from the seed alone). Exit code 1 when
an invariant broke in any seed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from bench.soak.invariants import CHECKS, Observed, check_all
from bench.soak.runner import run_seed
from bench.soak.schedule import Schedule, ScheduleConfig, make_schedule

PG_ENV = "CLIFFGUARD_TEST_PG_URL"


def _count(row: dict[str, Any], name: str) -> int:
    return int(row["checks"].get(name, {}).get("count", 0))  # a row judged before the check existed: 0


def table(rows: list[dict[str, Any]]) -> str:
    """One row per seed (a count per invariant), the totals last; the legend names the columns."""
    cols = [inv.short for inv in CHECKS]
    head = f"{'seed':>6} {'events':>6} {'wall s':>7} " + " ".join(f"{c:>5}" for c in cols) + "  ok"
    lines = [head, "-" * len(head)]
    for r in rows:
        fired = sum(1 for f in r["fired"] if f.get("fired"))
        counts = [_count(r, inv.name) for inv in CHECKS]
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
        "checks": {inv.name: sum(_count(r, inv.name) for r in rows) for inv in CHECKS},
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The fault page's tables: per seed the faults that fired, its seconds and what broke; then
    each invariant's total over the seeds."""
    out = ["| seed | faults fired | s | broken |", "|---:|---|---:|---|"]
    for r in rows:
        kinds = Counter(f["kind"] for f in r["fired"] if f.get("fired"))
        fired = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))
        broken = ", ".join(f"`{n}` {c['count']}" for n, c in r["checks"].items() if c["count"]) or row_error(
            r
        )
        out.append(f"| {r['seed']} | {sum(kinds.values())}: {fired} | {r['wall_s']:.0f} | {broken} |")
    t = totals(rows)
    out += ["", f"| invariant | total over {t['seeds']} seeds |", "|---|---:|"]
    out += [f"| `{inv.name}` | {t['checks'][inv.name]} |" for inv in CHECKS]
    return "\n".join(out)


def row_error(row: dict[str, Any]) -> str:
    return f"the soak failed: {row['error']}" if row.get("error") else "none"


def evidence(row: dict[str, Any]) -> str:
    out = [f"seed {row['seed']} ({row.get('dir', '?')}):"]
    if row.get("error"):
        out.append(f"  the soak itself failed: {row['error']}")
    for name, c in row["checks"].items():
        for line in c["detail"]:
            out.append(f"  {name}: {line}")
    out += own_log_tail(Path(row["dir"]) / "controller.log") if row.get("dir") else []
    return "\n".join(out)


OWN_LOG_LINES = 160
"""A broken seed's evidence ends with the controller's own last lines (not kafka-python's reconnect
chatter), its stack dump included when the store stopped short: a CI run keeps no seed directory, so
what the controller said must be in the output."""


def own_log_tail(path: Path) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return [f"  (no controller log: {exc})"]
    own = [ln for ln in lines if ln.strip() and " kafka." not in ln[:60]]
    return [f"  the controller's last {min(len(own), OWN_LOG_LINES)} own log lines ({path}):"] + [
        "    " + ln[:300] for ln in own[-OWN_LOG_LINES:]]


MIN_STEPS = 200
"""The workload's two faults need a validation baseline (every 50 steps) before the corrupted stretch
at 0.33 x steps, and a stable checkpoint (50 healthy steps after it) before the blow-up at 0.62 x
steps: at 120 steps the controller rightly halts the first incident (no baseline, nothing stable)."""


def schedules(args: argparse.Namespace, p: argparse.ArgumentParser) -> list[Schedule]:
    """The seeds' schedules: drawn from each seed, or read back from an earlier run's JSON."""
    if args.replay:
        stored = json.loads(Path(args.replay).read_text())["seeds"]
        wanted = {int(x) for x in args.only.split(",")} if args.only else None
        picked = [Schedule.from_dict(r["schedule"]) for r in stored if wanted is None or r["seed"] in wanted]
        if not picked:
            p.error(f"--replay: no seed {args.only} in {args.replay}")
        return picked
    try:
        lo, _, hi = args.events.partition(":")
        cfg = ScheduleConfig(events_min=int(lo), events_max=int(hi or lo), max_s=args.max_fault_s,
                             controllers=args.controllers)
    except ValueError as exc:
        p.error(f"--events/--max-fault-s/--controllers: {exc}")
    return [
        make_schedule(seed, args.steps, cfg) for seed in range(args.seed_base, args.seed_base + args.seeds)
    ]


def _interrupted(*_: object) -> None:
    raise KeyboardInterrupt  # `kill <soak>` cleans up as Ctrl-C does (each seed's finally stops its processes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    p.add_argument("--seed-base", type=int, default=1, help="the first seed (default 1); seeds are B..B+N-1")
    p.add_argument("--json", required=True, help="write the rows and totals here (rewritten after each seed)")
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite", help="the controller's store")
    p.add_argument(
        "--pg-url", help=f"PostgreSQL for --store postgres (default ${PG_ENV}, else a throwaway cluster)"
    )
    p.add_argument(
        "--steps", type=int, default=600, help=f"training steps per seed (default 600; >= {MIN_STEPS})"
    )
    p.add_argument("--events", default="6:10", metavar="MIN:MAX", help="faults per seed (default 6:10)")
    p.add_argument(
        "--max-fault-s", type=float, help="cap each fault's duration (a short smoke; default: none)"
    )
    p.add_argument(
        "--controllers", type=int, default=1,
        help="controller instances in one consumer group (default 1; 2: one stands by, and each controller "
        "fault hits one of them)",
    )
    p.add_argument(
        "--replay", metavar="JSON", help="run the schedules stored in an earlier run's JSON instead"
    )
    p.add_argument("--only", metavar="SEED[,SEED]", help="with --replay: only these seeds")
    p.add_argument(
        "--recheck",
        metavar="JSON",
        help="judge the kept seeds of an earlier run (--keep) again, "
        "from each seed directory's observed.json, without running them",
    )
    p.add_argument(
        "--keep", help="keep each seed's directory (logs, store, trainer record) under this folder"
    )
    p.add_argument("--markdown", action="store_true", help="also print the fault page's tables")
    p.add_argument(
        "--settle-s",
        type=float,
        default=90.0,
        help="after training, wait at most this long for the store to hold everything (default 90)",
    )
    args = p.parse_args(argv)
    if args.steps < MIN_STEPS or args.seeds < 1:
        p.error(f"--steps must be >= {MIN_STEPS} (see MIN_STEPS) and --seeds >= 1")
    if args.recheck:
        try:
            return recheck(Path(args.recheck), Path(args.json), args)
        except (OSError, ValueError, KeyError) as exc:
            p.error(f"--recheck {args.recheck}: not a soak JSON ({type(exc).__name__}: {exc})")
    todo = schedules(args, p)
    out_path = Path(args.json).resolve()
    root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="cliffguard-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with contextlib.ExitStack() as stack:
            pg_url = args.pg_url or os.environ.get(PG_ENV)
            if args.store == "postgres" and not pg_url:
                from bench.faults.pg import ThrowawayPostgres

                pg_url = stack.enter_context(ThrowawayPostgres()).url
                print(f"soak: throwaway PostgreSQL on {pg_url.rsplit('@', 1)[1]}", flush=True)
            for schedule in todo:
                print(schedule.describe(), flush=True)
                try:
                    row = run_seed(schedule, root, store=args.store, pg_url=pg_url, settle_s=args.settle_s)
                except Exception as exc:  # noqa: BLE001 - the soak's own failure: loud, and the next seed runs
                    traceback.print_exc()
                    row = {
                        "seed": schedule.seed,
                        "ok": False,
                        "error": f"{type(exc).__name__}: {exc}",
                        "schedule": schedule.to_dict(),
                        "fired": [],
                        "wall_s": 0.0,
                        "checks": {},
                    }
                rows.append(row)
                bad = [f"{n} {c['count']}" for n, c in row["checks"].items() if c["count"]]
                verdict = "ok" if row["ok"] else "BROKEN: " + ", ".join(bad)
                print(f"seed {schedule.seed}: {verdict} ({row['wall_s']:.0f} s)", flush=True)
                if not row["ok"]:
                    print(evidence(row), flush=True)
                write(out_path, args, rows, time.monotonic() - t0)
    except KeyboardInterrupt:
        print(f"soak: interrupted after {len(rows)} seed(s)", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    write(out_path, args, rows, time.monotonic() - t0)
    print(table(rows), flush=True)
    if args.markdown:
        print(markdown(rows), flush=True)
    print(
        f"soak: {len(rows)} seed(s) in {time.monotonic() - t0:.0f} s; JSON in {out_path}"
        + (f"; seed directories in {root}" if args.keep else ""),
        flush=True,
    )
    return 0 if all(r["ok"] for r in rows) else 1


def recheck(earlier: Path, out: Path, args: argparse.Namespace) -> int:
    stored = json.loads(earlier.read_text())
    rows = []
    for row in stored["seeds"]:
        saved = Path(row.get("dir", "")) / "observed.json"
        if not saved.exists():
            print(f"soak: seed {row['seed']}: no {saved} (run with --keep); left as it was", flush=True)
        else:
            checks = check_all(Observed.from_json(json.loads(saved.read_text())))
            row = {
                **row,
                "ok": all(c.count == 0 for c in checks.values()),
                "checks": {name: {"count": c.count, "detail": c.detail[:10]} for name, c in checks.items()},
            }
        rows.append(row)
    args.store, args.steps = stored.get("store"), stored.get("steps")
    write(out.resolve(), args, rows, stored.get("seconds", 0.0))
    print(table(rows), flush=True)
    if args.markdown:
        print(markdown(rows), flush=True)
    return 0 if all(r["ok"] for r in rows) else 1


def write(path: Path, args: argparse.Namespace, rows: list[dict[str, Any]], seconds: float) -> None:
    result = {
        "store": args.store,
        "steps": args.steps,
        "totals": totals(rows),
        "seconds": round(seconds, 1),
        "loadavg_1m": os.getloadavg()[0],
        "invariants": {inv.name: inv.doc for inv in CHECKS},
        "seeds": rows,
    }
    path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
