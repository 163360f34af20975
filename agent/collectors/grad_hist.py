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

Everything for every layer is packed into one tensor on the gradients' device and moved to the
host with a single ``.tolist()``: one host sync per emission, none between emissions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

STATS_PER_LAYER = 7  # zeros, nonfinite, p50, p99, max, norm, underflow (after the bin counts)


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


def _layer_stats(grad: torch.Tensor, cfg: HistConfig) -> torch.Tensor:
    """[counts..., zeros, nonfinite, p50, p99, max, norm, underflow] for one gradient, on its device."""
    g = grad.detach().reshape(-1).float()
    a = g.abs()
    finite = torch.isfinite(a)
    nonzero = finite & (a > 0)
    nonfinite = (~finite).sum()
    zeros = (finite & (a == 0)).sum()
    # floor(log2|g|) is the bin's lower exponent; clamp puts under/overflow into the end bins.
    exps = torch.floor(torch.log2(torch.where(nonzero, a, torch.ones_like(a))))
    idx = (exps - cfg.lo_exp).clamp(0, cfg.n_bins - 1).long()
    counts = torch.bincount(idx[nonzero], minlength=cfg.n_bins)[: cfg.n_bins]
    clean = torch.where(finite, a, torch.zeros_like(a))
    n = clean.numel()
    p50 = torch.kthvalue(clean, max(1, (n + 1) // 2)).values
    p99 = torch.kthvalue(clean, max(1, min(n, int(round(0.99 * n))))).values
    mx = clean.max()
    norm = torch.linalg.vector_norm(g)  # non-finite gradients give a non-finite norm, on purpose
    underflow = (nonzero & (a < 2.0**cfg.lo_exp)).sum()
    tail = torch.stack([zeros.float(), nonfinite.float(), p50, p99, mx, norm, underflow.float()])
    return torch.cat([counts.float(), tail])


def grad_histograms(named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg: HistConfig) -> dict[str, dict]:
    """The ``layers`` payload of a ``grad_hist`` event (one host sync)."""
    names: list[str] = []
    numels: list[int] = []
    parts: list[torch.Tensor] = []
    for name, p in named_params:
        if p.grad is None:
            continue
        names.append(layer_name(name))
        numels.append(p.grad.numel())
        parts.append(_layer_stats(p.grad, cfg))
    if not parts:
        return {}
    dev = parts[0].device
    flat = torch.cat([t.to(dev) for t in parts]).double().tolist()  # the one host sync
    width = cfg.n_bins + STATS_PER_LAYER
    out: dict[str, dict] = {}
    for i, (name, numel) in enumerate(zip(names, numels, strict=True)):
        row = flat[i * width : (i + 1) * width]
        counts = [int(c) for c in row[: cfg.n_bins]]
        zeros, nonfinite, p50, p99, mx, norm, underflow = row[cfg.n_bins :]
        out[name] = {
            "counts": counts,
            "zeros": int(zeros),
            "nonfinite": int(nonfinite),
            "p50": p50,
            "p99": p99,
            "max": mx,
            "norm": norm,
            "underflow": underflow / numel if numel else 0.0,
            "numel": numel,
        }
    return out
