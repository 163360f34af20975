"""Which node each rank of a run is on, as the node heartbeats say (the edge's side of a persistent
SDC: controller/recovery_sdc.py).

Each node's leader rank beats for its node (agent/lifecycle.py ``beat``): the node's id, the worker
group's life and the node's ranks. ``RankNodes`` keeps the newest beat's word per rank, and hands the
recovery machine an SDC verdict with its rank's node and the life that node was seen in
(``evidence["node"]``, ``evidence["node_life"]``); the machine uses the node only when that life is
the current one (``recovery_table.sdc_node``), so a rank renumbered by a restart is never evicted on
an old life's word. A rank no beat named gets no node, and the machine calls a human naming the rank.

Not stored: after a controller restart the first beats (every ``heartbeat_s``, 5 s by default) fill
it again. A heartbeat costs one dictionary write per rank of its node.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from cliffguard.controller.recovery_types import Input, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event

RUNS_KEPT = 1024
"""Runs whose ranks' nodes are kept (the least recently beating one is forgotten first)."""
_HEARTBEAT = EventType.HEARTBEAT


class RankNodes:
    def __init__(self, runs_kept: int = RUNS_KEPT) -> None:
        self.runs_kept = runs_kept
        self._runs: OrderedDict[str, dict[int, tuple[str, int | None]]] = OrderedDict()

    def seen(self, ev: Event) -> None:
        """Note the node of each rank a heartbeat speaks for (a beat that names no node is ignored)."""
        if ev.type is not _HEARTBEAT:
            return
        node = ev.data.get("node")
        if not isinstance(node, str) or not node:
            return
        life = ev.data.get("life")
        where = (node, life if isinstance(life, int) else None)
        ranks = ev.data.get("ranks")
        by_rank = self._runs.get(ev.run)
        if by_rank is None:
            by_rank = self._runs[ev.run] = {}
            while len(self._runs) > self.runs_kept:
                self._runs.popitem(last=False)
        else:
            self._runs.move_to_end(ev.run)
        for rank in ranks if ranks is not None else (ev.rank,):
            by_rank[int(rank)] = where

    def node_of(self, run: str, rank: int) -> tuple[str, int | None] | None:
        """(node, life) of ``rank`` in ``run`` by the newest beat that named it; None when none did."""
        by_rank = self._runs.get(run)
        return None if by_rank is None else by_rank.get(rank)

    def annotate(self, run: str, inp: Input) -> Input:
        """An SDC verdict naming a rank, with that rank's node and the life it was seen in."""
        if type(inp) is not VerdictIn or inp.verdict.rule != SDC or inp.verdict.rank is None:
            return inp
        known = self.node_of(run, inp.verdict.rank)
        if known is None:
            return inp
        v = inp.verdict
        return replace(inp, verdict=replace(v, evidence={**v.evidence, "node": known[0], "node_life": known[1]}))
