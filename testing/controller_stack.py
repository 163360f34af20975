"""Shared by the controller benchmarks: a broker, a fresh store, a controller, event payloads."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.service import ControllerService
from cliffguard.controller.store.db import init_db, make_engine
from cliffguard.controller.store.retention import RetentionConfig
from cliffguard.core.events import encode_event, make_event
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.rank_arrays import summarize_losses
from cliffguard.core.signing import Secret
from testing.pg_schema import create_schema, drop_schema

SECRET = Secret("bench-secret-bench-secret")
# The embedded broker's first group join waits about max_poll_interval_ms; 10 s keeps that short
# while leaving a batch room to finish on a loaded machine (being kicked from the group mid-batch
# makes the next batch stale, which is handled, but it is not what this benchmark measures).
GROUP = {"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000, "max_poll_interval_ms": 10_000}


def step_data(loss: float, step: int, batch: int = 8) -> dict:
    return {
        "loss": loss, "loss_local": loss, "lr": 1e-3, "lr_scale": 1.0, "grad_norm": 1.0, "tokens": 1024,
        "step_time_s": 0.05, "data_wait_s": 0.001, "comm_exposed_s": 0.001, "compute_s": 0.048,
        "tokens_per_s": 20000.0, "mfu": 0.5, "mem_allocated": 1000, "mem_reserved": 1200, "loss_scale": 1.0,
        "skipped": False, "clipped_layers": 0, "guard": "ok", "sample_range": [step * batch, (step + 1) * batch],
    }


def healthy_loss(step: int) -> float:
    return 3.0 / (1 + step / 500) + 0.01 * ((step * 7919) % 11 - 5) / 5


def step_bytes(run: str, step: int, loss: float | None = None) -> bytes:
    """Rank 0's run-level ``step`` event of a one-rank run, as the agent sends it (with ``rank_losses``)."""
    loss = healthy_loss(step) if loss is None else loss
    return encode_event(make_event("step", run, step, {**step_data(loss, step), "rank_losses": summarize_losses([loss])}))


def fresh_kafka(broker: EmbeddedBroker, partitions: int = 4) -> KafkaConfig:
    cfg = broker.kafka_config(topic_prefix=f"bench{uuid.uuid4().hex[:8]}", partitions=partitions)
    ensure_topics(cfg)
    return cfg


def fresh_store(root: Path | None = None, pg_url: str | None = None):
    """A new, empty store: a SQLite file under ``root`` (a temporary folder by default), or, with
    ``pg_url``, a fresh schema of that PostgreSQL database (see ``drop_store``)."""
    if pg_url:
        return create_schema(pg_url, "bench")[0]
    root = root or Path(tempfile.mkdtemp(prefix="cliffguard-bench-"))
    engine = make_engine(f"sqlite:///{root / f'{uuid.uuid4().hex[:8]}.db'}")
    init_db(engine)
    return engine


def drop_store(engine) -> None:
    """Dispose of a ``fresh_store`` engine, dropping its PostgreSQL schema."""
    drop_schema(engine)


class NoRules:
    """A detector that judges nothing: what the controller costs without its rules (the poll,
    decoding, the state machine and the store)."""

    def on_event(self, event) -> list:
        return []

    def tick(self, now: float) -> list:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def controller(kafka: KafkaConfig, engine, retention: RetentionConfig | None = None, detector_factory=None,
               **overrides) -> ControllerService:
    cfg = ControllerConfig(group_id=f"bench-{uuid.uuid4().hex[:6]}", **{**GROUP, **overrides})
    cfg.apply_gc_threshold()  # as `cliffguard controller` does: the benches measure the service as it runs
    return ControllerService(cfg, kafka, engine, SECRET, retention=retention, detector_factory=detector_factory)
