"""The controller's per-batch processing alone: µs per event of ``BatchProcessor.process``.

    python -m bench.batch_speed --json OUT.json [--events 10000] [--runs 1,64] [--batch 2000]
                                [--repeat 2] [--pg-url URL | CLIFFGUARD_TEST_PG_URL=URL]

``bench.controller_throughput`` measures the controller end to end through the broker, where the
poll, the decoding and the broker's own share of two CPU cores blur what one batch costs. Here
the events of ``testing.controller_stack.step_bytes`` (healthy run-level ``step`` events,
interleaved across runs as the throughput bench produces them) are decoded first (not timed) and
cut into batches of ``--batch`` records on 4 partitions; each batch then goes through
``BatchProcessor.process`` in its own transaction on a fresh store, as ``ControllerService``
does after a poll. Figures per store and run count: µs per event with the rules
(``RunDetector``) and with ``testing.controller_stack.NoRules`` (what the state machine and the store
cost), wall clock and this process's CPU time (``_cpu``: steadier on a shared machine, without
PostgreSQL's own work), the best of ``--repeat`` fresh stores, each with the 1-minute load average.
The process runs with the controller's GC threshold (``ControllerConfig.gc_gen0_threshold``).
The first batch of each run also builds its detector and run row (as a controller meeting a
new run does).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from cliffguard.controller.alerts import AlertsConfig
from cliffguard.controller.batch import BatchContext, BatchProcessor
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.runstate import RunTable, default_detector_factory
from cliffguard.controller.store.db import session_scope
from cliffguard.core.events import decode_event
from testing.controller_stack import SECRET, NoRules, drop_store, fresh_store, step_bytes

TOPIC = "bench.metrics"
PARTITIONS = 4


def batches(runs: int, n: int, size: int) -> list[EdgeBatch]:
    """``n`` step events of ``runs`` runs (run ``i`` on partition ``i % PARTITIONS``), in batches."""
    names = [f"run-{i}" for i in range(runs)]
    offsets = [0] * PARTITIONS
    records = []
    for i in range(n):
        run, part = names[i % runs], (i % runs) % PARTITIONS
        records.append(EdgeRecord(TOPIC, part, offsets[part], decode_event(step_bytes(run, i // runs))))
        offsets[part] += 1
    out = []
    for start in range(0, n, size):
        chunk = records[start:start + size]
        nxt: dict[tuple[str, int], int] = {}
        for r in chunk:
            nxt[r.topic, r.partition] = r.offset + 1
        out.append(EdgeBatch(records=chunk, next_offsets=nxt))
    return out


def process_us(runs: int, n: int, size: int, rules: bool, pg_url: str | None = None) -> tuple[float, float]:
    """µs per event of ``BatchProcessor.process`` (with its transaction's commit) over ``n``
    events: (wall clock, this process's CPU time). The CPU figure is the steadier one on a shared
    machine, but it leaves out PostgreSQL's own work (another process)."""
    todo = batches(runs, n, size)
    engine = fresh_store(pg_url=pg_url)
    ctx = BatchContext(group_id="bench", commands_topic="bench.commands", secret=SECRET,
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    ControllerConfig().apply_gc_threshold()  # the controller process's GC setting (controller/config.py)
    proc = BatchProcessor(ctx, RunTable(default_detector_factory() if rules else NoRules))
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        for batch in todo:
            with session_scope(engine) as s:
                proc.process(s, batch, time.time())
        return 1e6 * (time.perf_counter() - t0) / n, 1e6 * (time.process_time() - c0) / n
    finally:
        drop_store(engine)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the figures here")
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--runs", default="1,64", help="concurrent run counts (comma-separated)")
    p.add_argument("--batch", type=int, default=2000, help="records per batch (the throughput bench's poll size)")
    p.add_argument("--repeat", type=int, default=2, help="fresh stores per figure; the best is kept")
    p.add_argument("--pg-url", default=os.environ.get("CLIFFGUARD_TEST_PG_URL"),
                   help="also measure on this PostgreSQL database (default: $CLIFFGUARD_TEST_PG_URL)")
    args = p.parse_args(argv)
    stores = {"sqlite": None, **({"postgresql": args.pg_url} if args.pg_url else {})}
    out: dict = {"events": args.events, "batch": args.batch, "us_per_event": {}}
    print(f"{'store':<12}{'runs':>6}{'rules µs/ev':>13}{'(cpu)':>8}{'no rules µs/ev':>16}{'(cpu)':>8}{'load':>7}")
    for store, url in stores.items():
        per = out["us_per_event"][store] = {}
        for runs in (int(x) for x in args.runs.split(",")):
            fig: dict[str, float] = {}
            for kind in ("rules", "no_rules"):
                wall, cpu = zip(*(process_us(runs, args.events, args.batch, kind == "rules", url)
                                  for _ in range(args.repeat)), strict=True)
                fig[kind], fig[f"{kind}_cpu"] = min(wall), min(cpu)
            fig["loadavg_1m"] = round(os.getloadavg()[0], 2)
            per[str(runs)] = fig
            print(f"{store:<12}{runs:>6}{fig['rules']:>13.1f}{fig['rules_cpu']:>8.1f}{fig['no_rules']:>16.1f}"
                  f"{fig['no_rules_cpu']:>8.1f}{fig['loadavg_1m']:>7.2f}", flush=True)
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
