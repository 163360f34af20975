"""``RankWindows`` saved in parts: the row table, and one part per ring slot written since the last save (pure).

A 16,384-rank run's MFU windows are 16k ranks x 50 points x 4 values: packing them whole
(``RankWindows.packed``) cost ~100 ms, and the straggler and memory rules' ~80 ms more, with every
batch that brought a ``ranks`` chunk: a burst of seconds every ``ranks_every`` steps across a
fleet, during which no step verdict could leave (``bench.fleet``: verdict p99 783 ms, the
consumer lag a sawtooth). A round of ``ranks`` events writes one ring slot of every row, so a
save writes what changed: the row table (ranks, ring starts and counts: three columns, mostly
constant, which ``pack_array`` stores as one byte each) and the slots written since the last save
(usually one: 1/50 of the windows). The controller keeps each part in a row of its own
(``controller/runstate.py``: ``rule#part``), written in the batch's transaction like any rule state.

Reading back is checked like ``load_packed``: the store is not trusted. A slot part holds the
rows that existed when it was written; rows added since have never had that slot written (a
new row is all zeros, and a write marks the slot), so they read as zeros, as they are in memory.
A slot that a row's window covers but no part holds is an error (a lost row), not a zero.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cliffguard.controller.rules.packed import PackedStateError, pack_array, unpack_array
from cliffguard.controller.rules.rank_window import RankWindows, _count
from cliffguard.core.events import MAX_WORLD

SPLIT_VERSION = 2
"""The row table's ``v`` (``RankWindows.packed`` writes 1: the whole windows in one)."""


def split(w: RankWindows) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the row table, {slot: part} of the slots written since the last split), and the windows
    count as saved from here on. The row table is kept until a row or a count changes."""
    n = len(w)
    if w.meta is None:
        w.meta = {"v": SPLIT_VERSION, "rows": n, "size": w.size, "width": w.width,
                  "rank_gaps": pack_array(np.diff(np.array(w.ranks, np.int64), prepend=0)),
                  "start": pack_array(w.start[:n]), "count": pack_array(w.count[:n])}
    slots = range(w.size) if w.dirty is None else sorted(w.dirty)
    parts = {str(j): {"rows": n, "steps": pack_array(np.ascontiguousarray(w.steps[:n, j])),
                      "values": pack_array(np.ascontiguousarray(w.values[:, :n, j]))} for j in slots}
    w.dirty = set()
    return w.meta, parts


def is_split(stored: Any) -> bool:
    return isinstance(stored, dict) and stored.get("v") == SPLIT_VERSION


def load_split(w: RankWindows, meta: Any, parts: Any) -> None:
    """Replace every row with what ``split`` saved (the row table and its slot parts), checked
    throughout before anything is replaced (PackedStateError)."""
    if not is_split(meta):
        raise PackedStateError("rank windows: not a split row table")
    if not isinstance(parts, dict):
        raise PackedStateError(f"rank windows: slot parts must be a table, got {type(parts).__name__}")
    n, size, width = (_count(meta, key) for key in ("rows", "size", "width"))
    if width != w.width:
        raise PackedStateError(f"rank windows: {width} values per point stored, {w.width} expected")
    if size < 1:
        raise PackedStateError("rank windows: a window of no slots")
    ranks = np.cumsum(unpack_array(meta.get("rank_gaps"), np.int64, (n,), "rank windows: ranks"))
    start = unpack_array(meta.get("start"), np.int64, (n,), "rank windows: ring starts")
    count = unpack_array(meta.get("count"), np.int64, (n,), "rank windows: counts")
    if n and (ranks.min() < 0 or ranks.max() >= MAX_WORLD or len(np.unique(ranks)) != n):
        raise PackedStateError(f"rank windows: ranks are not distinct numbers in 0..{MAX_WORLD - 1}")
    if n and (count.min() < 0 or count.max() > size or start.min() < 0 or start.max() >= size):
        raise PackedStateError(f"rank windows: a count outside 0..{size} or a ring start outside 0..{size - 1}")
    steps = np.zeros((n, size), np.int64)
    values = np.zeros((w.width, n, size), w.dtype)
    held = np.zeros(size, bool)
    for key, part in parts.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < size):
            continue  # a slot of a larger window saved before a resize: not this window's
        j = int(key)
        if not isinstance(part, dict):
            raise PackedStateError(f"rank windows: slot {j} is not a part")
        m = _count(part, "rows")
        m_in = min(m, n)  # rows beyond n were dropped since (a reload replaced the table)
        col = unpack_array(part.get("steps"), np.int64, (m,), f"rank windows: slot {j} steps")
        vals = unpack_array(part.get("values"), w.dtype, (w.width, m), f"rank windows: slot {j} values")
        steps[:m_in, j], values[:, :m_in, j] = col[:m_in], vals[:, :m_in]
        held[j] = True
    if n:
        used = (np.arange(size) - start[:, None]) % size < count[:, None]  # the slots each window covers
        missing = used.any(axis=0) & ~held
        if missing.any():
            raise PackedStateError(f"rank windows: no part for slots {np.flatnonzero(missing).tolist()[:8]} "
                                   "that a window covers")
    if size != w.size:  # the window was resized since: keep each rank's newest points, as load does
        idx = (start[:, None] + np.arange(size)) % size
        rows = np.arange(n)[:, None]
        st, vs = steps[rows, idx], values[:, rows, idx]
        w.load((int(r), list(zip(st[i, :c].tolist(), vs[:, i, :c].T.tolist(), strict=True)))
               for i, (r, c) in enumerate(zip(ranks.tolist(), count.tolist(), strict=True)))
        return
    w._clear()
    rows = w.rows_for(ranks)  # 0..n-1: the ranks are new and distinct
    w.steps[rows], w.values[:, rows], w.start[rows], w.count[rows] = steps, values, start, count
    w.dirty, w.meta = set(), meta  # what the store holds: the next save writes only what changes


def prefixed(field: str, parts: dict[str, Any]) -> dict[str, Any]:
    """A rule's parts named after the state field that holds their row table: ``recent.17``."""
    return {f"{field}.{j}": part for j, part in parts.items()}


def parts_of(state: dict[str, Any], field: str) -> dict[str, Any]:
    """The slot parts of ``field`` among a loaded rule state's ``parts`` (``controller/runstate.py``)."""
    parts = state.get("parts")
    if not isinstance(parts, dict):
        return {}
    lead = field + "."
    return {key[len(lead):]: part for key, part in parts.items() if isinstance(key, str) and key.startswith(lead)}


def load_windows(w: RankWindows, state: dict[str, Any], field: str) -> None:
    """``state[field]`` into ``w``: a split row table with its parts, or the whole packed windows."""
    stored = state[field]
    if is_split(stored):
        load_split(w, stored, parts_of(state, field))
    else:
        w.load_packed(stored)
