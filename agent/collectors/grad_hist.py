"""Per-layer gradient histograms and norms, computed on the device with one host sync per read.

Bins are log2-spaced over |g| with edges fixed for the whole run (``2**lo_exp`` .. ``2**hi_exp``),
so histograms from step 100 and step 10,000 can be compared bin by bin. Bin ``i`` counts finite
non-zero values with ``edges[i] <= |g| < edges[i+1]``; values below the first edge land in bin 0
and are also reported as ``underflow`` (the fraction of a layer's elements that small — the
ones a low-precision format would flush to zero); values at or above the last edge land in the
last bin. Zeros and non-finite values are counted apart, so for every layer
``sum(counts) + zeros + nonfinite == numel``.

A "layer" is one parameter tensor, by its name in ``model.named_parameters()`` (with the
``module.`` prefix of DDP removed): the finest grain that needs no knowledge of the model.

Everything for every layer is computed in one pass on the gradients' device and moved to the
host with a single ``.tolist()``: one host sync per emission, none between emissions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


def layer_name(name: str) -> str:
    """Parameter name without the wrapper prefixes DDP/compile add."""
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


@dataclass(kw_only=True, slots=True)
class HistConfig:
    lo_exp: int = -40
    """log2 of the first bin edge: |g| below 2**lo_exp counts as underflow (bf16 keeps ~2**-133,
    fp16 ~2**-24; -40 shows fp16 trouble and is far below any healthy gradient)."""
    hi_exp: int = 4
    """log2 of the last edge; larger |g| fall into the last bin."""

    def __post_init__(self) -> None:
        if self.hi_exp <= self.lo_exp:
            raise ValueError("hi_exp: must be greater than lo_exp")
        if self.hi_exp - self.lo_exp > 256:
            raise ValueError("hi_exp: at most 256 bins")

    @property
    def n_bins(self) -> int:
        return self.hi_exp - self.lo_exp

    def edges(self) -> list[float]:
        return [2.0**e for e in range(self.lo_exp, self.hi_exp + 1)]


def _percentile(counts: torch.Tensor, zeros: torch.Tensor, numel: torch.Tensor, q: float, lo_exp: int) -> torch.Tensor:
    """Per-layer q-quantile of |g| from the histogram: zeros first, then log-linear within the bin."""
    target = (q * numel).clamp(min=1.0)
    cum = torch.cumsum(counts, dim=1) + zeros[:, None]
    b = torch.searchsorted(cum, target[:, None]).squeeze(1).clamp(max=counts.shape[1] - 1)
    below = torch.where(b > 0, cum.gather(1, (b - 1).clamp(min=0)[:, None]).squeeze(1), zeros)
    in_bin = counts.gather(1, b[:, None]).squeeze(1).clamp(min=1.0)
    frac = ((target - below) / in_bin).clamp(0.0, 1.0)
    value = torch.pow(2.0, lo_exp + b.double() + frac)
    return torch.where(target <= zeros, torch.zeros_like(value), value)


def grad_histograms(named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg: HistConfig) -> dict[str, dict]:
    """The ``layers`` payload of a ``grad_hist`` event (one host sync).

    All gradients are concatenated into one vector with a layer index per element, so the whole
    emission is a handful of vectorised ops (one ``bincount`` over layer×bin) instead of a dozen
    per layer. p50/p99 are read off the histogram (within their factor-2 bin, interpolated
    log-linearly): the bins are the point of the exercise, and an exact ``kthvalue`` per layer
    cost ten times more on a CPU.
    """
    names: list[str] = []
    grads: list[torch.Tensor] = []
    for name, p in named_params:
        if p.grad is None:
            continue
        names.append(layer_name(name))
        grads.append(p.grad.detach().reshape(-1))
    if not grads:
        return {}
    dev = grads[0].device
    n_layers, nb = len(grads), cfg.n_bins
    width = nb + 3  # [underflow | nb log2 bins | zero | non-finite] per layer: ONE bincount
    numels = torch.tensor([g.numel() for g in grads], device=dev)
    flat = torch.cat([g.to(dev, torch.float32) for g in grads])
    layer = torch.repeat_interleave(torch.arange(n_layers, device=dev, dtype=torch.int32), numels)
    a = flat.abs()
    # frexp: |g| = m·2**e with m in [0.5, 1), so floor(log2|g|) = e - 1 (one integer pass, no log).
    _, exps = torch.frexp(a)
    slot = (exps - (1 + cfg.lo_exp)).clamp_(-1, nb - 1).add_(1)  # 0 = underflow, 1..nb = the bins
    slot = torch.where(a == 0, nb + 1, slot)
    slot = torch.where(torch.isfinite(a), slot, nb + 2)
    table = torch.bincount(layer * width + slot, minlength=n_layers * width).view(n_layers, width).double()
    underflow = table[:, 0]
    counts = table[:, 1 : nb + 1].clone()
    counts[:, 0] += underflow  # below the first edge is reported in bin 0 (and as underflow)
    zeros, nonfinite = table[:, nb + 1], table[:, nb + 2]
    clean = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    mx = torch.zeros(n_layers, device=dev).scatter_reduce_(0, layer.long(), clean, "amax").double()
    # Non-finite gradients give a non-finite norm, on purpose.
    norm = torch.zeros(n_layers, device=dev).index_add_(0, layer, flat.square()).double().sqrt()
    n = numels.double()
    p50 = _percentile(counts, zeros, n, 0.50, cfg.lo_exp)
    p99 = _percentile(counts, zeros, n, 0.99, cfg.lo_exp)
    table = torch.cat([counts, torch.stack([zeros, nonfinite, p50, p99, mx, norm, underflow], dim=1)], dim=1)
    rows = table.tolist()  # the one host sync
    out: dict[str, dict] = {}
    for name, numel, row in zip(names, numels.tolist(), rows, strict=True):
        zeros_i, nonfinite_i, p50_i, p99_i, mx_i, norm_i, underflow_i = row[nb:]
        out[name] = {
            "counts": [int(c) for c in row[:nb]],
            "zeros": int(zeros_i),
            "nonfinite": int(nonfinite_i),
            "p50": min(p50_i, mx_i),
            "p99": min(p99_i, mx_i),
            "max": mx_i,
            "norm": norm_i,
            "underflow": underflow_i / numel if numel else 0.0,
            "numel": numel,
        }
    return out
