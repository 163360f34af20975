"""Training stall per checkpoint: the async CheckpointManager vs a synchronous torch.save.

    python -m bench.checkpoint_stall --json OUT.json [--steps 10] [--repeats 15] [--sizes default,wide]
        [--device cpu|cuda]

One process, one torch thread (what each rank of the 2-process CPU run uses), real training
steps (forward, backward, AdamW) of the GPT on random bytes, on the CPU or (``--device cuda``) on
the first GPU, where each step ends with a device sync (the one a loop's loss read makes) and the
snapshot is a device-to-host copy into pinned memory. The checkpointed state is what the
bundled loop saves: model, optimizer, lr_scale, RNG states. Per model size, each round runs one
window of ``--steps`` steps per mode (order rotated each round), with one checkpoint in the middle
of the window, so every write has training steps after it to interfere with:

- ``none``: no checkpoint (the reference window);
- ``sync``: ``torch.save(state, path)`` on the training thread (the baseline);
- ``sync_fsync``: the same plus fsync (what a crash-safe synchronous save costs);
- ``async``: ``CheckpointManager.save(step, state, "full")`` as the bundled loop runs it (the
  default ``overlap_copy``, the optimizer fenced with ``fence_before``): the training thread walks
  the state and lays out a preallocated (recycled) flat CPU buffer; the copier thread copies into it
  while the next forward/backward runs, and the next ``optimizer.step`` waits for the copy if it is
  not done; the writer thread then runs the torch.distributed.checkpoint save + sha256 + layout
  check + rename + sidecar;
- ``async_inline``: the same without the overlap (``overlap_copy=False``): the whole copy on the
  training thread;
- ``dcp_default``: ``dcp.async_save(state, ...)`` with DCP's own ``DefaultStager`` (thread
  executor): the stock way, for comparison of the blocking time.

Per checkpoint, over rounds (one save per round and mode): ``block_ms`` (median; ``_mean``, ``_p95``)
= time the training thread is blocked by the save: inside the call plus, for ``async``, the wait in
the optimizer's fence (``CheckpointManager.fence_wait_s``);
``stall_ms`` = the window's time minus the same round's ``none`` window (paired, so load from
other processes on a shared machine mostly cancels): the blocking time plus any slowdown the
background copy and write cause to the following steps (CPU and GIL contention) — the training
stall including contention; floored at ``block_ms`` (a stall is never shorter than the block;
``paired_diff_ms`` keeps the raw median, which load noise can push below it);
``step_ratio_after`` = the mean time of the steps after the save (while the copy/write runs) / the
same steps of the round's ``none`` window (median over rounds): the slowdown per step from contention;
``writer_tail_ms`` = how long the writer was still busy after the window ended (not counted in
the stall; ``stall_upper_ms`` adds it: the stall if the loop had to wait for the writer).
``ratio_block`` (and ``_mean``, ``_p95``) = async block / the sync block's median (the goal: <= 0.1);
``ratio`` = async stall / sync stall (with contention; lower is better); ``ratio_inline_block`` = the
same for ``async_inline``; ``ratio_dcp_default_block`` = DCP default-stager block / sync block;
``block_parts`` splits the inline copy into the state walk (all the overlapped save blocks on, bar a
fence wait) and the one ``_foreach_copy_`` (memory bandwidth: the floor of any copy on the training
thread, ``ratio_copy_floor``). The block is the stall on an idle machine (a GPU host's copier and
writer run on otherwise idle cores); the stall includes the CPU contention on this shared CPU.
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

from bench.model_sizes import SIZES, gpt_config
from cliffguard.trainer.checkpoint import CheckpointConfig, CheckpointManager
from cliffguard.trainer.model import GPT, GPTConfig


def _state(model: GPT, opt: torch.optim.Optimizer) -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if next(model.parameters()).is_cuda:  # as trainer/loop.py saves it
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "lr_scale": 1.0, "rng": rng}


class _DcpDefault:
    """``dcp.async_save`` with its default stager, behind the manager's save/wait/close."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.future: Any = None

    def save(self, tag: int, state: dict[str, Any], _kind: str) -> None:
        import torch.distributed.checkpoint as dcp

        self.wait()
        path = self.root / f"full-{tag % 3}"
        self.future = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None

    def close(self) -> None:
        self.wait()


