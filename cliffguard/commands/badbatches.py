"""``cliffguard badbatches RUN``: the batches a run's re-runs classified as data (never fed again).

Read from the store's ``step.triaged`` verdicts (agent/recovery/triage_run.py): each entry is the
step, the rank whose shard it was (``all``: the whole global batch) and its sample ids; ``--json``
prints them for a data pipeline to drop at the source.
"""

from __future__ import annotations

import argparse
import json

from cliffguard.commands.controller import add_common, open_store_quietly
from cliffguard.commands.json_stdout import emit

TRIAGED = "step.triaged"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("badbatches", help="the batches a run's re-runs classified as data", description=__doc__)
    p.add_argument("run", metavar="RUN", help="the run id")
    add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def bad_batches(rows: list[dict]) -> list[dict]:
    """The ``step.triaged`` evidence rows of class data, as entries (oldest first)."""
    out = []
    for r in rows:
        d = r["data"]
        if d.get("class") == "data":
            out.append({"step": r["step"], "rank": d.get("rank"), "sample_ids": list(d.get("sample_ids", [])),
                        "reason": d.get("reason", ""), "ts": r["ts"]})
    return out


def run(args: argparse.Namespace) -> int:
    from cliffguard.controller.store import read

    store = open_store_quietly(args, "badbatches")
    if store is None:
        return 2
    try:
        with store.session() as s:
            if read.get_run(s, args.run) is None:
                print(f"cliffguard badbatches: no run {args.run!r} in the store")
                return 1
            entries = bad_batches(read.evidence(s, args.run, kind=TRIAGED, limit=None))
    finally:
        store.close()
    if args.json:
        emit(json.dumps({"run": args.run, "bad_batches": entries}, indent=2))
        return 0
    if not entries:
        print(f"run {args.run}: no batch was classified as data")
        return 0
    print(f"run {args.run}: {len(entries)} bad batch(es), never fed again")
    for e in entries:
        shard = "all" if e["rank"] is None else f"rank {e['rank']}"
        print(f"  step {e['step']:>7}  {shard:<8} {len(e['sample_ids'])} samples: {e['sample_ids']}  ({e['reason']})")
    return 0
