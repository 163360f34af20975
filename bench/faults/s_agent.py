"""Holes in the agent inside the trainer: its spill file, run id, command inbox, a lost broker."""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from bench.faults.harness import (
    SECRET,
    ControllerProc,
    Ctx,
    Measured,
    ScenarioFailed,
    TinyTraining,
    fresh_kafka,
    steps_stored,
    store,
    wait_until,
)
from bench.faults.registry import scenario
from cliffguard.agent.drafts import draft_event
from cliffguard.controller.broker import EmbeddedBroker, ensure_topics, free_port
from cliffguard.core.events import encode_command, make_command
from cliffguard.core.signing import sign_command
from testing.controller_stack import step_data


class _TinyDisk:
    """A directory on a tmpfs of ``size_kb``; ``grow()`` is the disk recovering. Without mount
    rights, RLIMIT_FSIZE on this process plays the full disk (EFBIG instead of ENOSPC)."""

    def __init__(self, path: Path, size_kb: int) -> None:
        self.path, self.size_kb = path, size_kb
        path.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k,mode=0700", "tmpfs", str(path)],
                           capture_output=True)
        self.mounted = r.returncode == 0
        if not self.mounted:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            self._limits = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size_kb * 1024, self._limits[1]))

    def grow(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,size=64m", str(self.path)], check=True)
        else:
            resource.setrlimit(resource.RLIMIT_FSIZE, self._limits)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        else:
            resource.setrlimit(resource.RLIMIT_FSIZE, self._limits)


def _delivered_ids(kafka, timeout_s: float, want: int) -> set[str]:
    import json

    consumer = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest",
                             fetch_max_wait_ms=50)
    tp = TopicPartition(kafka.metrics_topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    ids: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(ids) < want and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=200).values():
                for msg in msgs:
                    obj = json.loads(msg.value)
                    if obj.get("type") == "step":
                        ids.add(obj["id"])
    finally:
        consumer.close()
    return ids


@scenario("h04_full_spill_disk_recovers", "4: a full spill disk left phantom records; 0 of 3,100 delivered after",
          timeout_s=150)
def full_spill_disk(ctx: Ctx) -> Measured:
    from cliffguard.agent.publisher import Publisher, PublisherConfig

    m = Measured()
    broker = EmbeddedBroker(port=free_port()).start()
    disk = _TinyDisk(ctx.tmp / "spill", 96)
    pub = None
    try:
        kafka = broker.kafka_config(topic_prefix="spill", partitions=1)
        ensure_topics(kafka)
        pub = Publisher(kafka, PublisherConfig(spill_path=str(disk.path / "agent.bin"), fsync_interval_s=0,
                                               send_timeout_s=1.0, reconnect_max_s=0.5)).start()
        run, ids = "spill", []

        def publish(first: int, n: int) -> None:
            for step in range(first, first + n):
                ev = draft_event("step", run, step, step_data(2.0, step))
                ids.append(ev.id)
                pub.publish(ev)

        publish(0, 100)
        wait_until(lambda: pub.stats()["sent"] >= 100, 30, "100 events sent before the outage")
        broker.stop()
        for first in range(100, 2100, 50):  # the spill fills the disk: what does not fit is dropped and counted
            publish(first, 50)
            wait_until(lambda: pub.stats()["queued"] == 0, 60, "the queue drained into the spill")
        dropped_full = pub.dropped()
        m.check(dropped_full > 0, "the disk never filled (nothing dropped)")
        disk.grow()
        publish(2100, 1000)  # the disk has room again; the broker is still down
        wait_until(lambda: pub.stats()["queued"] == 0, 60, "the queue drained into the grown spill")
        t0 = time.monotonic()
        broker.start()
        ensure_topics(kafka)
        accepted = len(ids) - 100 - pub.dropped()  # spilled during the outage and never reported dropped
        m.events_produced = accepted
        wait_until(lambda: pub.stats()["spill_pending"] == 0 and pub.stats()["queued"] == 0, 90,
                   "the spill replayed")
        got = _delivered_ids(kafka, 60, accepted)
        m.recover_s = time.monotonic() - t0
        m.events_stored = len(got & set(ids[100:]))
        after = set(ids[2100:])
        m.check(after <= got, f"{len(after - got)} of the 1000 events after the disk recovered were not delivered")
        m.note(f"disk {'tmpfs' if disk.mounted else 'RLIMIT_FSIZE'}; {dropped_full} dropped (reported) while "
               f"full; {len(got)} delivered after the broker returned; stats {pub.stats()}")
    finally:
        if pub is not None:
            pub.close(timeout=2)
        disk.close()
        broker.stop()
    return m


