"""Per-layer gradient histograms and norms, computed on the device with one host sync per read
(two when a layer has inf/NaN gradients).

Bins are log2-spaced over |g| with edges fixed for the whole run (``2**lo_exp`` .. ``2**hi_exp``),
so histograms from step 100 and step 10,000 can be compared bin by bin. Bin ``i`` counts finite
non-zero values with ``edges[i] <= |g| < edges[i+1]``; values below the first edge land in bin 0
and are also reported as ``underflow`` (the fraction of a layer's elements that small — the
ones a low-precision format would flush to zero); values at or above the last edge land in the
last bin. Zeros and non-finite values are counted apart, so for every layer
``sum(counts) + zeros + nonfinite == numel``.

A "layer" is one parameter tensor, by its name in ``model.named_parameters()`` (with the
``module.`` prefix of DDP removed): the finest grain that needs no knowledge of the model.

Everything for every layer is computed on the gradients' device and moved to the host with a
single ``.tolist()``: one host sync per emission, none between emissions.
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


_EXP_BIAS = 127  # float32: |g| = 1.m x 2**(field - 127) for an exponent field in 1..254
_INF_FIELD = 255  # inf and NaN
_MAG = 0x7FFFFFFF  # every bit of a float32 but its sign


def _field_slots(cfg: HistConfig, dev: torch.device) -> torch.Tensor:
    """A (256, nb + 3) one-hot map from a float32 exponent field to its slot: 0 = underflow,
    1..nb = the bins, nb + 2 = non-finite (zeros, field 0 like the subnormals, are moved to
    slot nb + 1 by the caller, which counts them apart)."""
    nb = cfg.n_bins
    field = torch.arange(256)
    slot = (field - _EXP_BIAS - cfg.lo_exp).clamp(-1, nb - 1) + 1
    slot[0] = 0  # zero or subnormal: below every edge unless lo_exp < -126 (see grad_histograms)
    slot[_INF_FIELD] = nb + 2
    return torch.nn.functional.one_hot(slot, nb + 3).to(dev, torch.float64)


def grad_histograms(named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg: HistConfig) -> dict[str, dict]:
    """The ``layers`` payload of a ``grad_hist`` event (one host sync).

    The bin of a float32 is its exponent field, so each layer costs a few integer passes over its
    bits (a 256-way ``bincount`` of the field, the count of zeros, the largest finite magnitude as
    an integer) and a fused ``_foreach_norm``; a tiny matrix product then folds the 256 fields
    into the configured bins. No ``log``, no ``frexp``, no per-element layer index. p50/p99 are
    read off the histogram (within their factor-2 bin, interpolated log-linearly): the bins are
    the point of the exercise, and an exact ``kthvalue`` per layer cost ten times more on a CPU.
    """
    names: list[str] = []
    grads: list[torch.Tensor] = []
    for name, p in named_params:
        if p.grad is None:
            continue
        names.append(layer_name(name))
        grads.append(p.grad.detach().reshape(-1).to(torch.float32))
    if not grads:
        return {}
    dev = grads[0].device
    nb = cfg.n_bins
    per_field, nonzero, max_bits = [], [], []
    for g in grads:
        g = g.to(dev)
        mag = g.view(torch.int32) & _MAG
        per_field.append(torch.bincount(mag >> 23, minlength=256))
        nonzero.append(torch.count_nonzero(g))
        max_bits.append(mag.amax() if mag.numel() else mag.new_zeros(()))  # inf/NaN bits if any: see below
    fields = torch.stack(per_field).double()
    table = fields @ _field_slots(cfg, dev)
    zeros = torch.tensor([g.numel() for g in grads], device=dev, dtype=torch.float64) - torch.stack(nonzero)
    table[:, 0] -= zeros
    table[:, nb + 1] = zeros
    if cfg.lo_exp < 1 - _EXP_BIAS:  # bins reach into the subnormals: bin those exactly
        for i, g in enumerate(grads):
            sub = g[(g != 0) & (g.abs() < 2.0 ** (1 - _EXP_BIAS))].abs()
            if sub.numel():
                slot = (torch.frexp(sub)[1] - (1 + cfg.lo_exp)).clamp(-1, nb - 1) + 1
                table[i] -= torch.bincount(torch.zeros_like(slot), minlength=nb + 3).double()
                table[i] += torch.bincount(slot, minlength=nb + 3).double()
    underflow = table[:, 0]
    counts = table[:, 1 : nb + 1].clone()
    counts[:, 0] += underflow  # below the first edge is reported in bin 0 (and as underflow)
    nonfinite = table[:, nb + 2]
    mx = torch.stack(max_bits).view(torch.float32).double()  # wrong where a layer has inf/NaN: fixed below
    # Non-finite gradients give a non-finite norm, on purpose.
    norm = torch.stack(torch._foreach_norm([g.to(dev) for g in grads])).double()
    numels = [g.numel() for g in grads]
    n = torch.tensor(numels, device=dev, dtype=torch.float64)
    p50 = _percentile(counts, zeros, n, 0.50, cfg.lo_exp)
    p99 = _percentile(counts, zeros, n, 0.99, cfg.lo_exp)
    table = torch.cat([counts, torch.stack([zeros, nonfinite, p50, p99, mx, norm, underflow], dim=1)], dim=1)
    rows = table.tolist()  # the one host sync
    out: dict[str, dict] = {}
    for name, numel, row, g in zip(names, numels, rows, grads, strict=True):
        zeros_i, nonfinite_i, p50_i, p99_i, mx_i, norm_i, underflow_i = row[nb:]
        if nonfinite_i:  # rare, and a second host sync: the largest finite magnitude
            mag = g.view(torch.int32) & _MAG
            mx_i = float(torch.where(mag < (_INF_FIELD << 23), mag, 0).amax().view(torch.float32))
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
