"""The goodput ledgers at the controller's batch: each run's ledger rides on its slot, is fed
every event before the recovery machine sees it (so the time before an event is charged to the
incident open before it), is saved in the batch's transaction, and turns the ETTR alert's
crossings into alerts.

A ledger is saved with its run's state (``runs.controller_state``) and rebuilt from it on the
slot's first event (``store/goodput.py``): a run whose partition moved continues its ledger
exactly where the last committed batch left it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from cliffguard.controller.alerts import AlertsConfig, AlertSpec, enqueue_alert
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.record import LedgerAlert
from cliffguard.controller.store.goodput import load_ledger, save_ledgers
from cliffguard.core.enums import AlertLevel
from cliffguard.core.events import Event

log = logging.getLogger(__name__)

RULE = "ettr_floor"


class GoodputBook:
    def __init__(self, config: GoodputConfig, alerts: AlertsConfig) -> None:
        self.config = config
        self.alerts = alerts

    def ledger(self, session: Session, slot: Any) -> Ledger:
        if slot.ledger is None:
            slot.ledger = load_ledger(session, slot.run_id, slot.ledger_state, self.config)
            slot.ledger_state = None
        return slot.ledger

    def on_event(self, session: Session, slot: Any, event: Event, now: float) -> int:
        """Book ``event`` on its run's ledger; returns how many alerts it queued. A ledger that
        raises is logged and skipped for this event: the batch (the recovery) goes on."""
        incident = slot.recovery.incident
        try:
            crossed = self.ledger(session, slot).on_event(event, incident.id if incident is not None else None)
        except Exception:  # noqa: BLE001 - booking must never stop recovery
            log.exception("goodput ledger failed on %s event of run %s step %d", event.type, event.run, event.step)
            return 0
        for alert in crossed:
            enqueue_alert(session, self._spec(slot.run_id, alert), self.alerts, now)
        return len(crossed)

    def save(self, session: Session, slots: Iterable[Any], now: float) -> None:
        save_ledgers(session, [(s.run_id, s.ledger) for s in slots if s.ledger is not None], now,
                     self.config.row_every_s)

    def _spec(self, run_id: str, alert: LedgerAlert) -> AlertSpec:
        window = f"{alert.window_s / 60:.0f} min" if alert.window_s >= 120 else f"{alert.window_s:.0f} s"
        low = alert.kind == "low"
        title = (f"ETTR {alert.ettr:.0%} over the last {window}, below the floor of {alert.floor:.0%}" if low
                 else f"ETTR back to {alert.ettr:.0%} over the last {window} (floor {alert.floor:.0%})")
        body = ("less than the floor's share of the wall time trained steps that were kept: see the run's "
                "goodput breakdown (dashboard, `cliffguard report`) for where the time went" if low else "")
        return AlertSpec(rule=RULE, level=AlertLevel.WARN if low else AlertLevel.INFO, title=title, body=body,
                         run_id=run_id, evidence={"ettr": alert.ettr, "window_s": alert.window_s,
                                                  "floor": alert.floor, "kind": alert.kind})
