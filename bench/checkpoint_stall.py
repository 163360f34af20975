"""Training stall per checkpoint: the async CheckpointManager vs a synchronous torch.save.

    python -m bench.checkpoint_stall --json OUT.json [--steps 40] [--every 10] [--repeats 3]

One process, one torch thread (what each rank of the 2-process CPU run uses), real training
steps (forward, backward, AdamW) of the GPT on random bytes. The checkpointed state is what the
bundled loop saves: model, optimizer, lr_scale, RNG states. Per model size, three modes run
``--steps`` steps each, interleaved ``--repeats`` times so drift on this shared machine hits all
modes alike, checkpointing at steps ``every/2, every/2 + every, ...`` (so every write has training
steps after it to interfere with):

- ``none``: no checkpoints (the reference run time);
- ``sync``: ``torch.save(state, path)`` on the training thread (the baseline);
- ``sync_fsync``: the same plus fsync (what a crash-safe synchronous save costs);
- ``async``: ``CheckpointManager.save(step, state, "full")`` with the default writer process: a copy
  into a recycled flat CPU buffer on the training thread, then serialise + sha256 + fsync +
  rename + verify-by-loading in a low-priority child process;
- ``async_thread``: the same with ``writer="thread"`` (the writer shares the GIL with training).

Figures per checkpoint: ``block_ms`` = time the training thread spends inside the checkpoint call;
``stall_ms`` = (run time − the ``none`` run time) / checkpoints, i.e. the blocking time plus any
slowdown the background writer causes to the steps around it (CPU and GIL contention) — the
training stall. Run times are the best of the repeats (as ``timeit``: load from other processes on
a shared machine only ever adds time); block times are medians. ``ratio`` = async stall / sync stall (lower is better);
``ratio_block`` = async block / sync block.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint import CheckpointConfig, CheckpointManager
from trainer.model import GPT, GPTConfig

SIZES: dict[str, GPTConfig] = {
    "default": GPTConfig(),
    "wide": GPTConfig(n_layer=6, n_head=6, n_embd=384),
}


def _state(model: GPT, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "lr_scale": 1.0,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }


def _run(mode: str, cfg: GPTConfig, steps: int, every: int, batch: int, root: Path) -> tuple[float, list[float], int]:
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (batch, cfg.block_size))
    out = root / mode
    out.mkdir(parents=True, exist_ok=True)
    mgr = None
    if mode.startswith("async"):
        writer = "thread" if mode == "async_thread" else "process"
        mgr = CheckpointManager(CheckpointConfig(dir=str(out), keep_full=2, writer=writer))
        mgr.save(-1, _state(model, opt), "full")  # warm-up: the writer process imports torch
        mgr.wait()
    for _ in range(2):  # warm-up: allocator, optimizer state
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    blocks: list[float] = []
    nbytes = 0
    t_start = time.perf_counter()
    for step in range(steps):
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if mode != "none" and step % every == every // 2:
            t0 = time.perf_counter()
            if mgr is not None:
                mgr.save(step, _state(model, opt), "full")
            else:
                path = out / f"ckpt-{step}.pt"
                if mode == "sync":
                    torch.save(_state(model, opt), path)
                else:
                    with path.open("wb") as fh:
                        torch.save(_state(model, opt), fh)
                        fh.flush()
                        os.fsync(fh.fileno())
                nbytes = path.stat().st_size
            blocks.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t_start
    if mgr is not None:
        mgr.wait()  # not timed: the writer finishing after the last step is not a training stall
        done = sorted(mgr.root.glob("full-*.pt"))
        nbytes = done[-1].stat().st_size if done else 0
        mgr.close()
    return elapsed, blocks, nbytes


def bench_size(name: str, cfg: GPTConfig, steps: int, every: int, batch: int, repeats: int) -> dict[str, Any]:
    modes = ["none", "sync", "sync_fsync", "async", "async_thread"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    nbytes = 0
    n_ckpt = len([s for s in range(steps) if s % every == every // 2])
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                elapsed, b, nb = _run(mode, cfg, steps, every, batch, Path(tmp) / f"r{r}")
                times[mode].append(elapsed)
                blocks[mode].extend(b)
                nbytes = max(nbytes, nb)
            print(f"  [{name}] repeat {r + 1}/{repeats}: "
                  + ", ".join(f"{m} {times[m][-1]:.2f}s" for m in modes), flush=True)
    base = min(times["none"])
    res: dict[str, Any] = {
        "n_params": GPT(cfg).num_params(),
        "checkpoint_bytes": nbytes,
        "checkpoints_per_run": n_ckpt,
        "step_ms": base / steps * 1000,
    }
    for mode in modes[1:]:
        res[f"{mode}_block_ms"] = statistics.median(blocks[mode]) * 1000
        res[f"{mode}_stall_ms"] = (min(times[mode]) - base) / n_ckpt * 1000
    res["ratio"] = res["async_stall_ms"] / res["sync_stall_ms"] if res["sync_stall_ms"] > 0 else None
    res["ratio_block"] = res["async_block_ms"] / res["sync_block_ms"]
    res["ratio_thread_writer"] = (res["async_thread_stall_ms"] / res["sync_stall_ms"]
                                  if res["sync_stall_ms"] > 0 else None)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    ap.add_argument("--every", type=int, default=10, help="steps between checkpoints (default 10)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats per mode (default 3)")
    ap.add_argument("--sizes", default="default,wide", help=f"model sizes to run, from {sorted(SIZES)}")
    ap.add_argument("--json", dest="json_path", help="write the figures here")
    args = ap.parse_args(argv)
    if args.every < 2 or args.steps < args.every:
        ap.error("--every must be >= 2 and --steps >= --every")
    torch.set_num_threads(1)
    out: dict[str, Any] = {"steps": args.steps, "every": args.every, "batch": args.batch,
                           "repeats": args.repeats, "sizes": {}}
    for name in args.sizes.split(","):
        if name not in SIZES:
            ap.error(f"--sizes: unknown size {name!r}")
        print(f"[{name}] {SIZES[name]}", flush=True)
        out["sizes"][name] = bench_size(name, SIZES[name], args.steps, args.every, args.batch, args.repeats)
    first = next(iter(out["sizes"].values()))
    out["ratio"] = first["ratio"]
    out["ratio_block"] = first["ratio_block"]

    print("\ncheckpoint stall per checkpoint (ms; block = median in the call, stall = extra best-of run time / checkpoints)")
    head = f"  {'size':<8} {'params':>10} {'ckpt MB':>8} {'step ms':>8} {'mode':<11} {'block ms':>9} {'stall ms':>9}"
    print(head)
    for name, r in out["sizes"].items():
        for i, mode in enumerate(("sync", "sync_fsync", "async", "async_thread")):
            lead = (f"  {name:<8} {r['n_params']:>10,} {r['checkpoint_bytes'] / 1e6:>8.1f} {r['step_ms']:>8.1f}"
                    if i == 0 else f"  {'':<8} {'':>10} {'':>8} {'':>8}")
            print(f"{lead} {mode:<11} {r[f'{mode}_block_ms']:>9.2f} {r[f'{mode}_stall_ms']:>9.2f}")
        stall = "n/a (sync stall lost in noise)" if r["ratio"] is None else f"{r['ratio']:.3f}"
        print(f"  {'':<8} ratio async/sync: stall {stall}, block {r['ratio_block']:.3f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
