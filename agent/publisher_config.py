"""What a ``Publisher`` (agent/publisher.py) is configured with, and the kafka-python producer it
builds on every (re)connect: the settings and the client plumbing, apart from the thread's logic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.agent.kafka_client import keep_kafka_off_global_random, key_hash_partitioner, tcp_reachable
from cliffguard.core.declared import bounded, check_declared, non_empty
from cliffguard.core.kafka_config import KafkaConfig


@dataclass(kw_only=True, slots=True)
class PublisherConfig:
    spill_path: str = non_empty("cliffguard-spill.bin")
    """Spill file for events that cannot be sent now; one per process (give each rank its own)."""
    spill_max_bytes: int = bounded(256 * 1024 * 1024, ge=1024)
    """Most bytes waiting in the spill; newer events past it are dropped and counted."""
    queue_max: int = bounded(100_000, ge=1)
    """Events held in memory between publish() and the publisher thread; past it they are dropped."""
    max_batch: int = bounded(2_000, ge=1)
    """Most events the thread sends (or replays) per flush."""
    linger_s: float = bounded(1.0, gt=0, le=1)
    """How long routine telemetry (steps, ranks, heartbeats, histograms) gathers after the first
    one is queued before the thread sends the lot: kafka-python spends ~2 ms of CPU per send and
    flush in the training process, whatever the batch holds, so per event at tens of steps a
    second that is a few percent of a step. Anything else (a guard verdict other than ``ok``,
    command acks, run start/end) is sent at once with whatever is queued. An idle thread sleeps
    until ``publish`` wakes it."""
    send_timeout_s: float = bounded(3.0, ge=0.5)
    """A batch not acknowledged within this marks the broker down (kafka delivery timeout)."""
    reconnect_min_s: float = 0.2
    """First wait before probing a broker that went away; doubles per failed probe."""
    reconnect_max_s: float = 2.0
    """Longest wait between probes."""
    fsync_interval_s: float = bounded(1.0, ge=0)
    """The spill is fsync'ed at most this often (0 = every append); see agent/spill.py."""
    create_topic: bool = True
    """Create the metrics topic on every (re)connect if it is missing."""
    resend_window_s: float = bounded(300.0, ge=0, why="0: keep nothing")
    """Events the broker acknowledged within this many seconds are kept and sent again if the
    broker loses its log (agent/acked_tail.py); it should exceed the longest time the controller
    may be away (stopped, restarting, holding a batch) while the broker could crash."""
    resend_max_bytes: int = bounded(64 * 1024 * 1024, ge=0, why="0: keep nothing")
    """At most this many bytes of acknowledged events are kept for that (oldest leave first)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("reconnect_min_s: must be > 0 and <= reconnect_max_s")


def kafka_producer(kafka: KafkaConfig, config: PublisherConfig) -> Any:
    """The default producer: what a ``Publisher`` without a ``producer_factory`` builds on every
    (re)connect."""
    if not tcp_reachable(kafka):
        # Nothing even accepts TCP: skip kafka-python's bootstrap, which waits out its timeout.
        raise ConnectionError("no bootstrap host accepts connections")
    from kafka import KafkaProducer

    keep_kafka_off_global_random()

    kw = kafka.client_kwargs()
    send_ms = int(config.send_timeout_s * 1000)
    kw["request_timeout_ms"] = min(kw["request_timeout_ms"], max(send_ms - 100, 400))
    return KafkaProducer(
        **kw,
        client_id="cliffguard-agent",
        acks="all",
        # _send() flushes each batch itself; until then records wait, so a batch goes in one
        # produce request instead of one per record (the first record woke the I/O thread)
        linger_ms=50,
        max_in_flight_requests_per_connection=1,
        delivery_timeout_ms=send_ms,
        max_block_ms=send_ms,
        bootstrap_timeout_ms=send_ms,  # a probe of a dead broker must not block for 30 s
        reconnect_backoff_max_ms=1000,
        batch_size=256 * 1024,
        retry_backoff_ms=100,
        # per record, kafka-python's metrics and the key's hash were most of its CPU in the
        # training process (a record every step); nothing reads the producer's metrics
        metrics_enabled=False,
        partitioner=key_hash_partitioner(),
    )


def topic_id_of(producer: Any, topic: str) -> object:
    """The topic's id in a kafka-python producer's metadata (None when it has none)."""
    return getattr(getattr(producer, "_metadata", None), "topic_id", lambda _t: None)(topic)