class _Bench:
    """One model and optimizer per size, trained on through every window (warm allocator, warm
    writer process), so a window costs only its steps."""

    def __init__(self, cfg: GPTConfig, batch: int, root: Path, device: torch.device) -> None:
        torch.manual_seed(0)
        self.model = GPT(cfg).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randint(0, 256, (batch, cfg.block_size)).to(device)
        self.cuda = device.type == "cuda"
        self.root = root
        (root / "dcp_default").mkdir(parents=True)
        self.mgrs: dict[str, Any] = {
            "async": CheckpointManager(CheckpointConfig(dir=str(root / "async"), keep_full=2)),
            "async_inline": CheckpointManager(CheckpointConfig(dir=str(root / "async_inline"), keep_full=2,
                                                               overlap_copy=False)),
            "dcp_default": _DcpDefault(root / "dcp_default"),
        }
        self.mgrs["async"].fence_before(self.opt)  # as trainer/loop.py does
        for mgr in self.mgrs.values():  # warm-up: the first save allocates the staging buffers
            mgr.save(0, _state(self.model, self.opt), "full")
            mgr.wait()
        for _ in range(2):
            self.step()

    def step(self) -> None:
        _, loss = self.model(self.x, self.x)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.cuda:  # a step's time is its kernels', not their launch (a loop syncs on its loss read)
            torch.cuda.synchronize()

    def window(self, mode: str, steps: int, tag: int) -> tuple[float, float, float, int, list[float]]:
        """(run seconds, seconds the training thread was blocked by the checkpoint, writer tail
        seconds, file bytes, each step's seconds)."""
        block = tail = 0.0
        nbytes = 0
        mgr = self.mgrs.get(mode)
        fenced0 = getattr(mgr, "fence_wait_s", 0.0)
        step_s = []
        t_start = time.perf_counter()
        for i in range(steps):
            t_step = time.perf_counter()
            self.step()
            step_s.append(time.perf_counter() - t_step)
            if mode != "none" and i == steps // 2:
                t0 = time.perf_counter()
                if mgr is not None:
                    mgr.save(tag, _state(self.model, self.opt), "full")
                else:
                    path = self.root / f"{mode}-{tag % 3}.pt"
                    if mode == "sync":
                        torch.save(_state(self.model, self.opt), path)
                    else:
                        with path.open("wb") as fh:
                            torch.save(_state(self.model, self.opt), fh)
                            fh.flush()
                            os.fsync(fh.fileno())
                    nbytes = path.stat().st_size
                block = time.perf_counter() - t0
        elapsed = time.perf_counter() - t_start
        block += getattr(mgr, "fence_wait_s", 0.0) - fenced0  # the next optimizer step's wait for the copy
        if mgr is not None:
            t0 = time.perf_counter()
            mgr.wait()  # the write still running after the window: reported, not counted
            tail = time.perf_counter() - t0
            nbytes = max(sum(f.stat().st_size for f in d.iterdir())
                         for d in mgr.root.glob("full-*") if d.is_dir() and not d.name.endswith(".tmp"))
        return elapsed, block, tail, nbytes, step_s

    def close(self) -> None:
        for mgr in self.mgrs.values():
            mgr.close()


def block_parts(state_fn, repeats: int = 9) -> dict[str, float]:
    """Where the async save's blocking time goes (medians, ms): ``flatten_ms`` the whole copy into a
    warm recycled buffer (what ``CheckpointManager.save`` blocks on, less the enqueue),
    ``walk_ms`` collecting the state's tensors and laying out the buffer (``flatten(copy=False)``),
    ``copy_ms`` the one ``_foreach_copy_`` (``fill``: memory bandwidth, the floor of any copy on
    the training thread)."""
    from cliffguard.trainer.checkpoint_io import fill, flatten

    spare = flatten(state_fn())
    parts: dict[str, list[float]] = {"flatten_ms": [], "walk_ms": [], "copy_ms": []}
    for _ in range(repeats):
        state = state_fn()
        t0 = time.perf_counter()
        spare = flatten(state, spare)
        t1 = time.perf_counter()
        spare = flatten(state, spare, copy=False)
        t2 = time.perf_counter()
        fill(spare)
        t3 = time.perf_counter()
        for key, dt in (("flatten_ms", t1 - t0), ("walk_ms", t2 - t1), ("copy_ms", t3 - t2)):
            parts[key].append(dt * 1000)
    return {k: statistics.median(v) for k, v in parts.items()}


