"""Test helpers for the controller service: a scripted trainer over the real broker, stores, the
service on a thread, and the scripted streams the service tests and the fault suite share."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from sqlalchemy import Engine

from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.service import ControllerService
from cliffguard.controller.store.db import init_db, make_engine
from cliffguard.core.events import Command, decode_command, encode_event, make_event
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.signing import CommandVerifier, Rejection, Secret
from testing.controller_stack import step_data
from testing.pg_schema import pg_schema_store  # one synthetic step payload for tests and bench

SECRET = Secret("test-secret-of-enough-length")
RECOVERY = RecoveryConfig(stable_window=5, recover_window=5, rollback_budget=1)
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500, "max_poll_interval_ms": 3000}


def healthy_loss(step: int) -> float:
    # flat with a small deterministic wiggle: a healthy window for the spike rule
    return 2.0 + 0.01 * ((step * 7919) % 11 - 5) / 5


class FakeTrainer:
    """Plays the trainer of several runs: publishes events, reads (and verifies) commands."""

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self.producer = KafkaProducer(**kafka.client_kwargs(), linger_ms=0)
        self.consumer = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False,
                                      auto_offset_reset="earliest", fetch_max_wait_ms=20)
        parts = [TopicPartition(kafka.commands_topic, p) for p in range(kafka.partitions)]
        self.consumer.assign(parts)
        self.consumer.seek_to_beginning(*parts)
        self.received: dict[str, list[Command]] = {}
        self.verifiers: dict[str, CommandVerifier] = {}
        self.duplicates: list[Command] = []

    def send(self, run: str, type: str, step: int, data: dict, rank: int = 0, world: int = 1) -> None:
        ev = make_event(type, run, step, data, rank=rank, world=world)
        self.producer.send(self.kafka.metrics_topic, key=run.encode(), value=encode_event(ev))

    def send_raw(self, run: str, raw: bytes) -> None:
        self.producer.send(self.kafka.metrics_topic, key=run.encode(), value=raw)

    def steps(self, run: str, first: int, last: int, loss=healthy_loss) -> None:
        for step in range(first, last + 1):
            self.send(run, "step", step, step_data(loss(step), step))
        self.producer.flush()

    def checkpoint(self, run: str, step: int, kind: str = "memory") -> None:
        self.send(run, "checkpoint", step, {"kind": kind, "path": f"/ckpt/{step}", "bytes": 10, "sha256": "0" * 64,
                                            "seconds": 0.01, "verified": True})

    def ack(self, cmd: Command, status: str = "applied", detail: str = "") -> None:
        self.send(cmd.run, "command.ack", 0, {"cmd": cmd.id, "cmd_type": str(cmd.type), "status": status,
                                              "detail": detail})
        self.producer.flush()

    def validation(self, run: str, step: int, val_loss: float, cmd: Command | None = None) -> None:
        data = {"val_loss": val_loss, "batches": 4}
        if cmd is not None:
            data["cmd"] = cmd.id
        self.send(run, "validation", step, data)
        self.producer.flush()

    def poll(self, timeout_s: float = 0.2) -> None:
        for msgs in self.consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for m in msgs:
                cmd = decode_command(m.value)
                ver = self.verifiers.setdefault(cmd.run, CommandVerifier(cmd.run, SECRET))
                result = ver.verify(cmd)
                if result.reason is Rejection.REPLAYED:
                    # a re-send of a command already taken (outbox crash window): ack, never obey
                    self.duplicates.append(cmd)
                    self.ack(cmd, "duplicate", result.detail)
                    continue
                assert result.ok, f"command {cmd.id} failed verification: {result.detail}"
                self.received.setdefault(cmd.run, []).append(cmd)

    def expect(self, run: str, type: str, timeout_s: float = 30.0) -> Command:
        """The next unseen command of ``run``; it must be of ``type``."""
        seen = getattr(self, "_taken", {})
        self._taken = seen
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.received.get(run, [])
            if len(got) > seen.get(run, 0):
                cmd = got[seen.get(run, 0)]
                seen[run] = seen.get(run, 0) + 1
                assert str(cmd.type) == type, f"run {run}: expected {type}, got {cmd.type} {cmd.args}"
                return cmd
            self.poll()
        raise AssertionError(f"run {run}: no {type} command within {timeout_s}s (got {self.types(run)})")

    def types(self, run: str) -> list[str]:
        return [str(c.type) for c in self.received.get(run, [])]

    def quiet(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll(0.1)

    def close(self) -> None:
        self.producer.close(timeout=5)
        self.consumer.close()


@contextmanager
def store_engine(kind: str, tmp_path, pg_url: str | None = None) -> Iterator[tuple[Engine, str]]:
    """A migrated store: a SQLite file, or a fresh PostgreSQL schema dropped afterwards."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        eng = make_engine(url)
        init_db(eng)
        try:
            yield eng, url
        finally:
            eng.dispose()
        return
    assert pg_url is not None
    with pg_schema_store(pg_url, "svc") as store:
        yield store


class Running:
    """A ControllerService on a thread; always closed."""

    def __init__(self, kafka, engine, group: str | None = None, **service_kwargs) -> None:
        # a consumer group of its own unless a test shares one on purpose: the session broker's
        # groups outlive tests, and a clean-clone run saw a shared "ctl" group stop handing out
        # partitions after one test, failing every later controller that joined it
        group = group or f"ctl-{uuid.uuid4().hex[:8]}"
        cfg = ControllerConfig(group_id=group, tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
        self.svc = ControllerService(cfg, kafka, engine, SECRET, recovery=RECOVERY, **service_kwargs)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.svc.run_forever, args=(self.stop,), daemon=True)

    def __enter__(self) -> ControllerService:
        self.svc.start()
        self.thread.start()
        return self.svc

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


def wait_for(pred, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def prefix(t: FakeTrainer, run: str) -> None:
    """40 healthy steps with stable checkpoints at 10 and 20 and a validation baseline of 2.0."""
    t.steps(run, 0, 10)
    t.checkpoint(run, 10)
    t.steps(run, 11, 20)
    t.checkpoint(run, 20, "full")
    t.validation(run, 20, 2.0)
    t.steps(run, 21, 40)


def spike(t: FakeTrainer, run: str, first: int) -> None:
    t.steps(run, first, first + 2, loss=lambda s: 20.0)  # x10: extreme, critical at the first point
