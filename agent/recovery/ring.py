"""The in-memory rollback ring: the newest ``capacity`` snapshots of a training state, by step.

One class for every loop: the recovery kit keeps its snapshots here, and the bundled trainer's
``CheckpointManager`` (trainer/checkpoint.py) keeps its memory checkpoints here too, with its own
flat-buffer copy functions (so evicted buffers are recycled as copy targets). A snapshot labelled
``s`` is the state *before* step ``s`` ran.

``copy_in(state, spare)`` turns a live state into a stored snapshot (``spare`` is an evicted one
whose memory may be reused, or None); ``copy_out(snap)`` hands back an independent state
(optimizer.load_state_dict keeps the tensors it is given, so the stored copy is never handed out).
The default pair deep-copies every tensor to CPU. Thread-safe: a lock guards the ring.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch


def cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor detached and copied to CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        out = {k: cpu_copy(v) for k, v in obj.items()}
        return out if type(obj) is dict else type(obj)(out)  # keeps OrderedDict state_dicts
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def _copy_in(state: Any, spare: Any) -> Any:
    return cpu_copy(state)


class MemoryRing:
    """Bounded ``step -> snapshot`` map; oldest evicted first. ``keep(snap)`` says whether an evicted
    snapshot is still used elsewhere (e.g. queued for a disk write) and so must not be recycled."""

    def __init__(self, capacity: int, *, copy_in: Callable[[Any, Any], Any] = _copy_in,
                 copy_out: Callable[[Any], Any] = cpu_copy, keep: Callable[[Any], bool] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity: must be >= 1")
        self.capacity = capacity
        self._copy_in, self._copy_out = copy_in, copy_out
        self._keep = keep or (lambda snap: False)
        self._snaps: OrderedDict[int, Any] = OrderedDict()
        self._spare: list[Any] = []
        self.lock = threading.RLock()

    # -- the mapping view (read-only) ------------------------------------------------------
    def __contains__(self, step: object) -> bool:
        return step in self._snaps

    def __len__(self) -> int:
        return len(self._snaps)

    def __iter__(self) -> Iterator[int]:
        with self.lock:
            return iter(list(self._snaps))

    def items(self) -> list[tuple[int, Any]]:
        with self.lock:
            return list(self._snaps.items())

    def values(self) -> list[Any]:
        with self.lock:
            return list(self._snaps.values())

    def steps(self) -> list[int]:
        with self.lock:
            return sorted(self._snaps)

    def holds(self, snap: Any) -> bool:
        with self.lock:
            return any(v is snap for v in self._snaps.values())

    # -- writing ----------------------------------------------------------------------------
    def copy(self, state: Any) -> Any:
        """A snapshot of ``state`` (into a recycled buffer when one is spare), not put in the ring."""
        with self.lock:
            spare = self._spare.pop() if self._spare else None
        return self._copy_in(state, spare)

    def put(self, step: int, snap: Any) -> None:
        """Keep ``snap`` as step ``step`` (replacing one of the same step), evicting the oldest."""
        with self.lock:
            evicted = [old] if (old := self._snaps.pop(step, None)) is not None else []
            self._snaps[step] = snap
            while len(self._snaps) > self.capacity:
                evicted.append(self._snaps.popitem(last=False)[1])
            for e in evicted:
                self.release(e)

    def snapshot(self, step: int, state: Any) -> Any:
        """Copy ``state`` and keep it as step ``step``; returns the stored snapshot."""
        snap = self.copy(state)
        self.put(step, snap)
        return snap

    def release(self, snap: Any) -> None:
        """Offer a snapshot for reuse once neither the ring nor ``keep`` refers to it."""
        with self.lock:
            if self._keep(snap) or self.holds(snap):
                return
            self._spare = [snap, *self._spare][:2]

    # -- reading ----------------------------------------------------------------------------
    def get(self, step: int) -> Any | None:
        """An independent copy of the state labelled ``step``; None when the ring lacks it."""
        with self.lock:
            snap = self._snaps.get(step)
            return None if snap is None else self._copy_out(snap)

    def restore(self, to_step: int) -> Any:
        """The state labelled ``to_step`` (a copy), forgetting every newer one (the abandoned
        timeline). KeyError, with nothing forgotten, when the ring lacks it."""
        state = self.get(to_step)
        if state is None:
            raise KeyError(f"step {to_step}: not in the memory ring (have {self.steps()})")
        self.discard_after(to_step)
        return state

    def discard_after(self, step: int) -> None:
        with self.lock:
            for s in [s for s in self._snaps if s > step]:
                self.release(self._snaps.pop(s))

    def clear(self) -> None:
        self.discard_after(-1)
