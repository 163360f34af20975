"""Counts of messages the consumer edge sent to the dead-letter topic, per (topic, reason).

The messages themselves live on ``<prefix>.dlq`` (original bytes, reason, where they came from);
the store keeps the counters and the newest detail so the dashboard and ``cliffguard status``
can show that input is being rejected, and why.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from cliffguard.controller.store.models import DlqCountRow
from cliffguard.controller.store.upsert import insert_for

MAX_DETAIL_CHARS = 2000


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
