"""The hang kinds ``bench.hangs`` runs: which fault, on which rank, at which step, and what must
happen (who the culprit is, whether the group is restarted and how)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    what: str
    faults: tuple[str, ...]
    culprit: tuple[int, ...]
    """The rank(s) that must be named (empty: no hang, nothing to name)."""
    restarts: tuple[str, ...]
    """The restarts expected, in order (``in_place``, ``exclude``); empty: never restarted."""
    nodes: int = 1
    """Launches (torchrun agents): 1 = one node of ``nproc`` ranks; 2 = an elastic run of two nodes."""
    baseline: bool = True
    """Also measured under torchrun alone (no controller)."""


def kinds(nproc: int, step: int) -> dict[str, Kind]:
    """Every kind for ``nproc`` ranks with the fault at ``step``; the culprit is the last rank (not
    rank 0, whose listener receives the restart)."""
    r = nproc - 1
    table = [
        Kind("sleep", "a rank sleeps before an all-reduce", (f"hang_rank@{r}:{step}",), (r,), ("in_place",)),
        Kind("kill", "a rank SIGKILLed mid-collective", (f"kill_in_collective@{r}:{step}",), (r,), ("in_place",)),
        Kind("stuck", "a rank stuck in Python outside any collective (a deadlocked data loader)",
             (f"stuck_loader@{r}:{step}",), (r,), ("in_place",)),
        Kind("straggler", "a slow rank (not hung: must not be restarted)", (f"slow_rank@{r}:0.4:{step}",), (), ()),
        Kind("again", "a rank hangs again after its restart: restarted without its node (2 nodes)",
             (f"hang_rank@{r}:{step}:3600:2",), (r,), ("in_place", "exclude"), nodes=2, baseline=False),
    ]
    return {k.name: k for k in table}
