"""The histogram reader on each device (testing/cuda.py), with a layer larger than that device's
chunk (``DEVICE_CHUNK_NUMEL``, 16M elements, on a GPU; ``CPU_CHUNK_NUMEL`` on a CPU), against a
numpy reference of the contract in agent/collectors/grad_hist.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cliffguard.agent.collectors.grad_hist import (
    CPU_CHUNK_NUMEL,
    DEVICE_CHUNK_NUMEL,
    GradHistogram,
    HistConfig,
)
from testing.cuda import DEVICES

SPECIALS = [0.0, -0.0, 1e-42, -3e-39, 2.0**-126, 2.0**-40, 2.0**-41, 1.0, -8.0]  # finite: zeros, subnormals, edges
NONFINITE = [float("inf"), float("-inf"), float("nan")]


def _grads(n: int, gen: torch.Generator, *, nonfinite: bool) -> torch.Tensor:
    """Normal values over 80 binades with the specials sprinkled in (inf/NaN too when asked)."""
    g = torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-60, 20, (n,), generator=gen).float())
    specials = torch.tensor(SPECIALS + (NONFINITE if nonfinite else []))
    where = torch.randint(0, n, (max(n // 8, 1),), generator=gen)
    g[where] = specials[torch.randint(0, len(specials), (len(where),), generator=gen)]
    return g


def _reference(g: torch.Tensor, cfg: HistConfig) -> dict:
    """One layer by the contract, in numpy: bin ``i`` holds finite non-zero |g| in
    [2**(lo_exp + i), 2**(lo_exp + i + 1)), the first and last bins take what lies beyond."""
    v = g.float().reshape(-1).numpy()
    finite = np.isfinite(v)
    mags = np.abs(v[finite & (v != 0)]).astype(np.float64)
    bins = np.clip(np.frexp(mags)[1] - 1 - cfg.lo_exp, 0, cfg.n_bins - 1)
    return {"counts": np.bincount(bins, minlength=cfg.n_bins).tolist(), "zeros": int((v == 0).sum()),
            "nonfinite": int((~finite).sum()), "numel": v.size, "max": float(mags.max()) if mags.size else 0.0,
            "underflow": float((mags < 2.0**cfg.lo_exp).sum()) / max(v.size, 1),
            "norm": float(g.double().norm())}


def _param(grad: torch.Tensor) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros_like(grad))
    p.grad = grad
    return p


@pytest.mark.parametrize("device", DEVICES)
def test_a_layer_past_the_devices_chunk_is_cut_and_every_layer_matches_the_reference(device):
    chunk = DEVICE_CHUNK_NUMEL if device == "cuda" else CPU_CHUNK_NUMEL
    cfg = HistConfig()
    gen = torch.Generator().manual_seed(3)
    reader = GradHistogram(cfg)
    for _ in range(2):  # the second read reuses the layout and the device buffers
        grads = {"a": _grads(1000, gen, nonfinite=True), "big": _grads(chunk + 3, gen, nonfinite=False),
                 "c": _grads(777, gen, nonfinite=True).reshape(7, 111), "bf": _grads(64, gen, nonfinite=False).bfloat16()}
        out = reader.read([(k, _param(g.to(device))) for k, g in grads.items()])
        assert reader._layout is not None
        # the big layer fills one chunk of the device's size and leaves 3 elements to the next
        assert [c.numel for c in reader._layout.chunks if c.pieces[0][0] == 1] == [chunk, 3]
        for name, g in grads.items():
            want, got = _reference(g, cfg), out[name]
            for key in ("counts", "zeros", "nonfinite", "numel", "max"):
                assert got[key] == want[key], (name, key)
            assert sum(got["counts"]) + got["zeros"] + got["nonfinite"] == got["numel"]
            assert got["underflow"] == pytest.approx(want["underflow"])
            if want["nonfinite"]:  # inf and NaN show in the norm, on purpose
                assert math.isnan(got["norm"]) or math.isinf(got["norm"]), name
            else:
                # a float32 norm over a 16M-element chunk is ~1e-4 off the float64 one (seen on a CPU)
                assert got["norm"] == pytest.approx(want["norm"], rel=1e-3), name
            assert 0.0 <= got["p50"] <= got["p99"] <= got["max"]
