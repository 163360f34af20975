"""Fleet simulator: a fleet's exact event stream into the real broker, controllers in one group.

    python -m bench.fleet --json OUT.json [--ranks 16384 --runs 1 --steps-per-s 1 --instances 1,2]
                          [--duration-s 90] [--partitions 8] [--pg-url URL] [--plot OUT.png]

For each instance count: fresh topics and store, ``cliffguard controller`` subprocesses in one
consumer group, and the stream of ``bench.fleet_stream`` produced in real time (one tick per
step) for ``--duration-s``: each tick's step events first (every run's), then its ``ranks``
arrays, and its node heartbeats spread evenly over the tick (nodes beat on their own timers).
Injected: one loss spike per run (and ``--probes`` small runs with a
spike each, so the latency has several samples), and one hung rank in run 0 ``--hang-before-s``
before the end. Measured:

- ``offered`` / ``processed`` events: produced, and committed by the controllers (the sum of the
  group's offsets in the store), at the end of the offered load without draining the backlog:
  ``processed_over_offered``; consumer lag (events offered so far - committed) sampled every
  second, with the broker's end offsets beside it (Tansu's ListOffsets can trail the committed
  offsets by a record or two, which made end - committed dip below zero);
- verdict latency: a spike's step handed to the producer -> the run's ``pause`` on the commands topic;
- time to name the hung rank: the hang -> a ``rank_hung`` alert naming it in the store;
- CPU seconds per controller process (and of this process, the producer) over the run, and each
  controller's CPU share over the offered load (CPU seconds / wall seconds: 1.0 is one core);
- the alerts of run 0 by rule (``alerts_by_rule``): a fleet that stops makes a few grouped
  ``heartbeat`` alerts if the settle period outlasts the silence threshold, never one per rank.

The top-level figures are those of the first instance count (default: one instance).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

from bench.fleet_stream import FleetSpec, FleetStream
from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from cliffguard.core.enums import EventType
from cliffguard.core.events import decode_command, encode_event
from testing.controller_stack import SECRET, drop_store, fresh_store


def _pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _committed(engine, group: str) -> int:
    from sqlalchemy import func, select

    from cliffguard.controller.store.models import ConsumerOffsetRow

    with engine.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.sum(ConsumerOffsetRow.offset), 0))
                                .where(ConsumerOffsetRow.group_id == group)).scalar_one())


def _hung_named(engine, run: str, rank: int) -> float | None:
    """The store time of the first ``rank_hung`` alert of ``run`` naming ``rank``."""
    from sqlalchemy import select

    from cliffguard.controller.store.models import AlertRow

    with engine.connect() as conn:
        rows = conn.execute(select(AlertRow.ts, AlertRow.evidence).where(AlertRow.run_id == run, AlertRow.rule == "rank_hung")
                            .order_by(AlertRow.ts)).all()
    for ts, evidence in rows:
        # the alert's evidence wraps the verdict's (controller/recovery.py): the named ranks are
        # under "window"; "rank" is the first of them
        evidence = evidence or {}
        if evidence.get("rank") == rank or rank in (evidence.get("window") or {}).get("ranks", []):
            return float(ts)
    return None


def _alerts_by_rule(engine, run: str) -> dict[str, int]:
    """How many alerts of each rule ``run`` got (a stopped fleet's silence: a handful, not one per rank)."""
    from sqlalchemy import func, select

    from cliffguard.controller.store.models import AlertRow

    with engine.connect() as conn:
        return {rule: int(n) for rule, n in conn.execute(
            select(AlertRow.rule, func.count()).where(AlertRow.run_id == run).group_by(AlertRow.rule)).all()}


class CommandWatch(threading.Thread):
    """Records when each run's first ``pause`` arrives on the commands topic."""

    def __init__(self, kafka) -> None:
        super().__init__(daemon=True)
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False, fetch_max_wait_ms=5)
        parts = [TopicPartition(kafka.commands_topic, p) for p in range(kafka.partitions)]
        self.consumer.assign(parts)
        self.consumer.seek_to_beginning(*parts)
        self.paused: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msgs in self.consumer.poll(timeout_ms=20).values():
                now = time.time()
                for m in msgs:
                    try:
                        cmd = decode_command(m.value)
                    except Exception:  # noqa: BLE001 - not ours to judge here
                        continue
                    if str(cmd.type) == "pause":
                        self.paused.setdefault(cmd.run, now)
        self.consumer.close()


