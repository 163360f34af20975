"""Send pending alert outbox rows: one pass (``deliver_due``) or a background thread.

Per endpoint the queue is FIFO: a pass walks the endpoint's pending rows oldest first and stops at
the first one that is not due or fails transiently, so a PagerDuty resolve never overtakes its
trigger and a dead receiver costs one timed-out request per pass, not one per queued alert.

Each attempt: claim the row (an UPDATE guarded by its current ``next_attempt_at``, pushing it a
lease into the future, so two controller instances never send the same row at the same time and a
crash mid-send only delays it), hand it to the endpoint's sink (sink.py; for the HTTP formats
that renders and signs it with the attempt's timestamp, the ``webhook-id`` being the row id, the
same on every retry), then record the result in its own transaction (see retry.py for what each
outcome means). A row that runs out of time becomes
``failed`` and is logged as an error; a 410 disables the endpoint (``alert_endpoints``) and parks
its pending rows as ``disabled``. Rows for an endpoint this instance's config does not name are
left for an instance that knows it, and marked ``failed`` once past the give-up horizon.

Nothing here logs a URL, header or secret: only endpoint names, row ids and error classes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from cliffguard.controller.alerts.config import AlertsConfig, EndpointConfig
from cliffguard.controller.alerts.enqueue import set_endpoint_disabled
from cliffguard.controller.alerts.retry import Outcome, UniformSource, next_attempt_at, retry_delay
from cliffguard.controller.alerts.sink import AlertSink, Delivery, SinkResult
from cliffguard.controller.alerts.sink_factory import SinkFactory, configured_sinks
from cliffguard.controller.alerts.spec import AlertMessage
from cliffguard.controller.store.models import AlertEndpointStateRow, AlertRow, OutboxRow

log = logging.getLogger(__name__)

PENDING, DELIVERED, FAILED, DISABLED = "pending", "delivered", "failed", "disabled"
LEASE_MARGIN_S = 30.0
ERROR_MAX = 500


class AlertDeliverer:
    def __init__(
        self,
        engine: Engine,
        config: AlertsConfig,
        sinks: SinkFactory | None = None,
        *,
        rng: UniformSource | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.config = config
        self._sink_for: SinkFactory = sinks or configured_sinks()
        self._sinks: dict[str, AlertSink] = {}
        self._rng: UniformSource = rng or random.Random()
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats = {"attempts": 0, "delivered": 0, "retried": 0, "failed": 0, "disabled": 0, "pass_errors": 0}

    # ---- one pass -------------------------------------------------------------------------

    def deliver_due(self, now: float) -> int:
        """Try every due row once (per-endpoint FIFO); return how many were delivered."""
        delivered = 0
        for endpoint in self.config.endpoints:
            if not endpoint.enabled:
                continue
            try:
                delivered += self._drain(endpoint, now)
            except Exception:  # noqa: BLE001 - one endpoint's trouble must not starve the others
                log.exception("alert delivery to %s failed this pass; rows stay queued", endpoint.name)
                self._stats["pass_errors"] += 1
        self._expire_unknown(now)
        return delivered

    def _drain(self, endpoint: EndpointConfig, now: float) -> int:
        with Session(self.engine) as session, session.begin():
            state = session.get(AlertEndpointStateRow, endpoint.name)
            if state is not None and state.disabled:
                self._park(session, endpoint.name)
                return 0
            rows = session.execute(
                select(OutboxRow.id, OutboxRow.next_attempt_at, OutboxRow.created_at, OutboxRow.attempts, OutboxRow.payload)
                .where(OutboxRow.kind == "alert", OutboxRow.target == endpoint.name, OutboxRow.status == PENDING)
                .order_by(OutboxRow.created_at, OutboxRow.id)
                .limit(self.config.batch_size)
            ).all()
        delivered = 0
        for row in rows:
            if row.next_attempt_at > now or not self._claim(row.id, row.next_attempt_at, now):
                break
            outcome = self._attempt(endpoint, row, now)
            if outcome == Outcome.DELIVERED:
                delivered += 1
            elif outcome != Outcome.REJECTED:
                break  # retrying or gone: the rest of this endpoint's queue waits behind it
        return delivered

    def _claim(self, row_id: str, seen_next: float, now: float) -> bool:
        lease_until = now + self.config.request_timeout_s + LEASE_MARGIN_S
        with Session(self.engine) as session, session.begin():
            result = session.execute(
                update(OutboxRow)
                .where(OutboxRow.id == row_id, OutboxRow.status == PENDING, OutboxRow.next_attempt_at == seen_next)
                .values(next_attempt_at=lease_until)
            )
            return result.rowcount == 1

    def _attempt(self, endpoint: EndpointConfig, row: Any, now: float) -> Outcome:
        with Session(self.engine) as session:
            alert = session.get(AlertRow, row.payload.decode())
            message = AlertMessage.from_row(alert) if alert is not None else None
        if message is None:
            self._finish(row, now, FAILED, error="alert row not found")
            log.error("alert outbox row %s for %s: alert row missing; marked failed", row.id, endpoint.name)
            return Outcome.REJECTED
        attempts = row.attempts + 1
        delivery = Delivery(message, row.id, now, self.config.request_timeout_s, attempts)
        self._stats["attempts"] += 1
        try:
            result = self._sink(endpoint).send(delivery)
        except Exception as exc:  # noqa: BLE001 - a broken sink must not lose the alert
            log.exception("alert delivery to %s raised; will retry", endpoint.name)
            result = SinkResult(Outcome.RETRY, f"{type(exc).__name__}: {exc}")
        outcome, error = result.outcome, result.detail or str(result.outcome)
        if outcome == Outcome.DELIVERED:
            self._finish(row, now, DELIVERED, attempts=attempts)
            self._stats["delivered"] += 1
        elif outcome == Outcome.GONE:
            self._disable(endpoint.name, row, now, attempts, error)
        elif outcome == Outcome.REJECTED:
            self._finish(row, now, FAILED, attempts=attempts, error=f"rejected: {error}")
            self._stats["failed"] += 1
            log.error("alert %s to %s rejected by the receiver (%s); marked failed", row.id, endpoint.name, error)
        else:
            self._schedule_retry(endpoint.name, row, now, attempts, error, result.retry_after_s)
        return outcome

    def _sink(self, endpoint: EndpointConfig) -> AlertSink:
        sink = self._sinks.get(endpoint.name)
        if sink is None:
            sink = self._sinks[endpoint.name] = self._sink_for(endpoint)
        return sink

    def _schedule_retry(
        self, name: str, row: Any, now: float, attempts: int, error: str, retry_after: float | None
    ) -> None:
        delay = retry_delay(
            attempts, base_s=self.config.backoff_base_s, cap_s=self.config.backoff_max_s,
            rng=self._rng, retry_after_s=retry_after,
        )
        nxt = next_attempt_at(now=now, created_at=row.created_at, delay_s=delay, give_up_after_s=self.config.give_up_after_s)
        if nxt is None:
            waited = now - row.created_at
            self._finish(row, now, FAILED, attempts=attempts, error=f"gave up after {attempts} attempts over {waited:.0f}s: {error}")
            self._stats["failed"] += 1
            log.error("alert %s to %s: gave up after %d attempts over %.0fs (last: %s)", row.id, name, attempts, waited, error)
            return
        self._finish(row, now, PENDING, attempts=attempts, error=error, next_at=nxt)
        self._stats["retried"] += 1
        log.warning("alert %s to %s failed (%s); attempt %d, retry in %.1fs", row.id, name, error, attempts, nxt - now)

    def _disable(self, name: str, row: Any, now: float, attempts: int, error: str) -> None:
        with Session(self.engine) as session, session.begin():
            set_endpoint_disabled(session, name, disabled=True, reason=f"{error} at {now:.0f}", now=now)
            self._mark(session, row.id, now, DISABLED, attempts=attempts, error=error)
            self._park(session, name)
        self._stats["disabled"] += 1
        log.error("alert endpoint %s is gone (HTTP 410); disabled (re-enable with set_endpoint_disabled)", name)

    def _park(self, session: Session, name: str) -> None:
        session.execute(
            update(OutboxRow)
            .where(OutboxRow.kind == "alert", OutboxRow.target == name, OutboxRow.status == PENDING)
            .values(status=DISABLED, last_error="endpoint disabled")
        )

    def _expire_unknown(self, now: float) -> None:
        known = [ep.name for ep in self.config.endpoints if ep.enabled]
        with Session(self.engine) as session, session.begin():
            result = session.execute(
                update(OutboxRow)
                .where(
                    OutboxRow.kind == "alert",
                    OutboxRow.status == PENDING,
                    OutboxRow.target.not_in(known),
                    OutboxRow.created_at <= now - self.config.give_up_after_s,
                )
                .values(status=FAILED, last_error="endpoint not configured (or disabled in config) here")
            )
        if result.rowcount:
            self._stats["failed"] += result.rowcount
            log.error("%d alert outbox rows for unconfigured endpoints passed the horizon; marked failed", result.rowcount)

    def _finish(
        self, row: Any, now: float, status: str, *, attempts: int | None = None,
        error: str | None = None, next_at: float | None = None,
    ) -> None:
        with Session(self.engine) as session, session.begin():
            self._mark(session, row.id, now, status, attempts=attempts, error=error, next_at=next_at)

    @staticmethod
    def _mark(
        session: Session, row_id: str, now: float, status: str, *, attempts: int | None = None,
        error: str | None = None, next_at: float | None = None,
    ) -> None:
        values: dict[str, Any] = {"status": status, "last_error": error[:ERROR_MAX] if error else None}
        if attempts is not None:
            values["attempts"] = attempts
        if status == DELIVERED:
            values["delivered_at"] = now
        if next_at is not None:
            values["next_attempt_at"] = next_at
        session.execute(update(OutboxRow).where(OutboxRow.id == row_id).values(**values))

    # ---- background form ------------------------------------------------------------------

    def start(self) -> AlertDeliverer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cliffguard-alert-deliverer", daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        """Run a pass now (e.g. right after the controller committed new alerts)."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.deliver_due(self._clock())
            except Exception:  # noqa: BLE001 - a database hiccup must not end delivery
                log.exception("alert delivery pass failed; next pass in %.1fs", self.config.poll_interval_s)
                self._stats["pass_errors"] += 1
            self._wake.wait(self.config.poll_interval_s)
            self._wake.clear()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("alert deliverer thread still busy after %.1fs (a request in flight)", timeout)
            self._thread = None

    def stats(self) -> dict[str, int]:
        return dict(self._stats)
