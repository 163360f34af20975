"""Who hung the group: every rank's evidence compared (pure).

Each live rank of a hung group reports its Flight Recorder's sequence numbers per process group
(the last collective it enqueued, started and completed) and its stacks (``hang.evidence``,
agent/hang/evidence.py). ``name_culprit`` reads them side by side:

1. a rank *waits* when it has a collective in flight (enqueued past completed), or its
   collective failed (a timeout or a peer gone: it was inside one). A rank whose process its
   node's other ranks saw gone when they reported (``gone``, agent/node_beats.py) died: it is
   the culprit — ``died``;
2. ranks that report but wait in no collective, while others wait, never entered the collective
   the others wait in: they are stuck outside any collective (a data loader, a sleep) and are the
   culprit — ``outside_collective``;
3. when every reporting rank waits, the ranks of the world that sent nothing are the culprit —
   ``no_evidence`` (dead, frozen, or their node gone: the others' collective failed or waits on
   them); with every rank reporting, a rank that waits at a lower sequence number than the others
   on the same group is behind — ``behind``;
4. otherwise no culprit is named (all ranks inside the same collective, every rank reporting:
   the network or something outside the job), and the verdict says so.

The culprit's frame is its training thread's innermost frame outside the libraries; the
collective is the one the others wait in (its op and sequence number on its group). The table
has a row per rank, for the incident and the dashboard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PG = "0"


@dataclass(frozen=True, slots=True)
class Culprit:
    ranks: tuple[int, ...]
    """Empty when none could be named."""
    kind: str
    """died | outside_collective | no_evidence | behind | none"""
    pg: str
    seq: int
    """The sequence number of the collective the others wait in (-1 when unknown)."""
    op: str
    """That collective's op (``gloo:all_reduce``) and the agent's note of it."""
    frame: str
    """Where the (first) culprit's training thread is ("" for a rank that sent nothing)."""
    nodes: tuple[str, ...]
    table: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""

    @property
    def named(self) -> bool:
        return bool(self.ranks)


def _waits(r: Mapping[str, Any]) -> bool:
    if r.get("reason") == "collective_error":
        return True
    return any(st.get("completed", -1) < st.get("enqueued", -1) for st in (r.get("pg_status") or {}).values())


def _seq(r: Mapping[str, Any], pg: str) -> int:
    return int(((r.get("pg_status") or {}).get(pg) or {}).get("enqueued", -1))


def _flight(r: Mapping[str, Any], pg: str) -> dict[str, Any] | None:
    """The newest in-flight entry of ``pg`` this rank reported."""
    entries = [e for e in r.get("in_flight") or [] if str(e.get("pg")) == pg]
    return max(entries, key=lambda e: int(e.get("seq", -1))) if entries else None


def _pick_pg(reports: Mapping[int, Mapping[str, Any]]) -> str:
    """The group the hang is on: the one whose enqueued numbers differ most, the world's on a tie."""
    pgs = sorted({pg for r in reports.values() for pg in (r.get("pg_status") or {})})
    if not pgs:
        return DEFAULT_PG

    def spread(pg: str) -> tuple[int, int]:
        seqs = [_seq(r, pg) for r in reports.values()]
        return (max(seqs) - min(seqs), 1 if pg == DEFAULT_PG else 0)

    return max(pgs, key=spread)


def node_of(rank: int, reports: Mapping[int, Mapping[str, Any]]) -> str:
    """A rank's node: its own report's, else a reporting rank's on the same node (ranks of a node are
    contiguous, ``local_world`` of them); "" when unknown."""
    own = reports.get(rank)
    if own is not None:
        return str(own.get("node", ""))
    for r, rep in reports.items():
        lw = int(rep.get("local_world") or 0)
        if lw > 0 and r // lw == rank // lw:
            return str(rep.get("node", ""))
    return ""


