"""The stored rank -> node map of each run (``rank_nodes``; the edge's side is controller/rank_nodes.py).

- ``save_rank_nodes``: a run's whole mapping, replacing what the store had (the batch writes only
  the runs whose mapping changed);
- ``load_rank_nodes``: the newest ``runs`` runs' mappings, for the controller's start.

Each rank is ``Placed``: its node and life, and its device slot on that node and the node's rank
count when a beat said them (None otherwise), so a device-level eviction right after a controller
restart still leaves one device out rather than its node.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import RankNodeRow

Placed = tuple[str, int | None, int | None, int | None]
"""(node, life, device slot, ranks on the node)."""


def save_rank_nodes(session: Session, run_id: str, ranks: dict[int, Placed], now: float) -> None:
    session.execute(delete(RankNodeRow).where(RankNodeRow.run_id == run_id))
    if ranks:
        session.add_all(RankNodeRow(run_id=run_id, rank=rank, node=node[:128], life=life, slot=slot,
                                    node_ranks=node_ranks, updated_at=now)
                        for rank, (node, life, slot, node_ranks) in sorted(ranks.items()))


def load_rank_nodes(session: Session, runs: int) -> dict[str, dict[int, Placed]]:
    """run -> rank -> (node, life, slot, node_ranks) for the ``runs`` runs written last, oldest first
    (the order in which ``RankNodes`` forgets them)."""
    if runs <= 0:
        return {}
    at = func.max(RankNodeRow.updated_at)
    newest = session.execute(select(RankNodeRow.run_id, at).group_by(RankNodeRow.run_id)
                             .order_by(at.desc(), RankNodeRow.run_id.desc()).limit(runs)).all()
    keep = [r for r, _ in reversed(newest)]
    out: dict[str, dict[int, Placed]] = {r: {} for r in keep}
    if not keep:
        return out
    rows = session.execute(select(RankNodeRow.run_id, RankNodeRow.rank, RankNodeRow.node, RankNodeRow.life,
                                  RankNodeRow.slot, RankNodeRow.node_ranks).where(RankNodeRow.run_id.in_(keep)))
    for run_id, rank, node, life, slot, node_ranks in rows:
        out[run_id][rank] = (node, life, slot, node_ranks)
    return out
