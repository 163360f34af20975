"""The SDC watch: data-parallel replicas compare a checksum of their parameters every N steps.

Under DDP every replica starts from rank 0's broadcast parameters and applies the same
all-reduced gradients with the same optimizer, so their parameters are bit-identical at every
step. A rank that computes wrong numbers without crashing (silent data corruption: a flipped bit
in its memory, a bad ALU) breaks that, as a rule for good: its copy differs from then on (a
difference in the lowest bits may round away in a later update), and a loss rule
sees nothing until the poisoned weights show in the loss, if ever.

Each rank hashes its parameters' bits (``param_hash``: exact integer arithmetic on the raw bits,
so any flipped bit changes it) into its own slot of the step's one all-reduce
(agent/packed_step.py); after the sum every rank holds every rank's hash, and ``compare`` names
the ranks outside the largest group of equal hashes. With two replicas a mismatch cannot say
which one is wrong; it says so. ``ParamCheck`` keeps the last step at which all hashes agreed:
the state labelled that step (the state before it ran) is the newest known clean one, so a
rollback must go to a checkpoint at or before it.

A check costs one reduction per parameter tensor every ``param_check_every`` steps (no copy).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cliffguard.agent.replica_groups import local_tensor

DEFAULT_EVERY = 100
"""``[agent] param_check_every``'s default."""
HASH_BITS = 52
"""Hashes are kept below 2**52 so the float64 all-reduce carries them exactly."""
_MASK = (1 << HASH_BITS) - 1
log = logging.getLogger(__name__)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def param_hash(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """A 0-dim int64 tensor on the parameters' device: every parameter's raw bits summed as
    integers (wrapping, deterministic), each sum weighted by an odd number for its position, masked
    to ``HASH_BITS``. No host sync: the value travels in the packed all-reduce."""
    total: torch.Tensor | None = None
    for i, p in enumerate(params):
        d = local_tensor(p).detach()
        bits = d.view(_INT_OF_SIZE[d.element_size()]) if d.is_floating_point() else d
        term = bits.sum(dtype=torch.int64) * (2 * i + 1)
        total = term if total is None else total + term
    if total is None:
        return torch.zeros((), dtype=torch.int64)
    return total & _MASK


@dataclass(frozen=True, slots=True)
class CheckResult:
    agree: bool
    suspects: tuple[int, ...]
    """Ranks outside the largest group of equal hashes; every rank when no group is largest."""
    named: bool
    """Whether the suspects are known (a strict majority agrees): with two replicas, or no
    majority, every rank is a suspect and none is named."""
    groups: tuple[tuple[int, ...], ...]
    """Ranks by equal hash, largest group first."""


def compare(hashes: Sequence[float], ranks: Sequence[int] | None = None) -> CheckResult:
    """Which ranks' parameters differ from the others' (``hashes[i]``: rank ``ranks[i]``'s; all
    ranks in order by default)."""
    values = [int(h) for h in hashes]
    names = list(range(len(values))) if ranks is None else list(ranks)
    by_value: dict[int, list[int]] = {}
    for rank, h in zip(names, values, strict=True):
        by_value.setdefault(h, []).append(rank)
    groups = tuple(sorted((tuple(g) for g in by_value.values()), key=lambda g: (-len(g), g[0])))
    if len(groups) <= 1:
        return CheckResult(True, (), True, groups)
    counts = Counter(len(g) for g in groups)
    majority = len(groups[0]) * 2 > len(values) and counts[len(groups[0])] == 1
    if not majority:
        return CheckResult(False, tuple(sorted(names)), False, groups)
    suspects = tuple(sorted(r for g in groups[1:] for r in g))
    return CheckResult(False, suspects, True, groups)


def compare_groups(hashes: Sequence[float], groups: Sequence[Sequence[int]] | None) -> CheckResult:
    """``compare`` within each group of witnesses (agent/replica_groups.py: under HSDP the ranks
    at one shard position); None: every rank is every other's witness (DDP). A mismatch is named
    only when every disagreeing group has a strict majority."""
    if groups is None:
        return compare(hashes)
    results = [compare([hashes[r] for r in g], g) for g in groups if len(g) > 1]
    bad = [r for r in results if not r.agree]
    parts = tuple(sorted((part for r in results for part in r.groups), key=lambda g: (-len(g), g[0])))
    if not bad:
        return CheckResult(True, (), True, parts)
    return CheckResult(False, tuple(sorted(s for r in bad for s in r.suspects)), all(r.named for r in bad), parts)


class ParamCheck:
    """What the replicas' checks found so far: the last step at which they agreed."""

    def __init__(self) -> None:
        self.last_agreed: int | None = None
        self.mismatches = 0

    @staticmethod
    def due(step: int, *, every: int, mode: str, world: int, replicated: bool) -> bool:
        """Whether ``step`` checks (the same answer on every rank): ``mode`` "auto" checks models
        known to be replicas (DDP), "on" any (the user says the ranks hold one model), "off" none."""
        if not every or world < 2 or step % every:
            return False
        return mode == "on" or (mode == "auto" and replicated)

    def judge(self, step: int, hashes: Sequence[float], *, rank: int,
              groups: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """Compare every rank's hash at ``step`` within its group of witnesses (None: all ranks);
        a mismatch is logged as an error on rank 0 and on each suspect (where the user looks), and
        returned as the step event's field."""
        result = compare_groups(hashes, groups)
        field = self.record(step, result)
        if not result.agree and (rank == 0 or rank in result.suspects):
            who = (f"rank(s) {list(result.suspects)} differ from the others" if result.named else
                   f"no majority among {len(hashes)} replicas ({field['groups']}): cannot say which")
            never = ("" if "last_agreed" in field else "; they never agreed in this process: if its ranks do not "
                     "hold one model (sharded, or each its own), set [agent] param_check = \"off\"")
            log.error("SDC watch: the data-parallel replicas' parameters differ at step %d: %s; they last agreed "
                      "at step %s%s", step, who, field.get("last_agreed", "(never)"), never)
        return field

    def record(self, step: int, result: CheckResult) -> dict[str, Any]:
        """The step event's ``param_check`` field for a check at ``step`` (before its update)."""
        if result.agree:
            self.last_agreed = step
            return {"agree": True}
        self.mismatches += 1
        field: dict[str, Any] = {"agree": False, "suspects": list(result.suspects), "named": result.named,
                                 "groups": [list(g) for g in result.groups], "mismatches": self.mismatches}
        if self.last_agreed is not None:  # none yet: the first check already disagreed
            field["last_agreed"] = self.last_agreed
        return field

    def rewound(self, step: int) -> None:
        """The run went back to ``step`` (a rollback): an agreement after it is of a timeline gone."""
        if self.last_agreed is not None and self.last_agreed > step:
            self.last_agreed = step

    def state_dict(self) -> dict[str, Any]:
        return {"last_agreed": self.last_agreed, "mismatches": self.mismatches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        last = state.get("last_agreed")
        self.last_agreed = None if last is None else int(last)
        self.mismatches = int(state.get("mismatches", 0))
