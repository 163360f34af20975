"""Counts of messages the consumer edge sent to the dead-letter topic, per (topic, reason) and
per (run, reason).

The messages themselves live on ``<prefix>.dlq`` (original bytes, reason, where they came from);
the store keeps the counters and the newest detail so the dashboard and ``cliffguard status``
can show that input is being rejected, and why, and whose: a run whose every event is refused
(a trainer that cannot sign) has no ``runs`` row, only its dead letters. The run is the message's
Kafka key, which is the run id by the contract (a message without a key counts for no run).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from sqlalchemy.orm import Session

from cliffguard.controller.store.models import DlqCountRow, DlqRunRow
from cliffguard.controller.store.upsert import insert_for

MAX_DETAIL_CHARS = 2000
RUN_ID_CHARS = 128


class Letter(Protocol):
    """What is counted of a dead letter (``controller.edge.DeadLetter``)."""

    topic: str
    reason: str
    detail: str
    key: bytes | None


def run_of(key: bytes | None) -> str | None:
    """The run a message belongs to: its Kafka key as text (None without one)."""
    if not key:
        return None
    return key.decode("utf-8", "replace")[:RUN_ID_CHARS]


def count_dead_letters(session: Session, letters: Iterable[Letter], now: float) -> None:
    """One batch's dead letters: one counter update per (topic, reason) and per (run, reason),
    each with the newest detail."""
    by_topic: dict[tuple[str, str], list[Letter]] = {}
    by_run: dict[tuple[str, str], list[Letter]] = {}
    for d in letters:
        by_topic.setdefault((d.topic, d.reason), []).append(d)
        run = run_of(d.key)
        if run is not None:
            by_run.setdefault((run, d.reason), []).append(d)
    for (topic, reason), group in by_topic.items():
        count_dead_letter(session, topic, reason, group[-1].detail, n=len(group), now=now)
    for (run, reason), group in by_run.items():
        count_run_dead_letter(session, run, reason, group[-1].detail, n=len(group), now=now)


def count_run_dead_letter(
    session: Session, run: str, reason: str, detail: str, *, n: int = 1, now: float | None = None
) -> None:
    """Add ``n`` to the (run, reason) counter, keeping its first time and the newest detail."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    ts = time.time() if now is None else now
    ins = insert_for(session, DlqRunRow).values(
        run_id=run[:RUN_ID_CHARS], reason=reason[:64], count=n, first_ts=ts, last_ts=ts,
        last_detail=detail[:MAX_DETAIL_CHARS],
    )
    session.execute(
        ins.on_conflict_do_update(
            index_elements=["run_id", "reason"],
            set_={
                "count": DlqRunRow.count + ins.excluded.count,
                "last_ts": ins.excluded.last_ts,
                "last_detail": ins.excluded.last_detail,
            },
        )
    )


def count_dead_letter(
    session: Session, topic: str, reason: str, detail: str, *, n: int = 1, now: float | None = None
) -> None:
    """Add ``n`` to the (topic, reason) counter and remember the newest detail, in the caller's
    transaction (the same one as the offsets that skip past the bad messages)."""
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    ts = time.time() if now is None else now
    ins = insert_for(session, DlqCountRow).values(
        topic=topic, reason=reason[:64], count=n, last_ts=ts, last_detail=detail[:MAX_DETAIL_CHARS]
    )
    session.execute(
        ins.on_conflict_do_update(
            index_elements=["topic", "reason"],
            set_={
                "count": DlqCountRow.count + ins.excluded.count,
                "last_ts": ins.excluded.last_ts,
                "last_detail": ins.excluded.last_detail,
            },
        )
    )