def _p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[-1] if len(xs) > 1 else xs[0]


def bench_size(name: str, cfg: GPTConfig, steps: int, batch: int, repeats: int,
               device: str | torch.device = "cpu") -> dict[str, Any]:
    modes = ["none", "sync", "sync_fsync", "async", "async_inline", "dcp_default"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    blocks: dict[str, list[float]] = {m: [] for m in modes}
    tails: dict[str, list[float]] = {m: [] for m in modes}
    step_s: dict[str, list[list[float]]] = {m: [] for m in modes}
    nbytes = 0
    with tempfile.TemporaryDirectory() as tmp:
        bench = _Bench(cfg, batch, Path(tmp), torch.device(device))
        try:
            for r in range(repeats):
                order = modes[r % len(modes):] + modes[: r % len(modes)]  # rotate: no mode always first
                for mode in order:
                    elapsed, block, tail, nb, per_step = bench.window(mode, steps, tag=r + 1)
                    times[mode].append(elapsed)
                    blocks[mode].append(block)
                    tails[mode].append(tail)
                    step_s[mode].append(per_step)
                    nbytes = max(nbytes, nb)
                if (r + 1) % 5 == 0 or r + 1 == repeats:
                    print(f"  [{name}] {r + 1}/{repeats} rounds", flush=True)
            parts = block_parts(lambda: _state(bench.model, bench.opt))
        finally:
            bench.close()
    res: dict[str, Any] = {
        "n_params": GPT(cfg).num_params(),
        "checkpoint_bytes": nbytes,
        "step_ms": statistics.median(times["none"]) / steps * 1000,
        "loadavg": os.getloadavg(),
    }
    after = slice(steps // 2 + 1, steps)  # the steps that run while the copy and the write do
    for mode in modes[1:]:
        paired = [t - n for t, n in zip(times[mode], times["none"], strict=True)]
        res[f"{mode}_block_ms"] = statistics.median(blocks[mode]) * 1000
        res[f"{mode}_block_mean_ms"] = statistics.mean(blocks[mode]) * 1000
        res[f"{mode}_block_p95_ms"] = _p95(blocks[mode]) * 1000
        res[f"{mode}_paired_diff_ms"] = statistics.median(paired) * 1000
        # A stall is never shorter than the time blocked in the call; a paired difference below
        # that is load noise from other processes, so the block time is the floor.
        res[f"{mode}_stall_ms"] = max(res[f"{mode}_paired_diff_ms"], res[f"{mode}_block_ms"])
        res[f"{mode}_writer_tail_ms"] = statistics.median(tails[mode]) * 1000
        # Upper bound: as if the loop had to wait for the writer to finish before going on.
        res[f"{mode}_stall_upper_ms"] = statistics.median(
            [p + t for p, t in zip(paired, tails[mode], strict=True)]) * 1000
        res[f"{mode}_stall_upper_ms"] = max(res[f"{mode}_stall_upper_ms"], res[f"{mode}_stall_ms"])
        res[f"{mode}_step_ratio_after"] = statistics.median(
            [statistics.mean(m[after]) / statistics.mean(n[after])
             for m, n in zip(step_s[mode], step_s["none"], strict=True)])
    sync, sync_block = res["sync_stall_ms"], res["sync_block_ms"]
    res["ratio"] = res["async_stall_ms"] / sync if sync > 0 else None
    for stat in ("", "_mean", "_p95"):
        res[f"ratio_block{stat}"] = res[f"async_block{stat}_ms"] / sync_block
    res["ratio_inline_block"] = res["async_inline_block_ms"] / sync_block
    res["ratio_inline"] = res["async_inline_stall_ms"] / sync if sync > 0 else None
    res["ratio_dcp_default_block"] = res["dcp_default_block_ms"] / sync_block
    res["ratio_upper"] = res["async_stall_upper_ms"] / sync if sync > 0 else None
    res["block_parts"] = parts
    res["ratio_copy_floor"] = parts["copy_ms"] / sync_block
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps per window, one checkpoint mid-window (default 10)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    ap.add_argument("--repeats", type=int, default=15, help="rounds of one window per mode (default 15)")
    ap.add_argument("--sizes", default="default,wide", help=f"model sizes to run, from {sorted(SIZES)}")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model trains (default cpu)")
    ap.add_argument("--json", dest="json_path", help="write the figures here")
    args = ap.parse_args(argv)
    if args.steps < 3:  # the steps after the mid-window save are what step_ratio_after compares
        ap.error("--steps must be >= 3")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch.cuda.is_available() is False (no GPU, or a CPU build of torch)")
    device = torch.device(args.device)
    torch.set_num_threads(1)
    out: dict[str, Any] = {"steps_per_window": args.steps, "batch": args.batch, "repeats": args.repeats,
                           "device": args.device,
                           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                           "sizes": {}}
    for name in args.sizes.split(","):
        if name not in SIZES:
            ap.error(f"--sizes: unknown size {name!r}")
        cfg = gpt_config(name)
        print(f"[{name}] {cfg} on {out['device_name']}", flush=True)
        out["sizes"][name] = bench_size(name, cfg, args.steps, args.batch, args.repeats, device)
    first = next(iter(out["sizes"].values()))
    out["ratio"] = first["ratio"]
    out["ratio_block"] = first["ratio_block"]
    out["block_ratio_ok"] = all(max(r["ratio_block_mean"], r["ratio_block"]) <= 0.1 for r in out["sizes"].values())
    out["block_ratio_p95_ok"] = all(r["ratio_block_p95"] <= 0.1 for r in out["sizes"].values())

    print("\nper checkpoint, over rounds (ms): block = the training thread blocked by the save (median, mean, p95);"
          " stall = window time minus the same round's no-checkpoint window (median); tail = writer busy after it;"
          " steps after = a step while the copy/write runs / a normal step")
    head = (f"  {'size':<8} {'params':>10} {'ckpt MB':>8} {'step ms':>8} {'mode':<13} {'block':>8} {'mean':>8}"
            f" {'p95':>8} {'stall':>8} {'tail':>8} {'steps after':>11}")
    print(head)
    for name, r in out["sizes"].items():
        for i, mode in enumerate(("sync", "sync_fsync", "async", "async_inline", "dcp_default")):
            lead = (f"  {name:<8} {r['n_params']:>10,} {r['checkpoint_bytes'] / 1e6:>8.1f} {r['step_ms']:>8.1f}"
                    if i == 0 else f"  {'':<8} {'':>10} {'':>8} {'':>8}")
            print(f"{lead} {mode:<13} {r[f'{mode}_block_ms']:>8.2f} {r[f'{mode}_block_mean_ms']:>8.2f}"
                  f" {r[f'{mode}_block_p95_ms']:>8.2f} {r[f'{mode}_stall_ms']:>8.2f}"
                  f" {r.get(f'{mode}_writer_tail_ms', 0.0):>8.2f} {r[f'{mode}_step_ratio_after']:>10.2f}x")
        stall = "n/a (sync stall lost in noise)" if r["ratio"] is None else f"{r['ratio']:.3f}"
        upper = "n/a" if r["ratio_upper"] is None else f"{r['ratio_upper']:.3f}"
        inline = "n/a" if r["ratio_inline"] is None else f"{r['ratio_inline']:.3f}"
        print(f"  {'':<8} ratio async/sync block: median {r['ratio_block']:.3f}, mean {r['ratio_block_mean']:.3f}, "
              f"p95 {r['ratio_block_p95']:.3f} (goal <= 0.1; inline copy {r['ratio_inline_block']:.3f}, DCP default "
              f"stager {r['ratio_dcp_default_block']:.3f})")
        print(f"  {'':<8} with CPU contention: stall {stall} (inline copy {inline}), stall+tail {upper}; steps during "
              f"the background copy/write {r['async_step_ratio_after']:.2f}x a normal step; loadavg "
              f"{' '.join(f'{x:.2f}' for x in r['loadavg'])}")
        bp = r["block_parts"]
        print(f"  {'':<8} block parts: flatten {bp['flatten_ms']:.2f} ms = walk and layout {bp['walk_ms']:.2f} + copy "
              f"{bp['copy_ms']:.2f}; the copy alone is {r['ratio_copy_floor']:.3f} x sync")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