@scenario("h13_planted_spill_symlink", "13: the spill path followed a planted symlink and overwrote its target",
          timeout_s=60)
def planted_symlink(ctx: Ctx) -> Measured:
    from cliffguard.core.kafka_config import KafkaConfig

    m = Measured()
    target = ctx.path("precious.txt")
    target.write_bytes(b"keep me")
    legacy = "cliffguard-spill-sym-r0.bin"  # the pre-instance name, predictable to an attacker
    planted = {
        "link at the spill file": lambda d: (d.mkdir(mode=0o700), (d / legacy).symlink_to(target)),
        "link as the spill dir": lambda d: d.symlink_to(target.parent),
        "another user's dir": lambda d: (d.mkdir(mode=0o777), os.chown(d, 65534, 65534)),
    }
    dead = KafkaConfig(bootstrap="127.0.0.1:1")  # no broker: every event goes to the spill file
    for what, plant in planted.items():
        spill_dir = ctx.tmp / f"spill-{len(os.listdir(ctx.tmp))}"
        plant(spill_dir)
        m.forged_sent += 1
        try:
            tr = TinyTraining("sym", dead, spill_dir)
        except ValueError as exc:
            m.check("spill_path" in str(exc), f"{what}: refused without naming spill_path: {exc}")
            continue
        for _ in range(5):
            tr.step()
        tr.close()
        # Each start spills to a file named by its own instance id, never a name planted in advance.
        spills = [p for p in spill_dir.iterdir() if p.name.startswith("cliffguard-spill-") and p.name != legacy]
        if not spills or any(p.is_symlink() or not p.is_file() for p in spills):
            m.forged_obeyed += 1
            m.check(False, f"{what}: accepted, and the spill went to {[str(p) for p in spills]}")
        else:
            m.note(f"{what}: the planted name was left alone; this start spilled to {spills[0].name}")
    m.check(target.read_bytes() == b"keep me", "the planted link's target was changed")
    m.note(f"{m.forged_sent - m.forged_obeyed} of {m.forged_sent} planted spill paths refused, target intact")
    return m


@scenario("h14_invalid_run_id_refused", "14: an invalid run id was accepted and every event silently dropped",
          timeout_s=60)
def invalid_run_id(ctx: Ctx) -> Measured:
    from cliffguard.agent.hooks import AgentConfig

    m = Measured()
    for run in ("team a/run 7", "", "r" * 300, "run\n7", "../etc"):
        m.forged_sent += 1
        try:
            AgentConfig(run=run)
        except ValueError as exc:
            m.check(str(exc).startswith("run"), f"{run!r}: error does not name the field: {exc}")
            continue
        m.forged_obeyed += 1
        m.check(False, f"run id {run!r} accepted")
    # a valid id still reaches the store through a real controller
    kafka = fresh_kafka(ctx.bootstrap)
    with store(ctx) as (engine, url), ControllerProc(kafka, url, ctx.path("controller.log")) as ctl:
        tr = TinyTraining("team-a.run_7", kafka, ctx.tmp / "spill")
        for _ in range(20):
            tr.step()
        tr.close()
        m.events_produced = 20
        wait_until(lambda: len(steps_stored(engine, "team-a.run_7")) >= 20, 60, "20 steps of the valid id stored")
        m.events_stored = len(steps_stored(engine, "team-a.run_7"))
        m.note(f"{m.forged_sent - m.forged_obeyed} of {m.forged_sent} invalid run ids refused at AgentConfig; "
               f"a valid id's {m.events_stored} steps stored")
        if ctl.crashed:
            m.crashes += 1
    return m


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.n += 1


