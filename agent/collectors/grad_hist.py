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
single copy: one host sync per emission, none between emissions.

Cost: a ``GradHistogram`` keeps its layout and buffers between reads and makes the same nine
passes over chunks of many layers at once (one ``_foreach_copy_`` into a flat float32 buffer,
fused ``_foreach`` norms and maxima, four integer passes building ``layer * 257 + key`` and one
``bincount``), whatever the number of layers; the fold into bins and the percentiles are numpy
on (layers x bins) numbers after the one copy to the host. The default GPT (0.8M parameters, 52
layers) reads in ~3 ms on one loaded CPU thread, where a kernel per layer and statistic took
~5.5 ms; the floor is the passes themselves (``bincount`` alone is ~0.9 ms), which is why
``hist_every`` stays a knob. ``bench/agent_overhead.py`` measures it inside a training step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
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


def _percentiles(counts: np.ndarray, zeros: np.ndarray, numel: np.ndarray, qs: np.ndarray, lo_exp: int) -> np.ndarray:
    """(layers, len(qs)) quantiles of |g| from the histogram: zeros first, then log-linear within
    the bin."""
    target = np.maximum(numel[:, None] * qs[None, :], 1.0)
    cum = np.cumsum(counts, axis=1)
    cum += zeros[:, None]
    b = np.minimum((cum[:, None, :] < target[:, :, None]).sum(axis=2), counts.shape[1] - 1)  # first cum >= target
    rows = np.arange(len(counts))[:, None]
    below = np.where(b > 0, cum[rows, np.maximum(b - 1, 0)], zeros[:, None])
    in_bin = np.maximum(counts[rows, b], 1.0)
    frac = np.clip((target - below) / in_bin, 0.0, 1.0)
    value = np.power(2.0, lo_exp + b + frac)
    return np.where(target <= zeros[:, None], 0.0, value)


_QUANTILES = np.array([0.50, 0.99])
_EXP_BIAS = 127  # float32: |g| = 1.m x 2**(field - 127) for an exponent field in 1..254
_INF_FIELD = 255  # inf and NaN
_MAG = 0x7FFFFFFF  # every bit of a float32 but its sign
_KEYS = 257  # per layer: 0 = an exact zero, 1 + f = exponent field f (f = 0: subnormals)

CPU_CHUNK_NUMEL = 1 << 18
"""Most elements one pass works on, on a CPU: the passes after the first copy then run in the
core's L2 cache (~8% faster than 4M-element passes on the default GPT)."""
DEVICE_CHUNK_NUMEL = 1 << 24
"""The same on an accelerator, where a kernel per chunk and pass must stay large. Either bounds
the reader's buffers (8 bytes per element: a float32 copy and its int32 keys)."""


def _field_slots(cfg: HistConfig) -> np.ndarray:
    """A (257, nb + 3) one-hot map from a key (0 = exact zero, 1 + the float32 exponent field) to
    its slot: 0 = underflow, 1..nb = the bins, nb + 1 = zeros, nb + 2 = non-finite."""
    nb = cfg.n_bins
    exp_field = torch.arange(_KEYS) - 1
    slot = (exp_field - _EXP_BIAS - cfg.lo_exp).clamp(-1, nb - 1) + 1
    slot[1] = 0  # subnormal: below every edge unless lo_exp < -126 (see GradHistogram.read)
    slot[1 + _INF_FIELD] = nb + 2
    slot[0] = nb + 1
    return torch.nn.functional.one_hot(slot, nb + 3).double().numpy()


@dataclass(slots=True)
class _Chunk:
    """One pass: ``pieces`` (layer index, start, end) of the flattened gradients, in order."""
    pieces: list[tuple[int, int, int]]
    numel: int
    offsets: list[int]
    """Each piece's key offset ((layer - the chunk's first layer) * 257), added by one
    ``_foreach_add_``: the chunk's ``bincount`` covers only its own layers' keys."""
    first: int = 0
    """The chunk's first layer (its layers are consecutive)."""
    n_keys: int = 0
    views: list[torch.Tensor] = field(default_factory=list)
    """The pieces' places in the reader's flat buffer, flat."""
    keys: list[torch.Tensor] = field(default_factory=list)
    """The same places in the key buffer."""
    targets: list[torch.Tensor] = field(default_factory=list)
    """The pieces' places shaped like the whole gradients they receive (all but a piece of a
    layer cut across chunks): one ``_foreach_copy_`` fills the chunk, no reshape per layer."""


