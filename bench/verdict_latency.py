"""Verdict latency: a spike event produced -> the controller's pause visible on the commands topic.

    python -m bench.verdict_latency --json OUT.json [--trials 40]

A ``ControllerService`` (SQLite store, defaults but for the group timings) runs on a thread
against the embedded broker. Each trial uses a new run: 40 healthy steps are produced and given
time to be consumed, then one spike step (a loss of 50 after a healthy 3: the loss rule is
critical on it alone, as on any point its evidence makes rare enough); the clock starts when it
is acknowledged by the broker and stops when a consumer assigned to
the commands topic receives the run's pause. The path measured: fetch, decode, ingest, rules,
state machine, the pause handed to the producer as the rule fires (``CommandOutbox.send_early``,
before the batch's SQL commit), fetch by the trainer.

Baseline, measured in the same run: the broker round trip alone (produce -> a consumer sees it)
with the same client settings; ``ratio`` = p50 / the round trip's p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from cliffguard.controller.broker import EmbeddedBroker
from cliffguard.core.events import decode_command
from testing.controller_stack import controller, fresh_kafka, fresh_store, step_bytes


def _pct(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))]


def _commands_consumer(kafka, topic: str) -> KafkaConsumer:
    c = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False, fetch_max_wait_ms=5,
                      auto_offset_reset="latest")
    parts = [TopicPartition(topic, p) for p in range(kafka.partitions)]
    c.assign(parts)
    c.seek_to_end(*parts)
    for p in parts:
        c.position(p)  # resolve "end" now, before anything is produced
    return c


def round_trip(kafka, trials: int) -> list[float]:
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=0)
    consumer = _commands_consumer(kafka, kafka.dlq_topic)
    out = []
    try:
        for i in range(trials):
            t0 = time.perf_counter()
            producer.send(kafka.dlq_topic, key=b"k", value=str(i).encode()).get(timeout=10)
            while not any(consumer.poll(timeout_ms=5).values()):
                pass
            out.append((time.perf_counter() - t0) * 1000)
    finally:
        producer.close()
        consumer.close()
    return out


def spike_latency(kafka, trials: int, warmup_s: float) -> list[float]:
    engine = fresh_store()
    svc = controller(kafka, engine, outbox_interval_s=0.5)
    stop = threading.Event()
    thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
    svc.start()
    thread.start()
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=0)
    consumer = _commands_consumer(kafka, kafka.commands_topic)
    out: list[float] = []
    try:
        time.sleep(warmup_s)  # the consumer group join
        for i in range(trials):
            run = f"lat{uuid.uuid4().hex[:6]}"
            for step in range(40):
                producer.send(kafka.metrics_topic, key=run.encode(), value=step_bytes(run, step))
            producer.flush()
            time.sleep(0.3)  # let the healthy prefix be consumed: measure the spike alone
            for step in (40,):
                fut = producer.send(kafka.metrics_topic, key=run.encode(), value=step_bytes(run, step, loss=50.0))
            fut.get(timeout=10)
            t0 = time.perf_counter()
            seen = False
            while not seen and time.perf_counter() - t0 < 30:
                for msgs in consumer.poll(timeout_ms=5).values():
                    for m in msgs:
                        cmd = decode_command(m.value)
                        seen = seen or (cmd.run == run and str(cmd.type) == "pause")
            if not seen:
                raise RuntimeError(f"trial {i}: no pause within 30 s")
            out.append((time.perf_counter() - t0) * 1000)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{trials} trials, p50 so far {statistics.median(out):.1f} ms", flush=True)
    finally:
        stop.set()
        thread.join(20)
        producer.close()
        consumer.close()
        engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="write the figures here")
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--warmup-s", type=float, default=12.0, help="wait for the consumer group join")
    args = p.parse_args(argv)
    load_start = os.getloadavg()[0]
    with EmbeddedBroker(port=0) as broker:
        kafka = fresh_kafka(broker)
        rtt = round_trip(kafka, args.trials)
        lat = spike_latency(kafka, args.trials, args.warmup_s)
    out = {
        "trials": args.trials,
        "p50_ms": statistics.median(lat), "p99_ms": _pct(lat, 0.99), "max_ms": max(lat),
        "broker_round_trip_p50_ms": statistics.median(rtt), "broker_round_trip_p99_ms": _pct(rtt, 0.99),
    }
    out["ratio"] = out["p50_ms"] / out["broker_round_trip_p50_ms"]
    print(f"{'path':<34}{'p50 ms':>9}{'p99 ms':>9}")
    print(f"{'spike -> pause on commands topic':<34}{out['p50_ms']:>9.1f}{out['p99_ms']:>9.1f}")
    print(f"{'broker round trip (baseline)':<34}{out['broker_round_trip_p50_ms']:>9.1f}"
          f"{out['broker_round_trip_p99_ms']:>9.1f}")
    print(f"ratio p50 / round trip p50: {out['ratio']:.1f}")
    out["loadavg_1m"] = os.getloadavg()[0]  # this machine is shared: say how busy it was
    out["loadavg_1m_start"] = load_start
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