def controller_toml(folder: Path, max_poll_records: int | None = None) -> Path:
    """The bench controllers' config: short group timings (the embedded broker's first join waits
    about max_poll_interval_ms) and, unless given, the controller's default batch size (500): with
    2,000 a batch of heartbeats and rank arrays took ~600 ms on PostgreSQL, and a step verdict
    behind it waited that long."""
    path = folder / "controller.toml"
    path.write_text("[controller]\nsession_timeout_ms = 10000\nheartbeat_interval_ms = 1000\n"
                    "max_poll_interval_ms = 10000\n"
                    + (f"max_poll_records = {max_poll_records}\n" if max_poll_records else ""))
    return path


def _start_instances(n: int, kafka, db_url: str, group: str, cfg_path: str, logs: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "CLIFFGUARD_COMMAND_SECRET": SECRET.reveal().decode()}
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-m", "cliffguard", "controller", "--config", cfg_path, "--db", db_url,
               "--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix, "--group", group,
               "--partitions", str(kafka.partitions)]
        out = open(logs / f"controller-{i}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def run_fleet(broker, spec: FleetSpec, instances: int, *, duration_s: float, partitions: int, probes: int,
              hang_before_s: float, pg_url: str | None, warmup_s: float, settle_s: float = 30.0) -> dict:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    kafka = broker.kafka_config(topic_prefix=f"fleet{uuid.uuid4().hex[:6]}", partitions=partitions)
    ensure_topics(kafka)
    engine = fresh_store(pg_url=pg_url)
    db_url = engine.url.render_as_string(hide_password=False)
    tmp = Path(tempfile.mkdtemp(prefix="cliffguard-fleet-"))
    cfg_path = controller_toml(tmp)
    group = f"fleet-{uuid.uuid4().hex[:6]}"
    ticks = max(1, int(duration_s * spec.steps_per_s))
    spike_tick = max(25, ticks // 4)  # past the spike rule's warm-up (min_history points)
    hang_tick = max(spike_tick + 10, ticks - int(hang_before_s * spec.steps_per_s))
    names = [f"fleet{i}-{uuid.uuid4().hex[:6]}" for i in range(spec.runs)]
    spec = replace(spec, spikes={i: [spike_tick + i] for i in range(spec.runs)},
                   hung=(0, spec.ranks // 2 + 3 if spec.ranks > 1 else 0, hang_tick))
    stream = FleetStream(spec, names)
    probe_spec = FleetSpec(ranks=8, runs=probes, steps_per_s=spec.steps_per_s,
                           spikes={i: [spike_tick + 2 + 2 * i] for i in range(probes)}) if probes else None
    probe_stream = FleetStream(probe_spec, [f"probe{i}-{uuid.uuid4().hex[:6]}" for i in range(probes)]) \
        if probe_spec else None

    procs = _start_instances(instances, kafka, db_url, group, str(cfg_path), tmp)
    watch = CommandWatch(kafka)
    watch.start()
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=5, batch_size=512 * 1024,
                             max_request_size=4 * 1024 * 1024)
    ends = KafkaConsumer(**kafka.client_kwargs())
    parts = [TopicPartition(kafka.metrics_topic, p) for p in range(partitions)]
    offered = 0
    spike_sent: dict[str, float] = {}
    hang_ts: float | None = None
    lag: list[dict] = []
    cpu0 = {p.pid: _cpu_s(p.pid) for p in procs}
    self_cpu0 = time.process_time()
    try:
        time.sleep(warmup_s)  # controllers start and join the group before the load starts
        t_start = time.time()
        cpu_start = {p.pid: _cpu_s(p.pid) for p in procs}  # the CPU share counts the offered load only
        next_sample = t_start
        beats: list[tuple[str, object]] = []  # the tick's node heartbeats, sent spread over the tick
        sent_beats = 0

        def send(key: str, ev, k: int, sp) -> None:
            nonlocal offered
            producer.send(kafka.metrics_topic, key=key.encode(), value=encode_event(ev))
            offered += 1
            if ev.type is EventType.STEP and k in sp.spikes.get(sp_names[id(sp)].index(ev.run), ()):
                spike_sent[ev.run] = time.time()  # handed to the producer: the verdict clock starts

        sources = [(stream, spec)] + ([(probe_stream, probe_spec)] if probe_stream else [])
        sp_names = {id(sp): src.names for src, sp in sources}

        def spread_until(due: float) -> None:
            """Nodes beat on their own timers: a tick's heartbeats go out spread over the tick, not
            in one burst at the step boundary (which only the step and ranks events share)."""
            nonlocal sent_beats, next_sample
            tick_start = due - 1 / spec.steps_per_s
            while time.time() < due:
                share = int(len(beats) * min(1.0, (time.time() - tick_start) * spec.steps_per_s))
                for key, ev, kk, sp in beats[sent_beats:share]:
                    send(key, ev, kk, sp)
                sent_beats = max(sent_beats, share)
                time.sleep(min(0.005, max(0.0, due - time.time())))
                if time.time() >= next_sample:
                    next_sample += 1.0
                    lag.append(_lag_sample(ends, parts, engine, group, t_start, offered))
            for key, ev, kk, sp in beats[sent_beats:]:
                send(key, ev, kk, sp)
            sent_beats = len(beats)

        for k in range(ticks):
            spread_until(t_start + k / spec.steps_per_s)
            now = time.time()
            tick = [(key, ev, sp) for src, sp in sources for key, ev in src.tick(k, now)]
            beats, sent_beats = [(key, ev, k, sp) for key, ev, sp in tick if ev.type is EventType.HEARTBEAT], 0
            for kind in (EventType.STEP, EventType.RANKS):  # every run's step first, then the arrays
                for key, ev, sp in tick:
                    if ev.type is kind:
                        send(key, ev, k, sp)
            for key, ev, sp in tick:
                if ev.type not in (EventType.STEP, EventType.RANKS, EventType.HEARTBEAT):
                    send(key, ev, k, sp)
            if k == hang_tick:
                hang_ts = now
        spread_until(t_start + ticks / spec.steps_per_s)  # the last tick lasts its interval too
        producer.flush()
        t_end = time.time()
        cpu_end = {p.pid: _cpu_s(p.pid) for p in procs}
        processed = _committed(engine, group)
        lag.append(_lag_sample(ends, parts, engine, group, t_start, offered))
        # verdicts of the last spikes and the hung rank may still be on their way: wait for them
        deadline = time.time() + settle_s
        hung_rank = spec.hung[1]
        named_ts = None
        while time.time() < deadline:
            named_ts = _hung_named(engine, names[0], hung_rank)
            if named_ts is not None and all(r in watch.paused for r in spike_sent):
                break
            time.sleep(0.5)
    finally:
        cpu = {p.pid: _cpu_s(p.pid) - cpu0[p.pid] for p in procs}
        self_cpu = time.process_time() - self_cpu0
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        watch.stop.set()
        watch.join(5)
        producer.close()
        ends.close()
    alerts = _alerts_by_rule(engine, names[0])
    latencies = [(watch.paused[r] - t) * 1000 for r, t in spike_sent.items() if r in watch.paused]
    wall = t_end - t_start
    out = {
        "instances": instances, "ranks": spec.ranks, "runs": spec.runs, "probes": probes,
        "steps_per_s": spec.steps_per_s, "partitions": partitions, "duration_s": wall,
        "offered": offered, "processed": processed,
        "processed_over_offered": processed / offered if offered else None,
        "offered_events_per_s": offered / wall, "processed_events_per_s": processed / wall,
        "events_per_run_step": spec.events_per_run_step(),
        "verdict_ms": sorted(latencies), "verdict_p50_ms": _pct(latencies, 0.5),
        "verdict_p99_ms": _pct(latencies, 0.99), "spikes_injected": len(spike_sent),
        "spikes_paused": len(latencies),
        "hung_rank": hung_rank, "hung_named_s": (named_ts - hang_ts) if named_ts and hang_ts else None,
        "alerts_by_rule": alerts,
        "lag": lag,
        "cpu_s": {f"controller-{i}": cpu[p.pid] for i, p in enumerate(procs)},
        # CPU seconds / wall seconds of each controller process over the offered load (1.0 = one core)
        "cpu_share": {f"controller-{i}": (cpu_end[p.pid] - cpu_start[p.pid]) / wall for i, p in enumerate(procs)},
        "cpu_s_producer": self_cpu,
        "store": engine.url.get_backend_name(),
        "logs": str(tmp),
    }
    drop_store(engine)
    return out


def _lag_sample(ends, parts, engine, group: str, t0: float, offered: int) -> dict:
    # committed before the end offsets, so neither counts events the other could not have seen; the
    # lag is taken from what the bench has offered (exact), not from the end offsets (see the docstring)
    done = _committed(engine, group)
    end = sum(ends.end_offsets(parts).values())
    return {"t_s": round(time.time() - t0, 2), "offered": offered, "end_offsets": end, "committed": done,
            "lag": offered - done}


def _plot(results: list[dict], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r in results:
        ax.plot([s["t_s"] for s in r["lag"]], [s["lag"] for s in r["lag"]], label=f"{r['instances']} instance(s)")
    ax.set_xlabel("seconds into the offered load")
    ax.set_ylabel("consumer lag (events)")
    ax.set_title(f"{results[0]['runs']} run(s) x {results[0]['ranks']} ranks at {results[0]['steps_per_s']} step/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--ranks", type=int, default=16_384)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--steps-per-s", type=float, default=1.0)
    p.add_argument("--instances", default="1", help="controller instance counts, e.g. 1,2")
    p.add_argument("--duration-s", type=float, default=90.0, help="seconds of offered load per instance count")
    p.add_argument("--hang-before-s", type=float, default=60.0, help="the rank hangs this long before the end")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--probes", type=int, default=5, help="small extra runs with one spike each")
    p.add_argument("--warmup-s", type=float, default=15.0, help="controllers join the group before the load")
    p.add_argument("--settle-s", type=float, default=30.0,
                   help="after the load, wait this long at most for the last verdicts and the hung rank's name")
    p.add_argument("--pg-url", default=None, help="PostgreSQL store (default: a SQLite file)")
    p.add_argument("--plot", help="lag over time as PNG (default: beside --json)")
    args = p.parse_args(argv)
    spec = FleetSpec(ranks=args.ranks, runs=args.runs, steps_per_s=args.steps_per_s)
    results = []
    with EmbeddedBroker(port=0) as broker:
        for n in [int(x) for x in args.instances.split(",")]:
            r = run_fleet(broker, spec, n, duration_s=args.duration_s, partitions=args.partitions, probes=args.probes,
                          hang_before_s=args.hang_before_s, pg_url=args.pg_url, warmup_s=args.warmup_s,
                          settle_s=args.settle_s)
            results.append(r)
            print(f"{n} instance(s): offered {r['offered_events_per_s']:,.0f} ev/s, processed/offered "
                  f"{r['processed_over_offered']:.3f}, verdict p50/p99 {r['verdict_p50_ms']}/{r['verdict_p99_ms']} ms "
                  f"({r['spikes_paused']}/{r['spikes_injected']} spikes), hung rank named after "
                  f"{r['hung_named_s']} s, CPU s {r['cpu_s']}, CPU share over the load "
                  f"{ {k: round(v, 2) for k, v in r['cpu_share'].items()} }", flush=True)
    first = results[0]
    out = {
        "ranks": first["ranks"], "runs": first["runs"], "steps_per_s": first["steps_per_s"],
        "verdict_p99_ms": first["verdict_p99_ms"], "verdict_p50_ms": first["verdict_p50_ms"],
        "processed_over_offered": first["processed_over_offered"],
        "events_per_run_step": first["events_per_run_step"], "hung_named_s": first["hung_named_s"],
        "cpu_share": first["cpu_share"],
        "per_instances": {str(r["instances"]): r for r in results},
        "loadavg_1m": os.getloadavg()[0],
    }
    if len(results) > 1:
        base = results[0]["processed_events_per_s"]
        out["speedup"] = {str(r["instances"]): r["processed_events_per_s"] / base if base else None for r in results}
    out["plot"] = _plot(results, args.plot or str(Path(args.json).with_suffix(".png")))
    print(f"ranks {out['ranks']}: processed/offered {out['processed_over_offered']:.3f}, verdict p99 "
          f"{out['verdict_p99_ms']} ms, {out['events_per_run_step']:.1f} events per run-step; plot: {out['plot']}")
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
