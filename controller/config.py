"""The controller service's own settings (``[controller]`` in TOML, ``CLIFFGUARD_CONTROLLER__*``).

Rules (``controller.detect.RulesConfig``), recovery (``controller.recovery_types.RecoveryConfig``),
alerts and the store each own their config; Kafka, the spike rule, the rollback policy and the
command-signing secret are the deployment's (``core/deployment.py``). This one holds what only
the service loop needs.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from cliffguard.controller.edge import ClockWindow


@dataclass(kw_only=True, slots=True)
class ControllerConfig:
    group_id: str = "cliffguard-controller"
    """Kafka consumer group; instances in the same group share the runs (by partition)."""
    poll_timeout_s: float = 0.2
    """Longest wait of one poll; also bounds how late a tick (command timeouts) can be."""
    max_poll_records: int = 500
    """Events per batch at most; one SQL transaction per batch. 500 keeps a batch well inside the
    group's ``max_poll_interval_ms`` on a busy machine; per-event costs dominate beyond ~100."""
    fetch_max_wait_ms: int = 20
    """How long the broker may hold a fetch to fill it. Low: a spike's command latency is bounded
    by it (kafka-python's default of 500 ms would dominate the verdict latency)."""
    max_event_bytes: int = 1_000_000
    """Larger messages go to the DLQ as oversized (cut to their first 64 KiB there)."""
    max_fetch_bytes: int = 64 * 1_048_576
    """Per-partition fetch limit: a message larger than this (that the broker accepted) stalls
    its partition, so keep it above the broker's largest message (``message.max.bytes``)."""
    max_clock_skew_s: float = 3600.0
    """Events timestamped further ahead of the controller's clock go to the DLQ as clock_skew."""
    max_event_age_s: float = 30 * 86400.0
    """Events timestamped further behind it do too (wide: spills and backlogs are replayed late)."""
    max_step_jump: int = 100_000
    """A step further than this from its run's newest accepted step goes to the DLQ as step_jump
    (further back is accepted after a rollback or reload the run reported; controller/bounds.py)."""
    tick_s: float = 1.0
    """Seconds between time ticks (heartbeat loss, command timeouts)."""
    outbox_interval_s: float = 0.5
    """The command outbox publisher's poll interval when nobody wakes it (commits do)."""
    request_poll_s: float = 0.5
    """Seconds between looks at pending operator command requests (dashboard, ``cliffguard command``):
    bounds how long an operator waits before the controller signs or rejects a request."""
    outbox_batch: int = 200
    """Outbox rows sent per pass."""
    outbox_retry_s: float = 2.0
    """Wait before resending a command the broker did not confirm (doubles per attempt, max 60 s)."""
    session_timeout_ms: int = 10_000
    """Consumer group session timeout (a dead instance's runs move after this)."""
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 30_000
    """Kafka's limit between polls; a first group join waits about this long on some brokers."""
    store_retry_initial_s: float = 0.2
    """First wait before retrying a batch after a transient store error (locked, connection lost);
    doubles per failure up to ``store_retry_max_s``. Such a batch is retried forever, never skipped."""
    store_retry_max_s: float = 5.0
    health_port: int = 0
    """HTTP port of /healthz and /readyz (``controller/health.py``); 0 = no endpoint."""
    health_host: str = "127.0.0.1"
    """Address the health endpoint listens on (0.0.0.0 inside a container, for the kubelet)."""
    health_max_loop_age_s: float = 30.0
    """/healthz fails when the consumer loop has not come round for this long (a hung process)."""
    gc_gen0_threshold: int = 10_000
    """Allocations between young-generation collections of Python's cyclic GC in a ``cliffguard
    controller`` process (``apply_gc_threshold``); 0 keeps Python's 700. The rules allocate per
    event while many runs' windows stay alive, and at 700 a 64-run batch spent ~16 % of its time in
    collections that find nothing to free (``bench.batch_speed``: 58 -> 49 µs per event)."""

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id: must not be empty")
        if self.poll_timeout_s <= 0:
            raise ValueError("poll_timeout_s: must be > 0")
        if self.max_poll_records < 1:
            raise ValueError("max_poll_records: must be >= 1")
        if self.fetch_max_wait_ms < 0:
            raise ValueError("fetch_max_wait_ms: must be >= 0")
        if self.max_event_bytes < 1024:
            raise ValueError("max_event_bytes: must be >= 1024")
        if self.max_fetch_bytes < self.max_event_bytes:
            raise ValueError("max_fetch_bytes: must be >= max_event_bytes")
        self.clock_window()  # ClockWindow checks its fields under the same names
        if self.max_step_jump < 1:
            raise ValueError("max_step_jump: must be >= 1")
        if self.tick_s <= 0:
            raise ValueError("tick_s: must be > 0")
        if self.outbox_interval_s <= 0:
            raise ValueError("outbox_interval_s: must be > 0")
        if self.request_poll_s <= 0:
            raise ValueError("request_poll_s: must be > 0")
        if self.outbox_batch < 1:
            raise ValueError("outbox_batch: must be >= 1")
        if self.outbox_retry_s <= 0:
            raise ValueError("outbox_retry_s: must be > 0")
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms: must be > 0 and < session_timeout_ms")
        if self.max_poll_interval_ms < 1000:
            raise ValueError("max_poll_interval_ms: must be >= 1000")
        if not self.store_retry_initial_s > 0:
            raise ValueError("store_retry_initial_s: must be > 0")
        if self.store_retry_max_s < self.store_retry_initial_s:
            raise ValueError("store_retry_max_s: must be >= store_retry_initial_s")
        if not 0 <= self.health_port <= 65535:
            raise ValueError("health_port: must be 0 (off) or a TCP port")
        if not self.health_host:
            raise ValueError("health_host: must not be empty")
        if self.health_max_loop_age_s <= 0:
            raise ValueError("health_max_loop_age_s: must be > 0")
        if self.gc_gen0_threshold < 0:
            raise ValueError("gc_gen0_threshold: must be >= 0 (0: Python's default)")

    def apply_gc_threshold(self) -> None:
        """Set the process's young-generation GC threshold (a process-wide choice: called by the
        controller's entry point, not by a service embedded in another program)."""
        if self.gc_gen0_threshold:
            gc.set_threshold(self.gc_gen0_threshold, *gc.get_threshold()[1:])

    def clock_window(self) -> ClockWindow:
        return ClockWindow(max_clock_skew_s=self.max_clock_skew_s, max_event_age_s=self.max_event_age_s)

    def consumer_overrides(self) -> dict[str, int]:
        return {
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "max_poll_interval_ms": self.max_poll_interval_ms,
        }