class _Layout:
    """How a set of gradient shapes is cut into chunks; rebuilt only when the shapes change."""

    def __init__(self, shapes: list[torch.Size], dev: torch.device, chunk_numel: int) -> None:
        self.chunks: list[_Chunk] = []
        n_layers = len(shapes)
        packed: list[tuple[int, int, int]] = []
        packed_n = 0

        def close(pieces: list[tuple[int, int, int]]) -> None:
            if pieces:
                first, last = pieces[0][0], pieces[-1][0]
                self.chunks.append(_Chunk(pieces, sum(e - s for _, s, e in pieces),
                                          [(i - first) * _KEYS for i, _, _ in pieces], first, (last - first + 1) * _KEYS))

        for i, shape in enumerate(shapes):
            n = shape.numel()
            if n == 0:
                continue
            if n <= chunk_numel:  # small layers share a chunk, in layer order
                if packed_n + n > chunk_numel:
                    close(packed)
                    packed, packed_n = [], 0
                packed.append((i, 0, n))
                packed_n += n
                continue
            close(packed)
            packed, packed_n = [], 0
            for s in range(0, n, chunk_numel):
                close([(i, s, min(n, s + chunk_numel))])
        close(packed)
        order = [i for c in self.chunks for i, _, _ in c.pieces]
        self.piece_layer = torch.tensor(order, dtype=torch.int64, device=dev)
        self.one_piece_per_layer = order == list(range(n_layers))
        """Every layer is one piece, in layer order: per-piece results are per-layer results."""
        self.numels = [shape.numel() for shape in shapes]
        self.numels_f64 = np.array(self.numels, dtype=np.float64)
        most = max((c.numel for c in self.chunks), default=0)
        self.flat = torch.empty(most, dtype=torch.float32, device=dev)
        self.keys = torch.empty(most, dtype=torch.int32, device=dev)
        self.n_keys = n_layers * _KEYS
        for c in self.chunks:
            sizes = [e - s for _, s, e in c.pieces]
            c.views = list(self.flat[: c.numel].split(sizes))
            c.keys = list(self.keys[: c.numel].split(sizes))
            if len(c.pieces) > 1 or c.pieces[0][2] - c.pieces[0][1] == shapes[c.pieces[0][0]].numel():
                c.targets = [v.view(shapes[i]) for v, (i, _, _) in zip(c.views, c.pieces, strict=True)]


