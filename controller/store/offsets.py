"""Consumer offsets kept in the store, in the same transaction as the state they produced.

That is what makes the controller's effect exactly-once: after a crash, the
controller seeks each partition to the offset saved with the last committed batch, so an event
is either fully applied with its offset or not at all (and then re-read). The stored value is
the *next* offset to read, Kafka's convention.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import ConsumerOffsetRow
from cliffguard.controller.store.upsert import built_once, insert_for


def load_offsets(session: Session, group: str, topic: str) -> dict[int, int]:
    """partition -> next offset to read, for the partitions this group has saved."""
    rows = session.execute(
        select(ConsumerOffsetRow.partition, ConsumerOffsetRow.offset).where(
            ConsumerOffsetRow.group_id == group, ConsumerOffsetRow.topic == topic
        )
    ).all()
    return {int(p): int(o) for p, o in rows}


def newest_offset_write(session: Session, group: str, topic: str) -> float | None:
    """When ``group`` last stored an offset of ``topic`` (any member; None: never)."""
    return session.scalar(select(func.max(ConsumerOffsetRow.updated_at)).where(
        ConsumerOffsetRow.group_id == group, ConsumerOffsetRow.topic == topic))


def save_offsets(
    session: Session, group: str, offsets: dict[tuple[str, int], int], *, now: float | None = None
) -> None:
    """Upsert (topic, partition) -> next offset for ``group`` in the caller's transaction."""
    if not offsets:
        return
    ts = time.time() if now is None else now
    rows = []
    for (topic, partition), offset in sorted(offsets.items()):
        if offset < 0:
            raise ValueError(f"offset: must be >= 0, got {offset} for {topic}[{partition}]")
        rows.append({"group_id": group, "topic": topic, "partition": partition, "offset": offset, "updated_at": ts})
    # one executemany for every partition of the batch
    session.connection().execute(built_once(session, "save_offsets", _offsets_upsert), rows)


def _offsets_upsert(session: Session) -> Any:
    ins = insert_for(session, ConsumerOffsetRow)
    return ins.on_conflict_do_update(
        index_elements=["group_id", "topic", "partition"],
        set_={"offset": ins.excluded.offset, "updated_at": ins.excluded.updated_at},
    )
