"""The step's one all-reduced tensor, filled in place instead of built from parts every step.

Layout (float64, summed over the ranks)::

    [ per-rank loss slots (world) | pending-command flag | norm contributors |
      global grad-norm² | per-layer grad-norm² (n_layers, when due) | per-rank perf block (when due) |
      per-rank parameter hashes (world, when due) ]

The perf block is ``len(PERF_FIELDS)`` runs of ``world`` slots, field-major (agent/rank_perf.py);
the hash block is the SDC watch's (agent/param_check.py).
One buffer per layout (with or without the per-layer norms, the perf block, the hashes) is
kept on the device, with a host twin for the scalars: on a CPU the twin is the buffer itself
(numpy writes, no kernels), elsewhere one copy moves it. Building the tensor from a handful of
small tensors each step cost ~10 kernel launches and allocations on the training thread.

The caller reads the result (``.tolist()``) before the next ``fill``, which reuses the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cliffguard.agent.rank_perf import PERF_FIELDS


@dataclass(slots=True)
class _Buffer:
    packed: torch.Tensor
    host: np.ndarray
    """The scalars' writable twin (``packed`` itself on a CPU)."""
    staging: torch.Tensor | None
    """The host tensor behind ``host`` when ``packed`` is on another device."""
    loss: torch.Tensor  # this rank's loss slot (a 1-element view)
    sq: torch.Tensor  # the grad-norm² slots (a view)
    hash: torch.Tensor | None  # this rank's parameter-hash slot (a 1-element view), when the layout has one


class PackedStep:
    def __init__(self, *, world: int, rank: int, n_layers: int, device: torch.device) -> None:
        self.world, self.rank, self.n_layers, self.device = world, rank, n_layers, torch.device(device)
        self._buffers: dict[tuple[bool, bool, bool], _Buffer] = {}
        w = world
        self.flag_at = w
        self.contributors_at = w + 1
        self.sq_at = w + 2

    def sq_len(self, layers: bool) -> int:
        return 1 + (self.n_layers if layers else 0)

    def perf_at(self, layers: bool) -> int:
        return self.sq_at + self.sq_len(layers)

    def hashes_at(self, layers: bool, perf: bool) -> int:
        return self.perf_at(layers) + (len(PERF_FIELDS) * self.world if perf else 0)

    def _buffer(self, layers: bool, perf: bool, check: bool) -> _Buffer:
        buf = self._buffers.get((layers, perf, check))
        if buf is None:
            at = self.hashes_at(layers, perf)
            n = at + (self.world if check else 0)
            packed = torch.zeros(n, dtype=torch.float64, device=self.device)
            staging = None if self.device.type == "cpu" else torch.zeros(n, dtype=torch.float64)
            host = (packed if staging is None else staging).numpy()
            sq = packed[self.sq_at : self.sq_at + self.sq_len(layers)]
            own_hash = packed[at + self.rank : at + self.rank + 1] if check else None
            buf = _Buffer(packed, host, staging, packed[self.rank : self.rank + 1], sq, own_hash)
            self._buffers[(layers, perf, check)] = buf
        return buf

    def fill(self, *, loss_sum: torch.Tensor, micro: int, flag: float, sq: torch.Tensor | float | None, layers: bool,
             perf: list[float] | None, param_hash: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's part of the step's tensor (every other slot 0), ready to all-reduce.

        ``sq``: float64 ``[global | per-layer (when layers)]`` grad-norm² (the global one alone
        may be a float), None when this rank computed no norms; ``perf``: this rank's value of
        each of ``PERF_FIELDS``, or None; ``param_hash``: this rank's parameter hash (a 0-dim
        integer tensor below 2**52, exact in float64), or None when no check is due. Each kernel costs ~10-20 us on a training thread
        between a backward and an optimizer step, so numbers go through the host array."""
        buf = self._buffer(layers, perf is not None, param_hash is not None)
        host = buf.host
        host.fill(0.0)
        host[self.flag_at] = flag
        host[self.contributors_at] = 0.0 if sq is None else 1.0
        if perf is not None:
            at = self.perf_at(layers)
            host[at + self.rank : at + len(PERF_FIELDS) * self.world : self.world] = perf
        if isinstance(sq, float):
            host[self.sq_at] = sq
        if buf.staging is not None:
            buf.packed.copy_(buf.staging, non_blocking=False)
        buf.loss.copy_(loss_sum if loss_sum.dim() == 0 else loss_sum.reshape(1))
        if micro > 1:
            buf.loss.div_(micro)
        if isinstance(sq, torch.Tensor):
            buf.sq.copy_(sq)
        if param_hash is not None and buf.hash is not None:
            buf.hash.copy_(param_hash.reshape(1))
        return buf.packed
