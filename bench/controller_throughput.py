"""Controller throughput: the pure core, end to end through the broker, and raw consumption.

    python -m bench.controller_throughput --json OUT.json [--events 20000] [--runs 1,8,64]
                                          [--pg-url URL | CLIFFGUARD_TEST_PG_URL=URL]

- ``core``: ``RunDetector.on_event`` + ``recovery.transition`` on in-memory step events (one run):
  events/s of the pure decision path, no I/O.
- ``e2e`` per store and number of concurrent runs: the events are produced to the metrics topic
  first (interleaved across runs, key = run), then a ``ControllerService`` (one transaction per
  polled batch) consumes them; events/s from its first committed batch to the last (the consumer
  group join is not counted). The store is SQLite, and also PostgreSQL (a fresh schema, dropped
  afterwards) when ``--pg-url`` or ``CLIFFGUARD_TEST_PG_URL`` names a database.
- ``no_rules`` per store and number of runs: the same end to end with a detector that judges
  nothing (``testing.controller_stack.NoRules``): what the poll, decoding, the state machine and the
  store cost, i.e. the controller's ceiling however fast the rules become.
- ``raw``: plain kafka-python ``KafkaConsumer`` reading the same topic's messages (no decoding),
  in the same run on the same broker: the ceiling the controller sits under (the best of three
  reads, as is ``raw_decode``).
- ``raw_decode``: the same consumer, each poll's messages also decoded and validated as the
  controller does (``core.batch_decode.BatchDecoder.decode``: msgspec's typed decoder, the
  standard path for what it leaves): the ceiling of any controller that reads the events, and
  ``raw_decode.ratio`` (to ``raw``) says how much of it decoding alone takes.
  ``raw_decode_standard``: the same with ``decode_event`` per message (no msgspec), the
  path every message took before.

``--write-bucket N`` runs the controller with ``RetentionConfig(write_bucket=N)`` (step rows
written in N-step buckets, ``controller/store/step_buckets.py``). ``ratio`` = e2e / raw per store and run count (``ratio.sqlite["8"]``). Everything shares the
machine's CPUs with the broker; each figure carries the 1-minute load average taken right after
it (``loadavg_1m``), since a busy machine lowers every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from cliffguard.controller.batch_inputs import inputs_for
from cliffguard.controller.broker import EmbeddedBroker
from cliffguard.controller.detect import RunDetector
from cliffguard.controller.recovery import new_state, transition
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.store.retention import RetentionConfig
from cliffguard.core.batch_decode import BatchDecoder
from cliffguard.core.events import decode_event
from testing.controller_stack import (
    NoRules,
    controller,
    drop_store,
    fresh_kafka,
    fresh_store,
    healthy_loss,
    step_bytes,
)


def core_rates(n: int) -> dict[str, float]:
    """events/s of the rules + machine together, and of each alone (on the same events)."""
    events = [decode_event(step_bytes("core", s)) for s in range(n)]
    det, state, cfg = RunDetector(), new_state("core", "salt"), RecoveryConfig()
    t0 = time.perf_counter()
    for ev in events:
        for inp in inputs_for(ev, det.on_event(ev), ev.ts):
            state, _ = transition(cfg, state, inp)
    both = n / (time.perf_counter() - t0)
    det = RunDetector()
    t0 = time.perf_counter()
    for ev in events:
        det.on_event(ev)
    rules = n / (time.perf_counter() - t0)
    inputs = [inp for ev in events for inp in inputs_for(ev, [], ev.ts)]
    state = new_state("core", "salt")
    t0 = time.perf_counter()
    for inp in inputs:
        state, _ = transition(cfg, state, inp)
    machine = n / (time.perf_counter() - t0)
    return {"events_per_s": both, "rules_only_events_per_s": rules, "machine_only_events_per_s": machine}


def produce(kafka, runs: int, n: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=5, batch_size=256 * 1024)
    names = [f"r{uuid.uuid4().hex[:6]}-{i}" for i in range(runs)]
    for i in range(n):
        run, step = names[i % runs], i // runs
        producer.send(kafka.metrics_topic, key=run.encode(), value=step_bytes(run, step, healthy_loss(step)))
    producer.flush()
    producer.close()


def e2e_rate(broker, runs: int, n: int, pg_url: str | None = None, write_bucket: int = 1,
             rules: bool = True) -> tuple[float, dict]:
    kafka = fresh_kafka(broker)
    produce(kafka, runs, n)
    engine = fresh_store(pg_url=pg_url)
    # the raw consumer's batch size: per-batch costs (fence, offsets, commit) amortised alike
    svc = controller(kafka, engine, RetentionConfig(write_bucket=write_bucket), None if rules else NoRules,
                     tick_s=3600.0, max_poll_records=RAW_CONSUMER["max_poll_records"])
    svc.start()
    first = None
    deadline = time.monotonic() + 600
    try:
        while svc.stats["events"] < n and time.monotonic() < deadline:
            res = svc.step_once()
            if res is not None and first is None:
                first = time.perf_counter()
                first_events = res.events
        elapsed = time.perf_counter() - first
    finally:
        svc.close()
        drop_store(engine)
    # the first batch's own events were processed before `first` was taken: leave them out
    return (svc.stats["events"] - first_events) / elapsed, dict(svc.stats)


RAW_CONSUMER = {"enable_auto_commit": False, "max_poll_records": 2000, "fetch_max_wait_ms": 20}
"""The consumer settings of ``raw`` and ``raw_decode``; the controller runs with the same batch size."""


def raw_rate(broker, n: int, decode: str | None = None, repeats: int = 3) -> float:
    """events/s of a plain consumer (``decode``: "batch", each poll also through the controller's
    ``BatchDecoder``; "standard", ``decode_event`` per message), the best
    of ``repeats`` reads of the same messages: a read takes a fraction of a second, so one hiccup
    of a shared machine would otherwise set the ceiling every ratio is taken against."""
    from kafka import KafkaConsumer, TopicPartition

    kafka = fresh_kafka(broker)
    produce(kafka, 8, n)
    parts = [TopicPartition(kafka.metrics_topic, p) for p in range(kafka.partitions)]
    best, decoder = 0.0, BatchDecoder()
    for _ in range(repeats):
        consumer = KafkaConsumer(**kafka.client_kwargs(), **RAW_CONSUMER)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        got, first = 0, None
        try:
            while got < n:
                batch = consumer.poll(timeout_ms=500)
                if decode == "batch":
                    for messages in batch.values():
                        decoder.decode([m.value for m in messages])
                elif decode == "standard":
                    for messages in batch.values():
                        for m in messages:
                            decode_event(m.value)
                if batch and first is None:
                    first = time.perf_counter()
                    got_first = sum(len(m) for m in batch.values())
                got += sum(len(m) for m in batch.values())
            elapsed = time.perf_counter() - first
        finally:
            consumer.close()
        best = max(best, (got - got_first) / elapsed)
    return best


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the figures here")
    p.add_argument("--events", type=int, default=20_000, help="events per end-to-end configuration")
    p.add_argument("--runs", default="1,8,64", help="concurrent run counts (comma-separated)")
    p.add_argument("--core-events", type=int, default=20_000)
    p.add_argument("--write-bucket", type=int, default=1,
                   help="RetentionConfig.write_bucket of the controller (1: a row per step)")
    p.add_argument("--pg-url", default=os.environ.get("CLIFFGUARD_TEST_PG_URL"),
                   help="also measure on this PostgreSQL database (default: $CLIFFGUARD_TEST_PG_URL)")
    args = p.parse_args(argv)
    run_counts = [int(x) for x in args.runs.split(",")]
    stores = {"sqlite": None, **({"postgresql": args.pg_url} if args.pg_url else {})}
    out: dict = {"events": args.events, "write_bucket": args.write_bucket, "core": {}, "e2e": {}, "no_rules": {},
                 "raw": {}}
    out["core"] = {**core_rates(args.core_events), "events": args.core_events, "loadavg_1m": _load()}
    core = out["core"]["events_per_s"]
    print(f"core (rules + state machine): {core:,.0f} events/s (rules alone "
          f"{out['core']['rules_only_events_per_s']:,.0f}, machine alone "
          f"{out['core']['machine_only_events_per_s']:,.0f})", flush=True)
    with EmbeddedBroker(port=0) as broker:
        raw = raw_rate(broker, args.events)
        out["raw"] = {"events_per_s": raw, "loadavg_1m": _load()}
        print(f"raw kafka-python consume: {raw:,.0f} events/s", flush=True)
        dec = raw_rate(broker, args.events, decode="batch")
        out["raw_decode"] = {"events_per_s": dec, "ratio": dec / raw, "typed": BatchDecoder().available,
                             "loadavg_1m": _load()}
        print(f"raw consume + decode: {dec:,.0f} events/s (ratio {dec / raw:.3f})", flush=True)
        std = raw_rate(broker, args.events, decode="standard")
        out["raw_decode_standard"] = {"events_per_s": std, "ratio": std / raw, "loadavg_1m": _load()}
        print(f"raw consume + standard decode: {std:,.0f} events/s (ratio {std / raw:.3f})", flush=True)
        for store, url in stores.items():
            out["e2e"][store] = {}
            for runs in run_counts:
                rate, stats = e2e_rate(broker, runs, args.events, url, args.write_bucket)
                out["e2e"][store][str(runs)] = {"events_per_s": rate, "ratio": rate / raw, "batches": stats["batches"],
                                                "loadavg_1m": _load()}
                print(f"e2e {store} {runs:>3} runs: {rate:,.0f} events/s ({stats['batches']} batches) "
                      f"ratio {rate / raw:.3f}", flush=True)
            out["no_rules"][store] = {}
            for runs in run_counts:
                rate, stats = e2e_rate(broker, runs, args.events, url, args.write_bucket, rules=False)
                out["no_rules"][store][str(runs)] = {"events_per_s": rate, "ratio": rate / raw,
                                                     "batches": stats["batches"], "loadavg_1m": _load()}
                print(f"no rules {store} {runs:>3} runs: {rate:,.0f} events/s ratio {rate / raw:.3f}", flush=True)
    out["ratio"] = {store: {k: v["ratio"] for k, v in per.items()} for store, per in out["e2e"].items()}
    print()
    print(f"{'config':<28}{'events/s':>12}{'ratio':>8}{'load':>7}")
    print(f"{'core':<28}{core:>12,.0f}{'':>8}{out['core']['loadavg_1m']:>7.2f}")
    print(f"{'raw consume':<28}{raw:>12,.0f}{1.0:>8.3f}{out['raw']['loadavg_1m']:>7.2f}")
    print(f"{'raw consume + decode':<28}{dec:>12,.0f}{dec / raw:>8.3f}{out['raw_decode']['loadavg_1m']:>7.2f}")
    print(f"{'raw + standard decode':<28}{std:>12,.0f}{std / raw:>8.3f}"
          f"{out['raw_decode_standard']['loadavg_1m']:>7.2f}")
    for kind in ("e2e", "no_rules"):
        for store, per in out[kind].items():
            for k, v in per.items():
                print(f"{f'{kind} {store} {k} runs':<28}{v['events_per_s']:>12,.0f}{v['ratio']:>8.3f}"
                      f"{v['loadavg_1m']:>7.2f}")
    out["loadavg_1m"] = _load()  # this machine is shared: say how busy it was
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
