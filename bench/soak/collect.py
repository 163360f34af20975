"""What the soak reads back at the end of a seed (I/O): the store's facts about the run as plain
values, the trainer's record, the logs; and the store poller sampling the newest stored step."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import (
    CommandRow,
    DataFlagRow,
    GradHistRow,
    IncidentRow,
    OutboxRow,
    RankArrayRow,
    RunRow,
    StepMetricRow,
    ValidationRow,
)

ID_TABLES = {
    "grad_hist": GradHistRow,
    "ranks": RankArrayRow,
    "validation": ValidationRow,
    "data.flag": DataFlagRow,
}


def _first_report_ts(evidence: Any) -> float | None:
    """A hang incident's first rank report, on the trainer's clock (the hang rule's evidence)."""
    at = evidence.get("first_report_ts") if isinstance(evidence, dict) else None
    return float(at) if isinstance(at, (int, float)) else None


def store_facts(engine: Engine, run: str) -> dict[str, Any]:
    """Step rows, the event ids of the other per-event tables, incidents, commands, their outbox
    rows and the run row (see invariants.Observed)."""
    with session_scope(engine) as s:
        steps = [
            {"event_id": e, "step": st, "rank": rk, "resolution": res}
            for e, st, rk, res in s.execute(
                select(
                    StepMetricRow.event_id, StepMetricRow.step, StepMetricRow.rank, StepMetricRow.resolution
                ).where(StepMetricRow.run_id == run)
            )
        ]
        ids = {
            kind: {e for (e,) in s.execute(select(t.event_id).where(t.run_id == run))}
            for kind, t in ID_TABLES.items()
        }
        ids["step"] = {r["event_id"] for r in steps}
        incidents = [
            {
                "id": i.id,
                "rule": i.rule,
                "level": i.level,
                "spike_step": i.spike_step,
                "onset_step": i.onset_step,
                "outcome": i.outcome,
                "rollback_to": i.rollback_to,
                "lr_scale": i.lr_scale,
                "opened_at": i.opened_at,
                "closed_at": i.closed_at,
                "first_report_ts": _first_report_ts(i.evidence),
            }
            for i in s.scalars(select(IncidentRow).where(IncidentRow.run_id == run))
        ]
        commands = [
            {
                "id": c.id,
                "incident_id": c.incident_id,
                "type": c.type,
                "attempt": c.attempt,
                "status": c.status,
                "issued_at": c.issued_at,
                "expires_at": c.expires_at,
                "source": c.source,
                "ack_detail": c.ack_detail,
            }
            for c in s.scalars(select(CommandRow).where(CommandRow.run_id == run))
        ]
        outbox = {
            o.id[4:]: {
                "status": o.status,
                "created_at": o.created_at,
                "delivered_at": o.delivered_at,
                "attempts": o.attempts,
                "last_error": o.last_error,
            }
            for o in s.scalars(select(OutboxRow).where(OutboxRow.kind == "command", OutboxRow.key == run))
        }
        r = s.get(RunRow, run)
        row = (
            None
            if r is None
            else {
                "status": r.status,
                "last_step": r.last_step,
                "lr_scale": r.lr_scale,
                "lr_scale_applied": r.lr_scale_applied,
                "recovery_state": r.recovery_state,
                "downsampled_below": r.downsampled_below,
            }
        )
    return {
        "steps": steps,
        "ids": ids,
        "incidents": incidents,
        "commands": commands,
        "outbox": outbox,
        "run": row,
    }


class Settle:
    """After training: has the store everything (the run stored as ended, no incident open, the
    rank-0 rows at ``expected_rows``), or has it stopped changing for ``quiet_s`` (what is missing
    then is not coming)?"""

    def __init__(self, engine: Engine, run: str, expected_rows: int, quiet_s: float = 20.0) -> None:
        self.engine, self.run, self.expected_rows, self.quiet_s = engine, run, expected_rows, quiet_s
        self.complete = False
        self._last: tuple[Any, ...] | None = None
        self._since = time.monotonic()

    def __call__(self) -> bool:
        try:
            with session_scope(self.engine) as s:
                r = s.get(RunRow, self.run)
                open_incidents = s.scalar(
                    select(func.count())
                    .select_from(IncidentRow)
                    .where(IncidentRow.run_id == self.run, IncidentRow.outcome == "open")
                )
                rows = (
                    s.scalar(
                        select(func.count())
                        .select_from(StepMetricRow)
                        .where(StepMetricRow.run_id == self.run, StepMetricRow.rank == 0)
                    )
                    or 0
                )
                status = None if r is None else (r.status, r.recovery_state, r.last_step)
        except Exception:  # noqa: BLE001 - a busy store: ask again
            return False
        self.complete = (
            status is not None
            and status[0] != "running"
            and not open_incidents
            and rows >= self.expected_rows
        )
        now = (status, open_incidents, rows)
        if now != self._last:
            self._last, self._since = now, time.monotonic()
        return self.complete or time.monotonic() - self._since >= self.quiet_s


def read_record(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"kind": "unreadable", "text": line[:200]})
    return out


class StorePoller:
    """Samples (time, ts of the newest rank-0 step row) every ``every_s`` on a thread; a poll the
    store refuses (locked) is skipped, not retried."""

    def __init__(self, engine: Engine, run: str, every_s: float = 1.0) -> None:
        self.engine, self.run, self.every_s = engine, run, every_s
        self.polls: list[tuple[float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-store-poller", daemon=True)

    def start(self) -> StorePoller:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                with session_scope(self.engine) as s:
                    newest = s.scalar(
                        select(func.max(StepMetricRow.ts)).where(
                            StepMetricRow.run_id == self.run, StepMetricRow.rank == 0
                        )
                    )
            except Exception:  # noqa: BLE001 - a locked store is one of the faults
                continue
            self.polls.append((time.time(), newest))

    def stop(self) -> list[tuple[float, float | None]]:
        self._stop.set()
        self._thread.join(10)
        return list(self.polls)
