"""The controller service's own settings (``[controller]`` in TOML, ``CLIFFGUARD_CONTROLLER__*``).

Rules (``controller.detect.RulesConfig``), recovery (``controller.recovery_types.RecoveryConfig``),
alerts and the store each own their config; Kafka, the spike rule, the rollback policy and the
command-signing secret are the deployment's (``core/deployment.py``). This one holds what only
the service loop needs.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from cliffguard.controller.edge_classify import ClockWindow
from cliffguard.core.declared import bounded, check_declared, non_empty


@dataclass(kw_only=True, slots=True)
class ControllerConfig:
    group_id: str = non_empty("cliffguard-controller")
    """Kafka consumer group; instances in the same group share the runs (by partition)."""
    poll_timeout_s: float = bounded(0.2, gt=0)
    """Longest wait of one poll; also bounds how late a tick (command timeouts) can be."""
    max_poll_records: int = bounded(500, ge=1)
    """Events per batch at most; one SQL transaction per batch. 500 keeps a batch well inside the
    group's ``max_poll_interval_ms`` on a busy machine; per-event costs dominate beyond ~100."""
    fetch_max_wait_ms: int = bounded(20, ge=0)
    """How long the broker may hold a fetch to fill it. Low: a spike's command latency is bounded
    by it (kafka-python's default of 500 ms would dominate the verdict latency)."""
    stuck_after_s: float = bounded(15.0, ge=0, why="0: off")
    """A metrics partition whose position has not moved for this long while the broker's log
    ends beyond it is logged (WARNING) and read again from the store's offset (controller/progress.py).
    Under the soak's bound of 20 s for the store standing still after a fault (bench/soak)."""
    unassigned_after_s: float = bounded(60.0, ge=0, why="0: off")
    """An instance that holds no metrics partition this long looks at the store: offsets its group
    stored within as long mean another member consumes (a standby, said once); none mean nobody
    reads the runs' events, which is logged (WARNING, then ERROR) and the group joined again, after
    twice as long each time (controller/assignment_watch.py)."""
    stall_dump_s: float = bounded(120.0, ge=0, why="0: off")
    """``cliffguard controller``: a consumer loop iteration that has not finished after this many
    seconds prints every thread's stack to the log (faulthandler), and again each as long again;
    SIGUSR1 prints them at any time. A loop stuck in a call that never returns is then said."""
    max_event_bytes: int = bounded(1_000_000, ge=1024)
    """Larger messages go to the DLQ as oversized (cut to their first 64 KiB there)."""
    max_fetch_bytes: int = 64 * 1_048_576
    """Per-partition fetch limit: a message larger than this (that the broker accepted) stalls
    its partition, so keep it above the broker's largest message (``message.max.bytes``)."""
    max_clock_skew_s: float = 3600.0
    """Events timestamped further ahead of the controller's clock go to the DLQ as clock_skew."""
    max_event_age_s: float = 30 * 86400.0
    """Events timestamped further behind it do too (wide: spills and backlogs are replayed late)."""
    max_step_jump: int = bounded(100_000, ge=1)
    """A step further than this from its run's newest accepted step goes to the DLQ as step_jump
    (further back is accepted after a rollback or reload the run reported; controller/bounds.py)."""
    tick_s: float = bounded(1.0, gt=0)
    """Seconds between time ticks (heartbeat loss, command timeouts)."""
    outbox_interval_s: float = bounded(0.5, gt=0)
    """The command outbox publisher's poll interval when nobody wakes it (commits do)."""
    request_poll_s: float = bounded(0.5, gt=0)
    """Seconds between looks at pending operator command requests (dashboard, ``cliffguard command``):
    bounds how long an operator waits before the controller signs or rejects a request."""
    outbox_batch: int = bounded(200, ge=1)
    """Outbox rows sent per pass."""
    outbox_retry_s: float = bounded(2.0, gt=0)
    """Wait before resending a command the broker did not confirm (doubles per attempt, max 60 s)."""
    session_timeout_ms: int = 10_000
    """Consumer group session timeout (a dead instance's runs move after this)."""
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = bounded(30_000, ge=1000)
    """Kafka's limit between polls; a first group join waits about this long on some brokers."""
    store_retry_initial_s: float = bounded(0.2, gt=0)
    """First wait before retrying a batch after a transient store error (locked, connection lost);
    doubles per failure up to ``store_retry_max_s``. Such a batch is retried forever, never skipped."""
    store_retry_max_s: float = 5.0
    health_port: int = bounded(0, ge=0, le=65535, reason="must be 0 (off) or a TCP port")
    """HTTP port of /healthz and /readyz (``controller/health.py``); 0 = no endpoint."""
    health_host: str = non_empty("127.0.0.1")
    """Address the health endpoint listens on (0.0.0.0 inside a container, for the kubelet)."""
    health_max_loop_age_s: float = bounded(30.0, gt=0)
    """/healthz fails when the consumer loop has not come round for this long (a hung process)."""
    gc_gen0_threshold: int = bounded(10_000, ge=0, why="0: Python's default")
    """Allocations between young-generation collections of Python's cyclic GC in a ``cliffguard
    controller`` process (``apply_gc_threshold``); 0 keeps Python's 700. The rules allocate per
    event while many runs' windows stay alive, and at 700 a 64-run batch spent ~16 % of its time in
    collections that find nothing to free (``bench.batch_speed``: 58 -> 49 µs per event)."""

    metadata_max_age_s: float = bounded(5.0, gt=0, le=300)
    """How often the consumer refreshes its cluster metadata at the latest. A topic deleted and
    created again (a broker that restarted empty) is noticed by its new topic id in the metadata;
    at kafka-python's default of 300 s the consumer read on at its old position in the new topic
    for minutes and skipped the new topic's first messages (the agent's listener uses 5 s too)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.max_fetch_bytes < self.max_event_bytes:
            raise ValueError("max_fetch_bytes: must be >= max_event_bytes")
        self.clock_window()  # ClockWindow checks its fields under the same names
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms: must be > 0 and < session_timeout_ms")
        if self.store_retry_max_s < self.store_retry_initial_s:
            raise ValueError("store_retry_max_s: must be >= store_retry_initial_s")

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
            "metadata_max_age_ms": int(self.metadata_max_age_s * 1000),
        }

