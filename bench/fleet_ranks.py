"""Run-level events on a real multi-process run: ``torchrun`` with N CPU processes (the bundled
trainer, a tiny GPT, one rank slowed) into the embedded broker.

    python -m bench.fleet_ranks --json OUT.json [--nproc 8 --steps 60 --ranks-every 2]

It reads the run's events back from the metrics topic and reports:

* ``step_events_per_step``: run-level ``step`` events per step (1 whatever N: rank 0 alone);
  ``events_per_run_step``: every event of the run per step, and the ``ranks`` events' share;
* the straggler the controller's rules find from the ``ranks`` arrays (``--slow-rank`` sleeps
  ``--slow-s`` per step);
* a frozen rank: after ``--freeze-at`` steps one rank is stopped (SIGSTOP, which a heartbeat cannot
  tell from a dead process and which, unlike SIGKILL, torchrun does not answer by killing the
  job); the others block in the next all-reduce while their node heartbeat goes on. The
  heartbeat rule (``warn_after_s`` ``--silence-s``) must name it, with its step, from the node
  heartbeat alone; ``time_to_name_s`` is from the stop to that verdict on the agent's clock.

tests/trainer/test_fleet_ranks.py runs the same with 4 processes (CI's smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.rules.heartbeat import HeartbeatConfig, HeartbeatRule
from cliffguard.controller.rules.straggler import StragglerConfig
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, decode_event
from cliffguard.core.rank_arrays import is_detail

TOML = """
[train]
val_every = 0
progress_every = 0
warmup_steps = 2

[data]
max_bytes = 200000
block_bytes = 4096

[checkpoint]
snapshot_every = 0
ckpt_every = 0
full_every = 0

