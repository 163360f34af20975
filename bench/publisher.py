"""Benchmark the agent's publisher against a plain kafka-python producer on the same broker.

    python -m bench.publisher --json OUT.json [--events 20000]

Measures, on one embedded broker started here:

- ``publish_us_p50/p99``: cost of ``Publisher.publish`` on the calling (training) thread, broker up;
- ``publish_down_us_p50/p99``: the same while the broker is stopped and events spill to disk;
- ``events_per_s``: publisher end to end (first publish -> every event acknowledged by the broker);
- ``raw_producer_events_per_s``: a plain ``KafkaProducer`` (defaults) sending the same encoded
  events and flushing, the baseline; ``ratio`` = events_per_s / raw_producer_events_per_s;
- ``spill_events_per_s`` and ``replay_events_per_s``: how fast the thread writes the spill while
  the broker is down and drains it in order when it returns; ``dropped`` must be 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

from cliffguard.agent.drafts import EventDraft, draft_event
from cliffguard.agent.publisher import Publisher, PublisherConfig
from cliffguard.controller.broker import EmbeddedBroker, ensure_topics, free_port
from cliffguard.core.events import Event, encode_event

STEP = {
    "loss": 2.5, "loss_local": 2.4, "lr": 3e-4, "lr_scale": 1.0, "grad_norm": 0.9, "tokens": 4096,
    "step_time_s": 0.05, "data_wait_s": 0.001, "comm_exposed_s": 0.002, "compute_s": 0.04,
    "tokens_per_s": 81920.0, "mfu": 0.41, "mem_allocated": 1 << 20, "mem_reserved": 2 << 20,
    "loss_scale": 65536.0, "skipped": False, "clipped_layers": 0, "guard": "ok",
}


def _events(n: int, run: str, start: int = 0) -> list[Event]:
    return [_draft(run, start + i).build() for i in range(n)]


def _drafts(n: int, run: str, start: int = 0) -> list[EventDraft]:
    """What the agent hands the publisher: drafts (the thread builds them, agent/drafts.py)."""
    return [_draft(run, start + i) for i in range(n)]


def _draft(run: str, step: int) -> EventDraft:
    return draft_event("step", run, step, {**STEP, "loss": 2.5 - step * 1e-5})


def _pct(values_ns: list[int], q: float) -> float:
    values = sorted(values_ns)
    return values[min(len(values) - 1, int(q * len(values)))] / 1000


def _wait(pred, timeout: float, what: str) -> float:
    t0 = time.perf_counter()
    end = t0 + timeout
    while not pred():
        if time.perf_counter() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.002)
    return time.perf_counter() - t0


def _timed_publish(pub: Publisher, events: list[EventDraft]) -> list[int]:
    costs = []
    clock = time.perf_counter_ns
    for ev in events:
        t0 = clock()
        pub.publish(ev)
        costs.append(clock() - t0)
    return costs


def raw_producer_rate(kafka, events: list[Event]) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(**kafka.client_kwargs())
    producer.send(kafka.metrics_topic, key=b"warm", value=b"{}").get(10)  # connection + metadata
    t0 = time.perf_counter()
    for ev in events:
        producer.send(kafka.metrics_topic, key=ev.run.encode(), value=encode_event(ev))
    producer.flush(120)
    elapsed = time.perf_counter() - t0
    producer.close()
    return len(events) / elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000, help="events per phase (default 20000)")
    ap.add_argument("--json", dest="json_path", help="write the figures here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    n = args.events
    out: dict[str, float | int | str] = {"events": n}

    with EmbeddedBroker(port=free_port()) as broker, tempfile.TemporaryDirectory() as tmp:
        kafka = broker.kafka_config(topic_prefix="bench", partitions=4)
        ensure_topics(kafka)

        print(f"[1/4] raw kafka-python producer, {n} events", flush=True)
        out["raw_producer_events_per_s"] = raw_producer_rate(kafka, _events(n, "raw-run"))

        print(f"[2/4] publisher, broker up, {n} events", flush=True)
        pub = Publisher(kafka, PublisherConfig(spill_path=str(Path(tmp) / "spill.bin"), send_timeout_s=2.0,
                                               reconnect_min_s=0.05, reconnect_max_s=0.5,
                                               queue_max=max(100_000, 2 * n))).start()
        _wait(lambda: pub.stats()["broker_up"], 30, "the publisher to connect")
        events = _drafts(n, "pub-run")
        t0 = time.perf_counter()
        costs_up = _timed_publish(pub, events)
        _wait(lambda: pub.stats()["sent"] >= n, 120, "all events acknowledged")
        out["events_per_s"] = n / (time.perf_counter() - t0)
        out["publish_us_p50"] = _pct(costs_up, 0.50)
        out["publish_us_p99"] = _pct(costs_up, 0.99)
        out["publish_us_mean"] = statistics.fmean(costs_up) / 1000

        print(f"[3/4] broker down: publisher spilling, {n} events", flush=True)
        broker.stop()
        pub.publish(_drafts(1, "probe", start=0)[0])  # the publisher notices on this one
        _wait(lambda: not pub.stats()["broker_up"], 30, "the publisher to notice the outage")
        spilled_before = pub.stats()["spilled"]
        events = _drafts(n, "pub-run", start=n)
        t0 = time.perf_counter()
        costs_down = _timed_publish(pub, events)
        _wait(lambda: pub.stats()["spilled"] - spilled_before >= n, 120, "all events spilled")
        out["spill_events_per_s"] = n / (time.perf_counter() - t0)
        out["publish_down_us_p50"] = _pct(costs_down, 0.50)
        out["publish_down_us_p99"] = _pct(costs_down, 0.99)

        print("[4/4] broker back: replaying the spill in order", flush=True)
        pending = pub.stats()["spill_pending"]
        broker.start()
        replay_s = _wait(lambda: pub.stats()["spill_pending"] == 0, 180, "the spill to drain")
        out["replay_events_per_s"] = pending / replay_s
        pub.close(30)
        stats = pub.stats()
        out["dropped"] = stats["dropped"]
        out["replayed"] = stats["replayed"]

    out["ratio"] = out["events_per_s"] / out["raw_producer_events_per_s"]
    # Absolute rates depend on what else the machine runs; the ratio is the figure to compare.
    out["load_avg_1m"] = os.getloadavg()[0]
    out["cpus"] = os.cpu_count() or 0
    rows = [
        ("publish() p50, broker up", f"{out['publish_us_p50']:.2f} us"),
        ("publish() p99, broker up", f"{out['publish_us_p99']:.2f} us"),
        ("publish() p50, broker down", f"{out['publish_down_us_p50']:.2f} us"),
        ("publish() p99, broker down", f"{out['publish_down_us_p99']:.2f} us"),
        ("publisher end to end", f"{out['events_per_s']:,.0f} events/s"),
        ("raw kafka-python producer", f"{out['raw_producer_events_per_s']:,.0f} events/s"),
        ("ratio publisher / raw", f"{out['ratio']:.2f}"),
        ("spill write (broker down)", f"{out['spill_events_per_s']:,.0f} events/s"),
        ("replay (broker back)", f"{out['replay_events_per_s']:,.0f} events/s"),
        ("dropped", str(out["dropped"])),
        ("load average (1 min) / CPUs", f"{out['load_avg_1m']:.1f} / {out['cpus']}"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\npublisher benchmark, {n} events per phase")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
