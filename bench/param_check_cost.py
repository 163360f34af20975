"""What the SDC watch costs: one parameter hash (agent/param_check.py) against one training step.

    python -m bench.param_check_cost --json OUT.json [--sizes default,wide] [--device cpu|cuda] [--repeat 20]

Per GPT size (bench/model_sizes.py) on one process: the median seconds of ``param_hash`` over the
model's parameters (one integer reduction per tensor, no copy), the median seconds of a training
step (forward, backward, AdamW step) on the bundled trainer's global batch, and the share of the
step time the watch adds at the default period: ``hash_s / (every * step_s)``. ``gb_per_s`` is the
parameter bytes hashed per second. On a GPU the timings synchronise the device.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.model_sizes import SIZES, gpt_config
from cliffguard.agent.param_check import DEFAULT_EVERY, param_hash


def _median_s(fn: Any, repeat: int, device: torch.device) -> float:
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(size: str, device: torch.device, repeat: int, batch: int = 16) -> dict[str, Any]:
    from cliffguard.trainer.model import GPT

    torch.manual_seed(0)
    cfg = gpt_config(size)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), device=device)

    def step() -> None:
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (allocations, the optimizer's state)
    param_hash(params)
    step_s = _median_s(step, repeat, device)
    hash_s = _median_s(lambda: int(param_hash(params)), repeat, device)
    n_bytes = sum(p.numel() * p.element_size() for p in params)
    return {"size": size, "device": device.type, "params": sum(p.numel() for p in params), "tensors": len(params),
            "hash_ms": round(1e3 * hash_s, 3), "step_ms": round(1e3 * step_s, 3),
            "hash_over_step": round(hash_s / step_s, 4), "every": DEFAULT_EVERY,
            "share_at_default_every": round(hash_s / (DEFAULT_EVERY * step_s), 6),
            "gb_per_s": round(n_bytes / hash_s / 1e9, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.param_check_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False here")
    device = torch.device(args.device)
    rows = [measure(s, device, args.repeat) for s in args.sizes.split(",") if s]
    cols = ("size", "device", "params", "tensors", "hash_ms", "step_ms", "hash_over_step", "share_at_default_every",
            "gb_per_s")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    Path(args.json).write_text(json.dumps({"rows": rows, "threads": torch.get_num_threads()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
