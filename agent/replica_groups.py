"""Which ranks must hold bit-identical parameters: the SDC watch's witnesses under sharded training.

Under DDP (and ZeRO-1/2, whose parameters are replicated) every rank holds the whole model, so
every rank is every other's witness (agent/param_check.py). Under FSDP2 each parameter is a
``DTensor`` whose ``placements`` say, per dimension of its ``DeviceMesh``, whether it is sharded
(``Shard``) or replicated (``Replicate``) along it. Two ranks hold the same local shard exactly
when their mesh coordinates agree on every sharded dimension: under HSDP (a replicate × shard
mesh) the ranks at one shard position across the replica groups are witnesses of each other; under
plain FSDP (``dp_shard`` = world) every rank holds its own shard and nobody can witness it, so the
watch has nothing to compare and says so rather than checking nothing quietly.

The layout is read from the parameters themselves (``DTensor.device_mesh.mesh`` lists the global
ranks), so it holds for any trainer that shards with FSDP2: torchtitan, Accelerate's FSDP2, a plain
loop. ``layout_of`` is pure given the parameters; ``local_tensor`` gives the bits a rank hashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch

try:  # torch.distributed may be built without it (a minimal CPU wheel): then no parameter is a DTensor
    from torch.distributed.tensor import DTensor, Replicate
except ImportError:  # pragma: no cover - every torch this project pins has it
    DTensor = Replicate = None  # type: ignore[assignment,misc]


@dataclass(frozen=True, slots=True)
class ReplicaLayout:
    """The ranks that must agree, as groups; ``why_none`` says why no rank has a witness."""

    groups: tuple[tuple[int, ...], ...]
    """Ranks whose local parameters are bit-identical after every step, each group sorted."""
    sharded: bool
    """Whether the parameters are DTensor shards (FSDP2) rather than whole replicas."""
    why_none: str = ""

    @property
    def has_witnesses(self) -> bool:
        return any(len(g) > 1 for g in self.groups)


def local_tensor(p: Any) -> torch.Tensor:
    """The bits this rank holds of parameter ``p`` (a DTensor's local shard; an integration's view of
    a parameter, such as torchtitan's ``_Param``, through its ``param``)."""
    p = getattr(p, "param", p)
    if DTensor is not None and isinstance(p, DTensor):
        return p.to_local()
    return p


def _mesh_groups(mesh_ranks: torch.Tensor, sharded: Sequence[bool]) -> dict[int, tuple[int, ...]]:
    """Rank -> its key: the mesh coordinates along the sharded dimensions (equal keys: equal shards)."""
    keys: dict[int, tuple[int, ...]] = {}
    for idx in product(*(range(n) for n in mesh_ranks.shape)):
        keys[int(mesh_ranks[idx])] = tuple(i for i, s in zip(idx, sharded, strict=True) if s)
    return keys


def layout_of(params: Iterable[Any], world: int, *, replicated: bool) -> ReplicaLayout:
    """The witness groups of a run's parameters. ``replicated``: the caller knows plain tensors are
    whole replicas (a DDP-wrapped model); plain tensors without that are not assumed identical."""
    ps = [getattr(p, "param", p) for p in params]
    dts = [p for p in ps if DTensor is not None and isinstance(p, DTensor)]
    if not dts:
        if replicated:
            return ReplicaLayout((tuple(range(world)),), sharded=False)
        return ReplicaLayout(tuple((r,) for r in range(world)), sharded=False,
                             why_none="the ranks are not known to hold one model (no DDP, no DTensor)")
    if len(dts) < len(ps):
        return ReplicaLayout(tuple((r,) for r in range(world)), sharded=True,
                             why_none="some parameters are DTensor shards and some plain tensors: no layout to compare by")
    layouts = {(tuple(p.device_mesh.mesh.flatten().tolist()), tuple(p.device_mesh.mesh.shape),
                tuple(not isinstance(pl, Replicate) for pl in p.placements)) for p in dts}
    key: dict[int, tuple[Any, ...]] = {r: () for r in range(world)}
    for flat, shape, sharded in sorted(layouts):
        per_rank = _mesh_groups(torch.tensor(flat).reshape(shape), sharded)
        for r in range(world):
            key[r] = (*key[r], per_rank.get(r))
    by_key: dict[tuple[Any, ...], list[int]] = {}
    for r in range(world):
        by_key.setdefault(key[r], []).append(r)
    groups = tuple(sorted(tuple(g) for g in by_key.values()))
    layout = ReplicaLayout(groups, sharded=True)
    if not layout.has_witnesses:
        return ReplicaLayout(groups, sharded=True, why_none=(
            "every rank holds its own shard (FSDP without replicas): no rank can witness another's; "
            "HSDP (a replicate dimension in the mesh) gives each shard witnesses"))
    return layout


def zero_layout(stage: int, world: int) -> ReplicaLayout:
    """DeepSpeed's witness groups by ZeRO stage. Stages 0-2 keep every rank's working parameters
    whole (stage 1/2 re-gather them after each update), so every rank witnesses every other's
    working copy; a flip in a stage-1/2 rank's fp32 master partition is spread by that gather to
    every rank and no comparison can see it. Stage 3 partitions the parameters themselves: no
    witnesses."""
    if stage >= 3:
        return ReplicaLayout(tuple((r,) for r in range(world)), sharded=True, why_none=(
            "ZeRO-3 partitions every parameter across the ranks: no rank holds another's copy to compare"))
    return ReplicaLayout((tuple(range(world)),), sharded=False)