def name_culprit(reports: Mapping[int, Mapping[str, Any]], world: int) -> Culprit:
    """See the module docstring. ``reports``: rank -> its ``hang.evidence`` data."""
    pg = _pick_pg(reports)
    waiting = {r for r, rep in reports.items() if _waits(rep)}
    outside = set(reports) - waiting
    missing = sorted(set(range(world)) - set(reports))
    top = max((_seq(reports[r], pg) for r in waiting), default=-1)
    flights = [f for r in sorted(waiting) if (f := _flight(reports[r], pg)) is not None and int(f.get("seq", -1)) == top]
    notes = sorted({str(reports[r].get("collective") or "") for r in waiting} - {""})
    op = (str(flights[0].get("op", "")) if flights else "") + (f" ({', '.join(notes)})" if notes else "")
    gone = sorted({int(r) for rep in reports.values() for r in rep.get("gone") or ()} - set(reports))
    if gone:  # a rank's process was seen dead by its node's other ranks
        kind, culprits = "died", gone
    elif waiting and outside:
        kind, culprits = "outside_collective", sorted(outside)
    elif waiting and missing:  # a rank that sent nothing explains the rest (DDP's buckets may differ by one)
        kind, culprits = "no_evidence", missing
    elif waiting and (behind := sorted(r for r in waiting if _seq(reports[r], pg) < top)):
        kind, culprits = "behind", behind
    else:
        kind, culprits = "none", []
    frame = str(reports[culprits[0]].get("frame", "")) if culprits and culprits[0] in reports else ""
    nodes = tuple(sorted({n for r in culprits if (n := node_of(r, reports))}))
    table = _table(reports, world, pg, set(culprits), waiting)
    return Culprit(ranks=tuple(culprits), kind=kind, pg=pg, seq=top, op=op.strip(), frame=frame, nodes=nodes,
                   table=table, message=_message(kind, culprits, pg, top, op, frame, waiting, missing, world))


def _table(reports: Mapping[int, Mapping[str, Any]], world: int, pg: str, culprits: set[int],
           waiting: set[int]) -> list[dict[str, Any]]:
    rows = []
    for rank in range(world):
        rep = reports.get(rank)
        if rep is None:
            rows.append({"rank": rank, "node": node_of(rank, reports), "verdict": "culprit" if rank in culprits else "no evidence",
                         "reason": "", "enqueued": None, "completed": None, "in_flight": "", "frame": "",
                         "stalled_s": None})
            continue
        st = (rep.get("pg_status") or {}).get(pg) or {}
        fl = _flight(rep, pg)
        rows.append({"rank": rank, "node": str(rep.get("node", "")),
                     "verdict": "culprit" if rank in culprits else "waits" if rank in waiting else "outside",
                     "reason": str(rep.get("reason", "")), "enqueued": st.get("enqueued"),
                     "completed": st.get("completed"),
                     "in_flight": f"#{fl.get('seq')} {fl.get('op')}" if fl else "",
                     "frame": str(rep.get("frame", "")), "stalled_s": rep.get("stalled_s")})
    return rows


def _message(kind: str, culprits: list[int], pg: str, seq: int, op: str, frame: str, waiting: set[int],
             missing: list[int], world: int) -> str:
    who = f"rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits[:16]))}"
    coll = f"collective #{seq} {op or '?'} on group {pg}"
    if kind == "outside_collective":
        return f"{who} never entered {coll} that {len(waiting)} of {world} ranks wait in; stuck in {frame or '?'}"
    if kind == "behind":
        return f"{who} wait behind the others' {coll}; in {frame or '?'}"
    if kind == "died":
        return f"{who} died (its process gone) while {len(waiting)} ranks were in {coll}"
    if kind == "no_evidence":
        return f"{who} sent no evidence (dead, frozen or its node gone) while {len(waiting)} ranks wait in {coll}"
    return (f"no culprit: {len(waiting)} of {world} ranks wait in {coll}"
            + (f", ranks {missing} sent nothing" if missing else ", every rank inside it (the network?)"))
