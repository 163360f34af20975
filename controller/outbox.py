"""The command outbox publisher: pending ``kind="command"`` outbox rows -> ``<prefix>.commands``.

Rows are written in the same transaction as the state that decided them (``controller.batch``,
``controller.operator``) and sent only after that commit, in creation order, keyed by run id (so
a run's commands stay in order on one partition). A row is marked ``delivered`` only once the
broker acknowledged it; a crash between send and mark sends it again, which is harmless: the
trainer's verifier refuses a command id it has seen (acked ``duplicate``). Failed sends back off
(``retry_s`` doubling, at most 60 s) and are retried until the command expires (then ``failed``).

Several controller instances may run publishers on one store; a row sent twice is, again,
harmless. The database transaction is never held open while talking to Kafka.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import Engine, func, select, update

from controller.store.db import session_scope
from controller.store.models import CommandRow, OutboxRow
from core.kafka_config import KafkaConfig

log = logging.getLogger(__name__)


class CommandOutbox:
    def __init__(self, engine: Engine, kafka: KafkaConfig, *, batch: int = 200, interval_s: float = 0.5,
                 retry_s: float = 2.0, producer: Any = None) -> None:
        self.engine = engine
        self.kafka = kafka
        self.batch = batch
        self.interval_s = interval_s
        self.retry_s = retry_s
        self._producer = producer
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.errors = 0

    def _get_producer(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer

            # One request in flight: a retried send can never overtake the next command of a run.
            # max_block_ms: a pass may run on the consumer thread; with the broker down, send()
            # must give up quickly (the row stays pending) rather than stall the consumer.
            self._producer = KafkaProducer(**self.kafka.client_kwargs(), client_id="cliffguard-outbox", acks="all",
                                           linger_ms=0, retries=3, max_in_flight_requests_per_connection=1,
                                           max_block_ms=5_000)
        return self._producer

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
        producer = self._get_producer()
        futures = []
        for row in rows:
            try:
                fut = producer.send(row.target, key=(row.key or "").encode(), value=bytes(row.payload))
            except Exception as exc:  # noqa: BLE001 - record it on the row and retry later
                fut = exc
            futures.append(fut)
        try:
            producer.flush(timeout=self.kafka.request_timeout_ms / 1000)
        except Exception as exc:  # noqa: BLE001
            log.warning("outbox flush failed: %s", exc)
        delivered = 0
        done = time.time()
        with session_scope(self.engine) as s:
            for row, fut in zip(rows, futures, strict=True):
                ok = not isinstance(fut, Exception) and fut.is_done and fut.succeeded()
                if ok:
                    delivered += 1
                    s.execute(update(OutboxRow).where(OutboxRow.id == row.id)
                              .values(status="delivered", delivered_at=done, attempts=row.attempts + 1))
                    s.execute(update(CommandRow).where(CommandRow.id == row.id[4:], CommandRow.status == "pending")
                              .values(status="sent"))
                    continue
                err = fut if isinstance(fut, Exception) else (fut.exception if fut.is_done else "not confirmed")
                self.errors += 1
                expired = done >= row.expires_at
                wait = min(60.0, self.retry_s * 2 ** row.attempts)
                log.warning("command %s not sent (attempt %d): %s%s", row.id, row.attempts + 1, err,
                            "; expired, giving up" if expired else "")
                s.execute(update(OutboxRow).where(OutboxRow.id == row.id)
                          .values(status="failed" if expired else "pending", attempts=row.attempts + 1,
                                  next_attempt_at=done + wait, last_error=str(err)[:500]))
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
        if self._producer is not None:
            try:
                self.publish_due()  # whatever the last batch committed goes out before we stop
            except Exception:  # noqa: BLE001
                log.exception("final outbox pass failed")
            try:
                self._producer.close(timeout=timeout)
            except Exception:  # noqa: BLE001
                log.exception("closing the outbox producer")