@scenario("h15_command_junk_flood", "15: a 5,000-command junk flood cost 4 s of training-thread time, 10k log lines",
          timeout_s=90, smoke=True)
def junk_flood(ctx: Ctx) -> Measured:
    from cliffguard.agent.listener import CommandListener
    from cliffguard.core.signing import CommandVerifier

    m = Measured()
    kafka = fresh_kafka(ctx.bootstrap)
    run = "flood"
    lines = _Count()
    logging.getLogger("agent").addHandler(lines)
    rejected: list[tuple] = []
    listener = CommandListener(kafka, run, CommandVerifier(run, SECRET), lambda *a: rejected.append(a)).start()
    producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=5)
    try:
        for i in range(5000):
            junk = b"junk %d" % i if i % 2 else encode_command(make_command("resume", run))  # unsigned
            producer.send(kafka.commands_topic, key=run.encode(), value=junk)
        m.forged_sent = 5000
        # A full inbox drops what arrives next, a genuine command included; the controller's
        # answer to that is its command timeout and a resend (a new id), played here every 5 s.
        good_ids: list[str] = []
        got, busy, next_send = [], 0.0, 0.0
        deadline = time.monotonic() + 60
        while not any(c.id in good_ids for c in got) and time.monotonic() < deadline:  # one poll per step
            if len(good_ids) < 3 and time.monotonic() >= next_send:
                good = sign_command(make_command("pause", run), SECRET)
                good_ids.append(good.id)
                producer.send(kafka.commands_topic, key=run.encode(), value=encode_command(good))
                producer.flush()
                next_send = time.monotonic() + 5.0
            t0 = time.perf_counter()
            got += listener.poll()
            busy += time.perf_counter() - t0
            time.sleep(0.005)
        m.commands_sent = len(good_ids)
        m.commands_obeyed = sum(c.id in good_ids for c in got)
        m.duplicate_commands = max(0, m.commands_obeyed - 1)
        m.forged_obeyed = sum(c.id not in good_ids for c in got)
        m.check(m.commands_obeyed == 1, f"the genuine command came through {m.commands_obeyed} times "
                                        f"in {len(good_ids)} sends")
        m.check(busy < 1.0, f"{busy:.2f}s of training-thread time in poll()")
        m.check(lines.n <= 50, f"{lines.n} log lines")
        m.note(f"training thread {busy * 1000:.0f} ms in poll(), {lines.n} log lines, "
               f"{listener.dropped} dropped past the inbox, {len(rejected)} refusals acked; the genuine "
               f"command needed {len(good_ids)} send(s)")
    finally:
        producer.close()
        listener.close()
    return m


@scenario("a_broker_restart_empty", "held: broker killed and restarted empty; no step row lost, training never blocked",
          timeout_s=180)
def broker_restart(ctx: Ctx) -> Measured:
    m = Measured()
    broker = EmbeddedBroker(port=free_port()).start()
    try:
        kafka = broker.kafka_config(topic_prefix="restart", partitions=1)
        ensure_topics(kafka)
        with store(ctx) as (engine, url), ControllerProc(kafka, url, ctx.path("controller.log")) as ctl:
            tr = TinyTraining("restart", kafka, ctx.tmp / "spill")
            for step in range(200):
                if step == 60:
                    broker.stop()
                if step == 120:
                    t0 = time.monotonic()
                    broker.start()
                    ensure_topics(kafka)
                tr.step()
                time.sleep(0.01)
            tr.close()
            m.events_produced = 200
            try:
                wait_until(lambda: len(steps_stored(engine, "restart")) >= 200, 90, "200 step rows stored")
            except ScenarioFailed as exc:
                m.check(False, str(exc))
            m.recover_s = time.monotonic() - t0
            m.events_stored = len(steps_stored(engine, "restart") & set(range(200)))
            slowest = max(tr.step_s)
            m.check(slowest < 0.5, f"a training step took {slowest:.2f}s (blocked)")
            m.note(f"slowest step {slowest * 1000:.0f} ms while the broker was down")
            if ctl.crashed:
                m.crashes += 1
    finally:
        broker.stop()
    return m