class GradHistogram:
    """Reads the ``layers`` payload of a ``grad_hist`` event; keep one per model, so its layout
    and buffers are reused from read to read (see the module docstring for the contract)."""

    def __init__(self, cfg: HistConfig, *, chunk_numel: int | None = None) -> None:
        if chunk_numel is not None and chunk_numel < 1:
            raise ValueError("chunk_numel: must be >= 1")
        self.cfg = cfg
        self.chunk_numel = chunk_numel
        self._signature: tuple | None = None
        self._layout: _Layout | None = None
        self._slots: np.ndarray | None = None
        self._names: dict[str, str] = {}  # parameter name -> layer name

    def _layout_for(self, grads: list[torch.Tensor], dev: torch.device) -> _Layout:
        signature = (dev, tuple(g.shape for g in grads))
        if signature != self._signature or self._layout is None:
            chunk = self.chunk_numel or (CPU_CHUNK_NUMEL if dev.type == "cpu" else DEVICE_CHUNK_NUMEL)
            self._layout = _Layout(list(signature[1]), dev, chunk)
            self._slots = _field_slots(self.cfg)
            self._signature = signature
        return self._layout

    def _subnormal_fix(self, grads: list[torch.Tensor], dev: torch.device) -> torch.Tensor:
        """(layers, nb + 3) corrections moving each layer's subnormals from the underflow slot to
        their exact bins (only when the bins reach below float32's smallest normal)."""
        cfg, nb = self.cfg, self.cfg.n_bins
        fix = torch.zeros(len(grads), nb + 3, dtype=torch.float64, device=dev)
        for i, g in enumerate(grads):
            g = g.to(dev, torch.float32)
            sub = g[(g != 0) & (g.abs() < 2.0 ** (1 - _EXP_BIAS))].abs()
            if sub.numel():
                slot = (torch.frexp(sub)[1] - (1 + cfg.lo_exp)).clamp(-1, nb - 1) + 1
                fix[i, 0] -= sub.numel()
                fix[i] += torch.bincount(slot, minlength=nb + 3).double()
        return fix

    def read(self, named_params: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, dict]:
        """The ``layers`` payload (one host sync; two when a layer has inf/NaN gradients).

        The bin of a float32 is its exponent field: every chunk is copied into a flat float32
        buffer, its sign bits cleared, and one ``bincount`` of ``layer * 257 + field`` (+ 256 for
        an exact zero) counts every layer at once; a tiny matrix product then folds the fields
        into the configured bins. Norms and maxima are fused ``_foreach`` reductions over the
        same buffer. p50/p99 are read off the histogram (within their factor-2 bin, interpolated
        log-linearly): the bins are the point of the exercise, and an exact ``kthvalue`` per
        layer cost ten times more on a CPU."""
        names: list[str] = []
        grads: list[torch.Tensor] = []
        short = self._names
        for name, p in named_params:
            g = p.grad
            if g is None:
                continue
            layer = short.get(name)
            if layer is None:
                layer = short[name] = layer_name(name)
            names.append(layer)
            grads.append(g.detach())
        if not grads:
            return {}
        cfg = self.cfg
        nb = cfg.n_bins
        dev = grads[0].device
        lay = self._layout_for(grads, dev)
        n_layers = len(grads)
        fields: torch.Tensor | None = None
        piece_sq: list[torch.Tensor] = []
        piece_max: list[torch.Tensor] = []
        for chunk in lay.chunks:
            n = chunk.numel
            flat, keys = lay.flat[:n], lay.keys[:n]
            views = chunk.views
            if chunk.targets:
                torch._foreach_copy_(chunk.targets, [grads[i] for i, _, _ in chunk.pieces])
            else:
                i, s, e = chunk.pieces[0]
                flat.copy_(grads[i].reshape(-1)[s:e])
            piece_sq.extend(torch._foreach_norm(views))  # non-finite gradients give a non-finite norm, on purpose
            bits = flat.view(torch.int32)
            bits.bitwise_and_(_MAG)  # |g|: same norm, and the maxima below are of magnitudes
            piece_max.extend(torch._foreach_max(views))  # inf/NaN where a layer has them: fixed below
            torch.bitwise_right_shift(bits, 23, out=keys)
            torch._foreach_add_(chunk.keys, chunk.offsets)
            keys.add_(bits.clamp_(max=1))  # + 1 unless an exact zero; integer passes: a bool mask costs 3x
            at = chunk.first * _KEYS
            if fields is None and at == 0 and chunk.n_keys == lay.n_keys:  # one chunk holds every layer
                fields = torch.bincount(keys, minlength=chunk.n_keys)
                continue
            if fields is None:
                fields = torch.zeros(lay.n_keys, dtype=torch.int64, device=dev)
            fields[at : at + chunk.n_keys] += torch.bincount(keys, minlength=chunk.n_keys)
        if fields is None:  # every layer is empty
            fields = torch.zeros(lay.n_keys, dtype=torch.int64, device=dev)
        if lay.one_piece_per_layer:
            norm = torch.stack(piece_sq).double()
            mx = torch.stack(piece_max).double()
        else:
            norm = torch.zeros(n_layers, dtype=torch.float64, device=dev).index_add_(
                0, lay.piece_layer, torch.stack(piece_sq).double().square()).sqrt() if piece_sq else \
                torch.zeros(n_layers, dtype=torch.float64, device=dev)
            mx = torch.zeros(n_layers, dtype=torch.float64, device=dev)
            if piece_max:
                mx = mx.scatter_reduce_(0, lay.piece_layer, torch.stack(piece_max).double(), "amax")
        parts = [fields.reshape(n_layers, _KEYS).double(), norm[:, None], mx[:, None]]
        if cfg.lo_exp < 1 - _EXP_BIAS:  # bins reach into the subnormals: bin those exactly
            parts.append(self._subnormal_fix(grads, dev))
        # the one host sync; the rest is a few numpy operations on (layers x bins) numbers
        host = torch.cat(parts, dim=1).cpu().numpy()
        assert self._slots is not None
        table = host[:, :_KEYS] @ self._slots
        if cfg.lo_exp < 1 - _EXP_BIAS:
            table += host[:, _KEYS + 2 :]
        norms, maxima = host[:, _KEYS], host[:, _KEYS + 1]
        underflow = table[:, 0]
        counts = table[:, 1 : nb + 1]
        counts[:, 0] += underflow  # below the first edge is reported in bin 0 (and as underflow)
        zeros = table[:, nb + 1]
        nonfinite = table[:, nb + 2]
        numels = lay.numels
        pct = _percentiles(counts, zeros, lay.numels_f64, _QUANTILES, cfg.lo_exp)
        count_rows = counts.astype(np.int64).tolist()
        ints = np.stack([zeros, nonfinite], axis=1).astype(np.int64).tolist()
        with np.errstate(invalid="ignore"):  # a layer's max is NaN/inf until fixed below
            capped = np.fmin(pct, maxima[:, None])  # fmin: a NaN max leaves the percentile (fixed below)
        fraction = np.divide(underflow, lay.numels_f64, out=np.zeros_like(underflow), where=lay.numels_f64 > 0)
        floats = np.stack([capped[:, 0], capped[:, 1], maxima, norms, fraction], axis=1).tolist()
        out: dict[str, dict] = {}
        for i, (name, numel, counts_i, (zeros_i, nonfinite_i), row) in enumerate(
                zip(names, numels, count_rows, ints, floats, strict=True)):
            p50_i, p99_i, mx_i, norm_i, underflow_i = row
            if nonfinite_i:  # rare, and a second host sync: the largest finite magnitude
                mag = grads[i].to(torch.float32).view(torch.int32) & _MAG
                mx_i = float(torch.where(mag < (_INF_FIELD << 23), mag, 0).amax().view(torch.float32))
                p50_i, p99_i = min(float(pct[i, 0]), mx_i), min(float(pct[i, 1]), mx_i)
            out[name] = {"counts": counts_i, "zeros": zeros_i, "nonfinite": nonfinite_i, "p50": p50_i, "p99": p99_i,
                         "max": mx_i, "norm": norm_i, "underflow": underflow_i, "numel": numel}
        return out


def grad_histograms(named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg: HistConfig) -> dict[str, dict]:
    """The ``layers`` payload of a ``grad_hist`` event, by a one-off ``GradHistogram``."""
    return GradHistogram(cfg).read(named_params)
