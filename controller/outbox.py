"""The command outbox publisher: pending ``kind="command"`` outbox rows -> ``<prefix>.commands``.

Rows are written in the same transaction as the state that decided them (``controller.batch``,
``controller.operator``) and sent only after that commit, in creation order, keyed by run id (so
a run's commands stay in order on one partition). A row is marked ``delivered`` only once the
broker acknowledged it; a crash between send and mark sends it again, which is harmless: the
trainer's verifier refuses a command id it has seen (acked ``duplicate``). Failed sends back off
(``retry_s`` doubling, at most 60 s) and are retried until the command expires (then ``failed``).
A command already expired when its turn comes is never sent (the trainer would refuse it, or
worse, act late on a pause nobody waits for): it is marked ``failed`` with "expired before it
could be sent", and logged.

The producer recovers from a broker that forgot it (``core/kafka_producers.py``): a send the
broker did not acknowledge drops the producer, and the next pass builds a new one. Without that,
kafka-python's idempotent producer stays fatal after a broker restart and no command would ever
leave again.

Several controller instances may run publishers on one store; a row sent twice is, again,
harmless. The database transaction is never held open while talking to Kafka.

Early send (the verdict's latency path): ``send_early(session, cmd_id)``, called by the batch the
moment a rule's verdict queues a command (``BatchProcessor.on_command``), hands the row's bytes to
the producer before the batch's store writes and commit, unless an older command of the run is
still pending (a run's commands stay in order) or the run's recovery state was never stored. The row is still written and committed with the
batch; the next ``publish_due`` finds its send in flight and records that send's outcome instead
of sending it again (a failed early send is retried as any failed send). If the batch rolls back
or the controller dies before the commit, the redo decides again from the stored state and so
queues the same command id (ids derive from the stored salt and sequence), which the trainer's
verifier refuses as a duplicate; an early send no committed row claims is
forgotten after ``EARLY_KEEP_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kafka.errors import KafkaError
from sqlalchemy import Engine, func, select, update

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import CommandRow, OutboxRow, RunRow
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.kafka_producers import RecoveringProducer

log = logging.getLogger(__name__)

EARLY_KEEP_S = 600.0
"""How long an early send waits for its row to be committed before it is forgotten."""


class CommandOutbox:
    def __init__(self, engine: Engine, kafka: KafkaConfig, *, batch: int = 200, interval_s: float = 0.5,
                 retry_s: float = 2.0, producer: Any = None) -> None:
        self.engine = engine
        self.kafka = kafka
        self.batch = batch
        self.interval_s = interval_s
        self.retry_s = retry_s
        if producer is None:
            self._producer = RecoveringProducer(kafka, self._build, name="command outbox")
        else:  # a test's producer: always "reachable", handed back after a failure
            self._producer = RecoveringProducer(kafka, lambda: producer, name="command outbox", probe=lambda _k: True)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.errors = 0
        self.early = 0
        self.expired = 0
        """Commands failed because they expired before they could be sent."""
        self._early: dict[str, tuple[Any, float, Any]] = {}  # outbox row id -> (send future, when, producer)
        self._early_lock = threading.Lock()

    def _build(self) -> Any:
        from kafka import KafkaProducer

        # One request in flight: a retried send can never overtake the next command of a run.
        # max_block_ms / bootstrap_timeout_ms: a pass may run on the consumer thread; with the
        # broker down, send() must give up quickly (the row stays pending), not stall the consumer.
        return KafkaProducer(**self.kafka.client_kwargs(), client_id="cliffguard-outbox", acks="all",
                             linger_ms=0, retries=3, max_in_flight_requests_per_connection=1,
                             max_block_ms=5_000, bootstrap_timeout_ms=5_000)

    def send_early(self, session: Any, cmd_id: str) -> bool:
        """Send the command ``cmd_id`` queued in ``session`` (not yet committed) now; False when it
        must wait for ``publish_due`` (an older command of its run is still pending, or the send
        could not start). Never raises: the committed row is the delivery guarantee."""
        try:
            row = session.get(OutboxRow, f"cmd_{cmd_id}")
            if row is None or row.status != "pending":
                return False
            run = session.get(RunRow, row.key)
            if run is None or not run.controller_state:
                # The run's recovery state (the salt its command ids derive from) is not stored
                # yet: a crash before this commit would re-decide under another id, and the
                # trainer would hold a command the store never knew. After the commit, then.
                return False
            older = session.scalar(select(func.count()).select_from(OutboxRow).where(
                OutboxRow.kind == "command", OutboxRow.status == "pending", OutboxRow.key == row.key,
                OutboxRow.id != row.id))
            if older:
                return False
            producer = self._producer.get()
            fut = producer.send(row.target, key=(row.key or "").encode(), value=bytes(row.payload))
        except Exception as exc:  # noqa: BLE001 - publish_due sends it after the commit
            # a broker that is down is expected here (one line); anything else keeps its traceback
            expected = isinstance(exc, (KafkaError, ConnectionError, TimeoutError))
            log.warning("early send of command %s failed; sent after the commit: %s: %s", cmd_id,
                        type(exc).__name__, exc, exc_info=not expected)
            return False
        now = time.time()
        with self._early_lock:
            self._early = {k: v for k, v in self._early.items() if now - v[1] < EARLY_KEEP_S}
            self._early[row.id] = (fut, now, producer)
        self.early += 1
        return True

    def publish_due(self, now: float | None = None) -> int:
        """One pass: send what is due, mark what the broker confirmed. Returns rows delivered.

        Callable from any thread (the consumer loop calls it right after a commit that queued
        commands, which saves a thread hand-off on the verdict's path); passes never overlap."""
        with self._lock:
            return self._publish_due(time.time() if now is None else now)

    def _publish_due(self, now: float) -> int:
        with session_scope(self.engine) as s:
            rows = s.execute(
                select(OutboxRow.id, OutboxRow.target, OutboxRow.key, OutboxRow.payload, OutboxRow.attempts,
                       CommandRow.expires_at)
                .join(CommandRow, CommandRow.id == func.substr(OutboxRow.id, 5))  # id = 'cmd_' + command id
                .where(OutboxRow.kind == "command", OutboxRow.status == "pending", OutboxRow.next_attempt_at <= now)
                .order_by(OutboxRow.created_at, OutboxRow.id)
                .limit(self.batch)
            ).all()
        if not rows:
            return 0
        clock = time.time()
        expired = [row for row in rows if row.expires_at <= clock and row.id not in self._early]
        if expired:
            self._expire(expired, clock)
            rows = [row for row in rows if row not in expired]
            if not rows:
                return 0
        try:
            producer = self._producer.get()
        except Exception as exc:  # noqa: BLE001 - no broker now: the rows wait, with the reason
            sends: list[tuple[Any, Any]] = [(exc, None)] * len(rows)
        else:
            sends = [self._send_row(producer, row) for row in rows]
            try:
                producer.flush(timeout=self.kafka.request_timeout_ms / 1000)
            except Exception as exc:  # noqa: BLE001
                log.warning("outbox flush failed: %s", exc)
        return self._record(rows, sends)

    def _send_row(self, producer: Any, row: Any) -> tuple[Any, Any]:
        """(the send's future or the exception it raised, the producer it went through)."""
        with self._early_lock:
            early = self._early.pop(row.id, None)
        if early is not None:  # on its way since the verdict: its outcome is this row's
            return early[0], early[2]
        try:
            return producer.send(row.target, key=(row.key or "").encode(), value=bytes(row.payload)), producer
        except Exception as exc:  # noqa: BLE001 - record it on the row and retry later
            return exc, producer

    def _expire(self, rows: list[Any], now: float) -> None:
        """Rows whose command expired before it could be sent: failed, never sent."""
        with session_scope(self.engine) as s:
            for row in rows:
                log.warning("command %s expired before it could be sent (%d attempts); not sending it",
                            row.id[4:], row.attempts)
                s.execute(update(OutboxRow).where(OutboxRow.id == row.id, OutboxRow.status == "pending")
                          .values(status="failed", last_error="expired before it could be sent"))
                s.execute(update(CommandRow).where(CommandRow.id == row.id[4:], CommandRow.status == "pending")
                          .values(status="failed", ack_detail="expired before it could be sent"))
        self.expired += len(rows)

    def _record(self, rows: list[Any], sends: list[tuple[Any, Any]]) -> int:
        """Mark what the broker confirmed; back off the rest. A send the broker did not
        acknowledge drops the producer it went through: the next pass builds a new one."""
        delivered = 0
        done = time.time()
        unacked: dict[int, tuple[Any, object]] = {}  # id(producer) -> (producer, first error)
        with session_scope(self.engine) as s:
            for row, (fut, producer) in zip(rows, sends, strict=True):
                ok = not isinstance(fut, Exception) and fut.is_done and fut.succeeded()
                if ok:
                    delivered += 1
                    s.execute(update(OutboxRow).where(OutboxRow.id == row.id)
                              .values(status="delivered", delivered_at=done, attempts=row.attempts + 1))
                    s.execute(update(CommandRow).where(CommandRow.id == row.id[4:], CommandRow.status == "pending")
                              .values(status="sent"))
                    continue
                err = fut if isinstance(fut, Exception) else (fut.exception if fut.is_done else "not confirmed")
                if producer is not None:
                    unacked.setdefault(id(producer), (producer, err))
                self.errors += 1
                expired = done >= row.expires_at
                wait = min(60.0, self.retry_s * 2 ** row.attempts)
                log.warning("command %s not sent (attempt %d): %s%s", row.id, row.attempts + 1, err,
                            "; expired, giving up" if expired else "")
                s.execute(update(OutboxRow).where(OutboxRow.id == row.id)
                          .values(status="failed" if expired else "pending", attempts=row.attempts + 1,
                                  next_attempt_at=done + wait, last_error=str(err)[:500]))
        for producer, err in unacked.values():
            self._producer.failed(producer, err)
        self.sent += delivered
        return delivered

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> CommandOutbox:
        self._thread = threading.Thread(target=self._loop, name="cliffguard-outbox", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                while self.publish_due() >= self.batch:
                    pass
            except Exception:  # noqa: BLE001 - log and keep going: the rows are still pending
                log.exception("command outbox pass failed")

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._producer.current is not None:
            try:
                self.publish_due()  # whatever the last batch committed goes out before we stop
            except Exception:  # noqa: BLE001
                log.exception("final outbox pass failed")
        self._producer.close(timeout=timeout)

