"""Scale-out: how many events per second 1, 2, ... controller instances take from the same backlog.

    python -m bench.fleet_drain --json OUT.json [--ranks 2048 --runs 48 --seconds 60 --instances 1,2]
                                [--partitions 16] [--pg-url URL]

``bench.fleet`` offers a fleet's load in real time, so an instance that keeps up processes what is
offered whatever its headroom, and on a small machine the producer itself takes a core: two
instances cannot show more than one does there. Here the fleet's stream (``bench.fleet_stream``:
step events, ``ranks`` arrays, node heartbeats) for ``--seconds`` of training is produced first,
into fresh topics, with nothing consuming; then the instances start in one consumer group and
drain it. Measured per instance count, between 10 % and 90 % of the backlog committed (the group's
join before and a partition's tail after are not the controllers' speed):

- ``events_per_s``: events committed per second, and ``speedup`` against the first count;
- ``cpu_share``: each controller process's CPU seconds / wall seconds over that stretch (1.0 = a core);
- ``broker_cpu_share`` and ``machine_busy_cores`` (all processes, /proc/stat): the broker serves
  every instance from the same cores, so on a small machine these say what bounded the speed-up.

Events carry timestamps from the drain's start on, one tick per ``1 / steps_per_s``, so no rank
looks silent while its backlog waits. Many runs of fewer ranks keep the partitions even (a run is
one partition's key): 48 x 2,048 ranks is the 6 x 16,384 fleet's rank count in 48 partition keys.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.fleet import _committed, _cpu_s, _start_instances, controller_toml
from bench.fleet_stream import FleetSpec, FleetStream
from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from cliffguard.core.events import encode_event
from testing.controller_stack import drop_store, fresh_store


def _busy_cores() -> float:
    """CPU seconds the whole machine has spent busy so far (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def balanced_names(runs: int, partitions: int) -> list[str]:
    """Run names whose keys the producer's partitioner (murmur2, as Kafka's) spreads evenly over
    the partitions: random names put 48 runs as 28 and 20 on two instances' halves, and the
    drain then measured one instance finishing alone."""
    from kafka.partitioner.default import murmur2

    per = -(-runs // partitions)
    filled: dict[int, int] = {}
    names: list[str] = []
    while len(names) < runs:
        name = f"drain{len(names)}-{uuid.uuid4().hex[:6]}"
        part = (murmur2(name.encode()) & 0x7FFFFFFF) % partitions
        if filled.get(part, 0) < per:
            filled[part] = filled.get(part, 0) + 1
            names.append(name)
    return names


def produce_backlog(kafka, spec: FleetSpec, names: list[str], seconds: float, t0: float) -> int:
    """The fleet's events for ``seconds`` of training, as fast as the producer goes; returns how many."""
    from kafka import KafkaProducer

    stream = FleetStream(spec, names)
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=20, batch_size=1024 * 1024,
                             max_request_size=4 * 1024 * 1024)
    n = 0
    try:
        for k in range(max(1, int(seconds * spec.steps_per_s))):
            for key, ev in stream.tick(k, t0 + k / spec.steps_per_s):
                producer.send(kafka.metrics_topic, key=key.encode(), value=encode_event(ev))
                n += 1
        producer.flush()
    finally:
        producer.close()
    return n


def drain(broker, spec: FleetSpec, instances: int, *, seconds: float, partitions: int, pg_url: str | None,
          timeout_s: float, max_poll_records: int | None = None) -> dict:
    kafka = broker.kafka_config(topic_prefix=f"drain{uuid.uuid4().hex[:6]}", partitions=partitions)
    ensure_topics(kafka)
    engine = fresh_store(pg_url=pg_url)
    db_url = engine.url.render_as_string(hide_password=False)
    tmp = Path(tempfile.mkdtemp(prefix="cliffguard-drain-"))
    cfg_path = controller_toml(tmp, max_poll_records)
    names = balanced_names(spec.runs, partitions)
    t_produce = time.time()
    offered = produce_backlog(kafka, spec, names, seconds, t0=time.time() + 60)
    produce_s = time.time() - t_produce
    group = f"drain-{uuid.uuid4().hex[:6]}"
    procs = _start_instances(instances, kafka, db_url, group, str(cfg_path), tmp)
    broker_pid = broker._proc.pid if getattr(broker, "_proc", None) is not None else None
    samples: list[tuple[float, int, dict[int | str, float]]] = []
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            done = _committed(engine, group)
            cpu: dict[int | str, float] = {p.pid: _cpu_s(p.pid) for p in procs}
            cpu["machine"] = _busy_cores()
            if broker_pid is not None:
                cpu["broker"] = _cpu_s(broker_pid)
            samples.append((time.time(), done, cpu))
            if done >= offered or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except Exception:  # noqa: BLE001 - a controller that will not stop is killed
                p.kill()
    lo_at = next((i for i, s in enumerate(samples) if s[1] >= 0.1 * offered), None)
    hi_at = next((i for i, s in enumerate(samples) if s[1] >= 0.9 * offered), None)
    if lo_at is not None and lo_at == hi_at:  # drained between two samples (a small backlog): from the one before
        lo_at = max(0, lo_at - 1)
    lo = samples[lo_at] if lo_at is not None else None
    hi = samples[hi_at] if hi_at is not None else None
    out: dict = {"instances": instances, "ranks": spec.ranks, "runs": spec.runs, "partitions": partitions,
                 "offered": offered, "produce_s": produce_s, "committed": samples[-1][1] if samples else 0,
                 "store": engine.url.get_backend_name(), "loadavg_1m": os.getloadavg()[0]}
    if lo is None or hi is None or hi[0] <= lo[0]:
        out.update(events_per_s=None, cpu_share=None,
                   error=f"the backlog was not drained to 90 % within {timeout_s:.0f} s (logs: {tmp})")
        drop_store(engine)
        return out
    wall = hi[0] - lo[0]
    out.update(events_per_s=(hi[1] - lo[1]) / wall, measured_s=wall,
               cpu_share={f"controller-{i}": (hi[2][p.pid] - lo[2][p.pid]) / wall for i, p in enumerate(procs)},
               broker_cpu_share=(hi[2]["broker"] - lo[2]["broker"]) / wall if "broker" in hi[2] else None,
               machine_busy_cores=(hi[2]["machine"] - lo[2]["machine"]) / wall)
    drop_store(engine)
    out["logs"] = str(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_drain", description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--ranks", type=int, default=2048, help="ranks per run")
    p.add_argument("--runs", type=int, default=48)
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of training in the backlog")
    p.add_argument("--instances", default="1,2", help="controller instance counts, e.g. 1,2")
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest a drain may take")
    p.add_argument("--pg-url", default=None, help="PostgreSQL store (default: a SQLite file)")
    p.add_argument("--max-poll-records", type=int, default=None,
                   help="the controllers' [controller] max_poll_records (default: theirs, 500)")
    args = p.parse_args(argv)
    spec = FleetSpec(ranks=args.ranks, runs=args.runs)
    results = []
    with EmbeddedBroker(port=0) as broker:
        for n in [int(x) for x in args.instances.split(",")]:
            results.append(drain(broker, spec, n, seconds=args.seconds, partitions=args.partitions,
                                 pg_url=args.pg_url, timeout_s=args.timeout_s,
                                 max_poll_records=args.max_poll_records))
    base = results[0].get("events_per_s")
    print(f"{'instances':>9}  {'events':>8}  {'events/s':>9}  {'speedup':>7}  {'CPU share per controller':<24}  "
          f"broker  machine busy (cores of {os.cpu_count()})")
    for r in results:
        rate = r.get("events_per_s")
        r["speedup"] = rate / base if rate and base else None
        shares = " ".join(f"{v:.2f}" for v in (r.get("cpu_share") or {}).values()) or r.get("error", "")
        print(f"{r['instances']:>9}  {r['offered']:>8,}  {rate or 0:>9,.0f}  "
              f"{r['speedup'] or 0:>7.2f}  {shares:<24}  {r.get('broker_cpu_share') or 0:>6.2f}  "
              f"{r.get('machine_busy_cores') or 0:.2f}")
    out = {"ranks": args.ranks, "runs": args.runs, "seconds": args.seconds, "cpus": os.cpu_count(),
           "max_poll_records": args.max_poll_records,
           "per_instances": {str(r["instances"]): r for r in results}}
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if all(r.get("events_per_s") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