[agent]
hist_every = 0
heartbeat_s = {heartbeat_s}
ranks_every = {ranks_every}
calibration_s = 0.05
"""


class EventLog:
    """Every event of one run on the metrics topic, read on a thread (manual assignment: no group
    join wait). Also the end-to-end tests' reader (tests/trainer/test_train_e2e.py)."""

    def __init__(self, kafka: Any, run: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.run = run
        self.events: list[Event] = []
        self._stop = threading.Event()
        self._consumer = KafkaConsumer(**kafka.client_kwargs(), group_id=None, enable_auto_commit=False,
                                       auto_offset_reset="earliest", fetch_max_wait_ms=100)
        parts = self._consumer.partitions_for_topic(kafka.metrics_topic) or {0}
        self._consumer.assign([TopicPartition(kafka.metrics_topic, p) for p in parts])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for records in self._consumer.poll(timeout_ms=100).values():
                for r in records:
                    ev = decode_event(r.value)
                    if ev.run == self.run:
                        self.events.append(ev)

    def wait(self, what: Any, timeout: float = 60.0, msg: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = what()
            if got:
                return got
            time.sleep(0.05)
        raise TimeoutError(f"timed out waiting for {msg}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` whose command line holds ``marker``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if marker not in cmdline or "cliffguard.trainer.run" not in cmdline:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def _last_run_step(log: EventLog) -> int:
    return max((e.step for e in list(log.events) if e.type is EventType.STEP and not is_detail(e.data)), default=-1)


def measure(kafka: Any, *, nproc: int = 8, steps: int = 60, ranks_every: int = 2, slow_rank: int = 2,
            slow_s: float = 0.05, freeze_rank: int | None = None, freeze_at: int = 40, silence_s: float = 3.0,
            heartbeat_s: float = 0.5, workdir: str | Path | None = None, timeout_s: float = 240.0) -> dict[str, Any]:
    """Run the job, read its events, judge them; the figures (see the module docstring)."""
    freeze_rank = nproc - 1 if freeze_rank is None else freeze_rank
    run = f"fleet-{uuid.uuid4().hex[:8]}"
    tmp = Path(workdir or tempfile.mkdtemp(prefix="fleet-ranks-"))
    (tmp / "train.toml").write_text(TOML.format(heartbeat_s=heartbeat_s, ranks_every=ranks_every))
    out_dir = tmp / f"runs-{run}"
    log = EventLog(kafka, run)
    cmd = [sys.executable, "-m", "cliffguard.cli", "train", "--nproc", str(nproc), "--run", run,
           "--config", str(tmp / "train.toml"), "--out-dir", str(out_dir), "--bootstrap", kafka.bootstrap,
           "--topic-prefix", kafka.topic_prefix, "--steps", str(steps), "--global-batch", str(2 * nproc),
           "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--seq-len", "16",
           "--fault", f"slow_rank@{slow_rank}:{slow_s}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    with open(tmp / "train.log", "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        frozen_at: float | None = None
        frozen_step: int | None = None
        pid: int | None = None
        try:
            log.wait(lambda: _last_run_step(log) >= freeze_at, timeout_s, f"step {freeze_at}")
            pid = _rank_pid(str(out_dir), freeze_rank)
            if pid is None:
                raise RuntimeError(f"no process for rank {freeze_rank}")
            os.kill(pid, signal.SIGSTOP)
            frozen_at = time.time()
            frozen_step = _last_run_step(log)
            # the others block in the next all-reduce; the node heartbeats go on and age the frozen rank
            log.wait(lambda: [e for e in list(log.events) if e.type is EventType.HEARTBEAT
                              and e.ts >= frozen_at + silence_s + 2 * heartbeat_s], 60, "heartbeats after the stop")
        finally:
            # The stopped rank first, by pid: torchrun's workers may sit in a process group of their
            # own, and a stopped process outlives a group kill that does not reach it.
            for kill in ((lambda: os.kill(pid, signal.SIGKILL)) if pid is not None else None,
                         lambda: os.killpg(proc.pid, signal.SIGKILL)):
                if kill is None:
                    continue
                try:
                    kill()
                except ProcessLookupError:
                    pass
            proc.wait(30)
            time.sleep(0.5)
            log.close()
    wall = time.monotonic() - t0
    return judge(log.events, nproc=nproc, ranks_every=ranks_every, slow_rank=slow_rank, freeze_rank=freeze_rank,
                 frozen_at=frozen_at, frozen_step=frozen_step, silence_s=silence_s) | {"wall_s": round(wall, 1)}


def judge(events: list[Event], *, nproc: int, ranks_every: int, slow_rank: int, freeze_rank: int,
          frozen_at: float | None, frozen_step: int | None, silence_s: float) -> dict[str, Any]:
    """What the events show, and what the controller's rules conclude from them."""
    run_steps = Counter(e.step for e in events if e.type is EventType.STEP and not is_detail(e.data))
    by_type = Counter(str(e.type) for e in events)
    step_senders = {e.rank for e in events if e.type is EventType.STEP}
    beat_senders = {e.rank for e in events if e.type is EventType.HEARTBEAT}
    det = RunDetector(RulesConfig(straggler=StragglerConfig(window=8, confirm=2),
                                  heartbeat=HeartbeatConfig(enabled=False)))
    straggler = []
    for e in events:
        straggler += [v for v in det.on_event(e) if v.rule == "straggler"]
    beats = HeartbeatRule(HeartbeatConfig(warn_after_s=silence_s, critical_after_s=3600, hung_after_s=0))
    named: list[tuple[float, Any]] = []
    for e in sorted(events, key=lambda e: e.ts):
        beats.on_event(e)
        if e.type is EventType.HEARTBEAT:
            named += [(e.ts, v) for v in beats.tick(e.ts)]
    frozen = [(ts, v) for ts, v in named if v.rank == freeze_rank]
    others = sorted({v.rank for _, v in named if v.rank != freeze_rank})
    last_beat = max((e for e in events if e.type is EventType.HEARTBEAT), key=lambda e: e.ts, default=None)
    n_steps = len(run_steps)
    return {
        "nproc": nproc,
        "steps": n_steps,
        "events": len(events),
        "events_by_type": dict(by_type),
        "step_events_per_step": max(run_steps.values(), default=0),
        "events_per_run_step": round(len(events) / max(n_steps, 1), 3),
        "ranks_events": by_type.get(str(EventType.RANKS), 0),
        "ranks_every": ranks_every,
        "step_senders": sorted(step_senders),
        "heartbeat_senders": sorted(beat_senders),
        "straggler": {"expected": slow_rank, "found": [v.rank for v in straggler],
                      "at_step": straggler[0].step if straggler else None},
        "frozen": {
            "rank": freeze_rank,
            "stopped_after_step": frozen_step,
            "named": bool(frozen),
            "named_step": frozen[0][1].step if frozen else None,
            "message": frozen[0][1].message if frozen else None,
            "time_to_name_s": round(frozen[0][0] - frozen_at, 2) if frozen and frozen_at else None,
            "others_named": others,
            "others_wait_in": sorted({c for r, c in zip(last_beat.data["ranks"], last_beat.data["collectives"],
                                                        strict=True) if r != freeze_rank})
            if last_beat is not None and last_beat.data.get("ranks") else [],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_ranks", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ranks-every", type=int, default=2)
    p.add_argument("--freeze-at", type=int, default=40)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    from cliffguard.controller.broker import EmbeddedBroker, ensure_topics

    broker = EmbeddedBroker(port=0).start()
    try:
        kafka = broker.kafka_config(topic_prefix=f"fleet{uuid.uuid4().hex[:6]}", partitions=1)
        ensure_topics(kafka)
        res = measure(kafka, nproc=args.nproc, steps=args.steps, ranks_every=args.ranks_every,
                      freeze_at=args.freeze_at)
    finally:
        broker.stop()
    fr, st = res["frozen"], res["straggler"]
    rows = [("processes", res["nproc"]), ("steps seen", res["steps"]),
            ("step events per step", res["step_events_per_step"]), ("events per run step", res["events_per_run_step"]),
            ("ranks events", f"{res['ranks_events']} (every {res['ranks_every']} steps)"),
            ("step / heartbeat senders", f"{res['step_senders']} / {res['heartbeat_senders']}"),
            ("straggler expected / found", f"{st['expected']} / {st['found']} at step {st['at_step']}"),
            ("frozen rank named", f"{fr['rank']}: {fr['named']} after {fr['time_to_name_s']} s ({fr['message']})"),
            ("others wait in", fr["others_wait_in"]), ("wall", f"{res['wall_s']} s")]
    for k, v in rows:
        print(f"{k:28s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    ok = (res["step_events_per_step"] == 1 and st["found"][:1] == [st["expected"]] and fr["named"]
          and not fr["others_named"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
