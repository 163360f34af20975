"""Which node each rank of a run is on, as the node heartbeats say (the edge's side of a persistent
SDC: controller/recovery_sdc.py).

Each node's leader rank beats for its node (agent/lifecycle.py ``beat``): the node's id, the worker
group's life and the node's ranks. ``RankNodes`` keeps the newest beat's word per rank, and hands the
recovery machine an SDC verdict with its rank's node and the life that node was seen in
(``evidence["node"]``, ``evidence["node_life"]``); the machine uses the node only when that life is
the current one (``recovery_table.sdc_node``), so a rank renumbered by a restart is never evicted on
an old life's word. A rank no beat named gets no node, and the machine calls a human naming the rank.

Stored (``rank_nodes``, controller/store/rank_nodes.py): a run's mapping is written in the batch
that changed it (a rank seen on another node, or in another life) and only then, never per beat
(``unsaved``, then ``saved`` once the batch committed; a batch rolled back writes it again with the
next one), and the newest ``RUNS_KEPT`` runs' mappings are loaded when the controller starts
(``load``), so an SDC verdict right after a controller restart can still name the node. A
heartbeat costs one dictionary write per rank of its node.

Device-level eviction: the beats also say each rank's device slot on its node and how many ranks the
node runs (``slots``, ``ranks``); ``annotate`` adds them to an SDC verdict and to a ``step.triaged``
naming a rank on that node (``evidence["device"]``, ``["node_devices"]``; ``TriagedIn.device``,
``.node_devices``), so the machine can leave out the one device rather than its node
(``recovery_table.device_only``). The slots are stored with the nodes (a change of slot is a change
of mapping), so after a controller restart the loaded map still names each rank's device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from cliffguard.controller.recovery_types import Input, TriagedIn, VerdictIn
from cliffguard.controller.rules.sdc import SDC
from cliffguard.controller.store.rank_nodes import Placed
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event

RUNS_KEPT = 1024
"""Runs whose ranks' nodes are kept (the least recently beating one is forgotten first)."""
_HEARTBEAT = EventType.HEARTBEAT


class RankNodes:
    def __init__(self, runs_kept: int = RUNS_KEPT) -> None:
        self.runs_kept = runs_kept
        self._runs: OrderedDict[str, dict[int, tuple[str, int | None]]] = OrderedDict()
        self._changed: set[str] = set()
        """Runs whose mapping changed since the store last had it."""
        self._writing: set[str] = set()
        """Runs handed to a batch's transaction by ``unsaved``, not yet confirmed by ``saved``."""
        self._devices: dict[str, dict[int, tuple[str, int | None, int, int]]] = {}
        """run -> rank -> (node, life, device slot, ranks on that node), by the newest beat (memory only)."""

    def load(self, runs: dict[str, dict[int, Placed]]) -> None:
        """The stored mappings (oldest first), under any this edge learnt since it started."""
        for run, by_rank in reversed(list(runs.items())):  # each before the ones this edge saw, oldest first
            if run in self._runs:
                continue
            self._runs[run] = {rank: (p[0], p[1]) for rank, p in by_rank.items()}
            self._runs.move_to_end(run, last=False)
            devs: dict[int, tuple[str, int | None, int, int]] = {}
            for rank, (node, life, slot, node_ranks) in by_rank.items():
                if slot is not None and node_ranks is not None:
                    devs[rank] = (node, life, slot, node_ranks)
            if devs:
                self._devices[run] = devs
        while len(self._runs) > self.runs_kept:
            self._forget(self._runs.popitem(last=False)[0])

    def _forget(self, run: str) -> None:
        self._changed.discard(run)
        self._devices.pop(run, None)

    def unsaved(self) -> dict[str, dict[int, Placed]]:
        """The runs whose mapping the store does not have yet, for the batch to write: each rank's node
        and life, with its device slot and its node's rank count where a beat of that node said them."""
        self._writing = {r for r in self._changed if r in self._runs}
        out: dict[str, dict[int, Placed]] = {}
        for r in sorted(self._writing):
            devs = self._devices.get(r, {})
            out[r] = {}
            for rank, (node, life) in self._runs[r].items():
                dev = devs.get(rank)
                if dev is not None and (dev[0], dev[1]) == (node, life):
                    out[r][rank] = (node, life, dev[2], dev[3])
                else:
                    out[r][rank] = (node, life, None, None)
        return out

    def saved(self) -> None:
        """The batch that wrote ``unsaved``'s runs committed."""
        self._changed -= self._writing
        self._writing = set()

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
                self._forget(self._runs.popitem(last=False)[0])
        else:
            self._runs.move_to_end(ev.run)
        for rank in ranks if ranks is not None else (ev.rank,):
            r = int(rank)
            if by_rank.get(r) != where:
                by_rank[r] = where
                self._changed.add(ev.run)
        if isinstance(ranks, list) and ranks:
            slots = ev.data.get("slots")
            if not (isinstance(slots, list) and len(slots) == len(ranks)):
                slots = list(range(len(ranks)))
            devs = self._devices.setdefault(ev.run, {})
            for rank, slot in zip(ranks, slots, strict=True):
                placed = (node, where[1], int(slot), len(ranks))
                if devs.get(int(rank)) != placed:
                    devs[int(rank)] = placed
                    self._changed.add(ev.run)  # a slot the store does not have yet

    def node_of(self, run: str, rank: int) -> tuple[str, int | None] | None:
        """(node, life) of ``rank`` in ``run`` by the newest beat that named it; None when none did."""
        by_rank = self._runs.get(run)
        return None if by_rank is None else by_rank.get(rank)

    def device_of(self, run: str, rank: int) -> tuple[str, int | None, int, int] | None:
        """(node, life, device slot, ranks on the node) of ``rank`` by the newest node beat; None: unknown."""
        return self._devices.get(run, {}).get(rank)

    def annotate(self, run: str, inp: Input) -> Input:
        """An SDC verdict naming a rank, with that rank's node, the life it was seen in and its device;
        a triaged rank on the node the trainer named, with its device."""
        if type(inp) is TriagedIn and inp.rank is not None and inp.node:
            dev = self.device_of(run, inp.rank)
            if dev is None or dev[0] != inp.node:
                return inp
            return replace(inp, device=dev[2], node_devices=dev[3])
        if type(inp) is not VerdictIn or inp.verdict.rule != SDC or inp.verdict.rank is None:
            return inp
        known = self.node_of(run, inp.verdict.rank)
        if known is None:
            return inp
        v = inp.verdict
        extra: dict[str, object] = {"node": known[0], "node_life": known[1]}
        dev = self.device_of(run, v.rank)
        if dev is not None and dev[0] == known[0] and dev[1] == known[1]:
            extra.update(device=dev[2], node_devices=dev[3])
        return replace(inp, verdict=replace(v, evidence={**v.evidence, **extra}))
