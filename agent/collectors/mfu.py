"""Model FLOPs utilisation: PaLM FLOPs per token over a peak FLOP/s that says where it came from.

FLOPs per token (PaLM, appendix B; nanoGPT's ``estimate_mfu``): ``6·N + 12·L·H·Q·T`` — 6N for the
forward and backward matmuls over the N parameters, 12·L·H·Q·T for attention over a context of T.

The peak is, in order of preference:

- ``config``: ``AgentConfig.peak_flops`` when the operator knows the number;
- ``table``: the dense bf16 peak of a known GPU, by CUDA device name (datasheet figures);
- ``calibration``: on anything else (CPUs here), the best FLOP/s of a few square matmuls timed on
  this device at start. That is the ceiling this process can actually reach with the threads it
  has, so an MFU near 1 means "as fast as a plain matmul", which is the honest meaning on a CPU.

``run.started`` carries ``peak_flops`` and ``peak_source``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Dense (no sparsity) bf16 tensor-core peaks per device, FLOP/s, from the vendors' datasheets.
PEAK_FLOPS_TABLE: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe part is 756e12 (matched first below)
    "H100 PCIE": 756e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "V100": 125e12,
    "T4": 65e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the PaLM formula needs to know about the model."""

    n_params: int
    n_layers: int
    n_heads: int
    head_dim: int
    seq_len: int

    def flops_per_token(self) -> float:
        return 6.0 * self.n_params + 12.0 * self.n_layers * self.n_heads * self.head_dim * self.seq_len

    @classmethod
    def infer(cls, model: torch.nn.Module, seq_len: int) -> ModelShape:
        """Duck-typed from ``model.config``: nanoGPT names (n_layer, n_head, n_embd) or Hugging
        Face names (num_hidden_layers, num_attention_heads, hidden_size)."""
        inner = getattr(model, "module", model)
        cfg = getattr(inner, "config", None) or getattr(inner, "cfg", None)
        if cfg is None:
            raise ValueError("model: no .config to read layers/heads/width from; pass a ModelShape")

        def pick(*names: str) -> int:
            for n in names:
                v = getattr(cfg, n, None)
                if v is not None:
                    return int(v)
            raise ValueError(f"model: config has none of {', '.join(names)}")

        layers = pick("n_layer", "num_hidden_layers", "n_layers")
        heads = pick("n_head", "num_attention_heads", "n_heads")
        width = pick("n_embd", "hidden_size", "d_model")
        n_params = sum(p.numel() for p in inner.parameters())
        return cls(n_params=n_params, n_layers=layers, n_heads=heads, head_dim=width // heads, seq_len=seq_len)


def table_peak(device: torch.device) -> float | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device).upper()
    # Longest key first so "H100 PCIE" wins over "H100".
    for key in sorted(PEAK_FLOPS_TABLE, key=len, reverse=True):
        if key in name:
            return PEAK_FLOPS_TABLE[key]
    return None


def calibrate_peak(device: torch.device, *, size: int = 512, seconds: float = 0.3, dtype: torch.dtype | None = None) -> float:
    """Best observed FLOP/s of ``size``×``size`` matmuls on ``device`` over about ``seconds``.

    The operands come from a generator of its own: drawing them from the global one would shift
    the training's random stream (its data order, dropout, init) by the agent's mere presence."""
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    flops = 2.0 * size**3
    reps = 4
    best = 0.0
    deadline = time.perf_counter() + seconds
    _ = a @ b  # warm-up (kernel selection, page faults)
    while True:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            c = a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            c.sum().item()
        dt = time.perf_counter() - t0
        best = max(best, flops * reps / dt)
        if time.perf_counter() > deadline:
            return best


def resolve_peak(device: torch.device, configured: float | None, calibration_s: float = 0.3) -> tuple[float, str]:
    """(peak FLOP/s per device, source): config, else table, else calibration."""
    if configured is not None:
        return float(configured), "config"
    peak = table_peak(device)
    if peak is not None:
        return peak, "table"
    return calibrate_peak(device, seconds=calibration_s), "calibration"


def mfu(tokens: int, flops_per_token: float, seconds: float, peak_flops: float) -> float:
    """Achieved model FLOP/s over the peak for one device (tokens processed by this device)."""
    if seconds <= 0 or peak_flops <= 0:
        return 0.0
    return tokens * flops_per_token / seconds / peak_flops
