"""The agent's command inbox: a background consumer on ``<prefix>.commands``.

A thread reads the commands topic (manual partition assignment: no consumer group, so no
rebalance wait and every trainer sees every command). It starts at the *end* of the topic, as it
is when ``start()`` returns: commands issued before the trainer started are not acted on. Records
keyed by another run are skipped without decoding (other trainers' traffic is none of ours).

``poll()`` runs on the training thread at a step boundary and returns, in arrival order, the
commands that decoded, are for this run, are correctly signed, have not expired and were not seen
before. Every other record keyed by this run is refused through ``on_reject(cmd_id, cmd_type,
status, detail)``, also called from ``poll()`` on the training thread so the callback can publish
the ``command.ack`` event without any locking of its own:

==========================  ====================  ===========================================
what                        status                detail
==========================  ====================  ===========================================
undecodable / bad schema    ``REJECTED``          ``undecodable: <field>: <reason>``
bad signature               ``REJECTED``          ``bad_signature: ...``
body for another run        ``REJECTED``          ``other_run: ...``
expired                     ``EXPIRED``           ``expired: ...``
replay of an accepted id    ``DUPLICATE``         ``replayed: ...``
==========================  ====================  ===========================================

When the broker goes away the consumer keeps retrying. A broker that comes back empty (Tansu
restarts) gets the topic created again, with offsets from 0: the listener notices the new topic
id and reads the new topic from its beginning, so commands published after the restart are not
missed (see ``core.topic_watch``). A failure inside the thread is logged and
counted (``errors``) and the thread carries on.

A junk flood is bounded and cannot crowd out a real command: each record is decoded and verified
on the consumer thread as it arrives, so authentic commands and refusals wait in separate queues.
At most ``inbox_max`` refusals wait for ``poll()`` to ack them (so one step boundary acks at most
that many); refusals past it are dropped and counted (``dropped``). Authentic commands have their
own queue of ``inbox_max`` (only the controller's key makes them, so it never fills in practice). Refusal log lines are limited
to the first ``log_first`` and then one summary line per ``log_interval_s``; every refusal is still
acked through ``on_reject``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cliffguard.core.enums import AckStatus
from cliffguard.core.events import Command, SchemaError, decode_command
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.signing import CommandVerifier, Rejection
from cliffguard.core.topic_watch import TopicIdWatch

log = logging.getLogger(__name__)

RejectCallback = Callable[[str, str, AckStatus, str], None]
MAX_COMMAND_BYTES = 64 * 1024

_STATUS = {
    Rejection.BAD_SIGNATURE: AckStatus.REJECTED,
    Rejection.OTHER_RUN: AckStatus.REJECTED,
    Rejection.EXPIRED: AckStatus.EXPIRED,
    Rejection.REPLAYED: AckStatus.DUPLICATE,
}


class LogLimiter:
    """Lets the first ``first`` lines through, then one summary of the suppressed per ``interval_s``."""

    def __init__(self, what: str, *, first: int = 20, interval_s: float = 60.0) -> None:
        self.what = what
        self.first = first
        self.interval_s = interval_s
        self.lines = 0
        self.suppressed = 0  # since the last summary
        self._last_summary = time.monotonic()

    def warning(self, msg: str, *args: Any) -> None:
        if self.lines < self.first:
            self.lines += 1
            log.warning(msg, *args)
            if self.lines == self.first:
                log.warning("%s: further lines suppressed; one summary every %.0fs", self.what, self.interval_s)
            return
        self.suppressed += 1
        self.flush()

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.suppressed and (force or now - self._last_summary >= self.interval_s):
            log.warning("%s: %d more in the last %.0fs", self.what, self.suppressed, now - self._last_summary)
            self.suppressed = 0
            self._last_summary = now


def _best_effort_ids(raw: bytes | None) -> tuple[str, str]:
    """The id and type of an undecodable command, when they can still be read, for its ack."""
    try:
        obj = json.loads(raw or b"")
        cid, ctype = obj.get("id", ""), obj.get("type", "")
        return (cid if isinstance(cid, str) else "")[:64], (ctype if isinstance(ctype, str) else "")[:32]
    except Exception:  # noqa: BLE001 - it is undecodable; that is the point
        return "", ""


class CommandListener:
    def __init__(
        self,
        kafka: KafkaConfig,
        run: str,
        verifier: CommandVerifier,
        on_reject: RejectCallback,
        *,
        poll_interval_s: float = 0.1,
        consumer_factory: Callable[[], Any] | None = None,
        inbox_max: int = 256,
        log_first: int = 20,
        log_interval_s: float = 60.0,
        urgent: Callable[[Command], bool] | None = None,
    ) -> None:
        if inbox_max < 1:
            raise ValueError("inbox_max: must be >= 1")
        self.kafka = kafka
        self.run = run
        self.topic = kafka.commands_topic
        self.verifier = verifier
        self.on_reject = on_reject
        self.urgent = urgent
        """Sees every verified command on the consumer thread first; True = handled there (a
        restart while the training thread is stalled, agent/hang/part.py), not queued for poll."""
        self.poll_interval_s = poll_interval_s
        self._key = run.encode()
        self._consumer_factory = consumer_factory or self._default_consumer
        self._consumer: Any = None
        self.inbox_max = inbox_max
        self._accepted: deque[Command] = deque()  # verified, in arrival order
        # (cmd id, cmd type, status, detail, log line) per refused record, acked by poll()
        self._refused: deque[tuple[str, str, AckStatus, str, str]] = deque()
        self._refusals = LogLimiter("command listener: refused commands", first=log_first, interval_s=log_interval_s)
        self.dropped = 0  # refusals (or, never in practice, authentic commands) past inbox_max
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._topic_watch = TopicIdWatch(self.topic)
        self.errors = 0
        self.recreations = 0
        self.received = 0
        self.last_error = ""

    def _default_consumer(self) -> Any:
        from kafka import KafkaConsumer

        from cliffguard.agent.kafka_client import keep_kafka_off_global_random

        keep_kafka_off_global_random()
        return KafkaConsumer(
            **self.kafka.client_kwargs(),
            client_id=f"cliffguard-listener-{self.run}",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=int(self.poll_interval_s * 1000),
            metadata_max_age_ms=5_000,
            bootstrap_timeout_ms=5_000,
            reconnect_backoff_max_ms=1_000,
        )

    def start(self, timeout: float = 10.0) -> CommandListener:
        """Start the thread; returns once positioned at the end of the topic (or after ``timeout``;
        0 = at once, see ``wait_ready``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cliffguard-commands", daemon=True)
            self._thread.start()
            if timeout > 0:
                self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s to be positioned at the end of the topic; False (logged) if not."""
        if self._ready.wait(timeout):
            return True
        log.warning("command listener not positioned within %.1fs; it keeps trying", timeout)
        return False

    def _assign(self) -> bool:
        from kafka import TopicPartition

        from cliffguard.agent.kafka_client import ensure_topic

        if self._consumer is None:
            self._consumer = self._consumer_factory()
        parts = self._consumer.partitions_for_topic(self.topic)
        if not parts:
            ensure_topic(self.kafka, self.topic)
            self._consumer.poll(0)  # refresh metadata
            parts = self._consumer.partitions_for_topic(self.topic)
            if not parts:
                return False
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        if not self._ready.is_set():
            self._consumer.seek_to_end(*tps)
            for tp in tps:
                self._consumer.position(tp)  # resolve now, so "the end" is the end at start()
        return True

    def _run(self) -> None:
        backoff = 0.2
        assigned = False
        while not self._stop.is_set():
            try:
                if not assigned:
                    assigned = self._assign()
                    if not assigned:
                        self._stop.wait(backoff)
                        continue
                    self._ready.set()
                batch = self._consumer.poll(timeout_ms=int(self.poll_interval_s * 1000))
                if self._topic_watch.changed(self._consumer):
                    # Everything in a recreated topic is new to us, and our positions belong to
                    # the old one: read it again from the start (replays are refused by id).
                    log.warning("command listener: %s was recreated; reading it from the beginning", self.topic)
                    self.recreations += 1
                    self._assign()
                    self._consumer.seek_to_beginning(*self._consumer.assignment())
                    batch = {}
                for tp, records in batch.items():
                    for rec in records:
                        if rec.key != self._key:
                            continue
                        self._enqueue(rec.value, f"{tp.topic}[{tp.partition}]@{rec.offset}")
                backoff = 0.2
            except Exception as exc:  # noqa: BLE001 - logged and retried, never raised into training
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("command listener: %s; retrying in %.1fs", self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                if self._consumer is not None and self._ready.is_set():
                    continue
                assigned = False
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # noqa: BLE001
                pass

    def _enqueue(self, raw: bytes | None, where: str) -> None:
        """Called by the consumer thread for each record keyed by this run: decoded and verified
        here, so the training thread only applies what is authentic."""
        self.received += 1
        try:
            cmd = decode_command(raw if raw is not None else b"", max_bytes=MAX_COMMAND_BYTES)
        except SchemaError as exc:
            cid, ctype = _best_effort_ids(raw)
            self._queue(self._refused, (cid, ctype, AckStatus.REJECTED, f"undecodable: {exc}",
                                        f"command at {where} refused: undecodable: {exc}"))
            return
        result = self.verifier.verify(cmd)
        if result.ok:
            if self.urgent is not None and self._handled_here(cmd):
                return
            self._queue(self._accepted, cmd)
            return
        assert result.reason is not None
        self._queue(self._refused, (cmd.id, str(cmd.type), _STATUS[result.reason],
                                    f"{result.reason}: {result.detail}",
                                    f"command {cmd.id} ({cmd.type}) refused: {result.reason}: {result.detail}"))

    def _handled_here(self, cmd: Command) -> bool:
        assert self.urgent is not None
        try:
            return bool(self.urgent(cmd))
        except Exception:  # noqa: BLE001 - the command then waits for the boundary like any other
            self.errors += 1
            log.exception("urgent handler failed for command %s", cmd.id)
            return False

    def _queue(self, queue: deque[Any], item: Any) -> None:
        if len(queue) >= self.inbox_max:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.warning("command listener: inbox full (%d waiting); dropped %d records so far",
                            self.inbox_max, self.dropped)
            return
        queue.append(item)

    def poll(self) -> list[Command]:
        """Commands to apply now, in arrival order. Non-blocking; refusals go to ``on_reject``."""
        accepted: list[Command] = []
        while self._accepted:
            accepted.append(self._accepted.popleft())
        while self._refused:
            cid, ctype, status, detail, line = self._refused.popleft()
            self._refusals.warning("%s", line)
            self._reject(cid, ctype, status, detail)
        self._refusals.flush()
        return accepted

    def _reject(self, cmd_id: str, cmd_type: str, status: AckStatus, detail: str) -> None:
        try:
            self.on_reject(cmd_id, cmd_type, status, detail)
        except Exception:  # noqa: BLE001 - a failing callback must not stop the other commands
            self.errors += 1
            log.exception("on_reject callback failed for command %s", cmd_id)

    def close(self, timeout: float = 5.0) -> None:
        self._refusals.flush(force=True)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

