"""What the demo trainers share: their arguments, the bundled trainer's corpus and LR schedule with
the demo's faults applied, and the progress line the demo shows."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cliffguard.agent.recovery import KitConfig
from cliffguard.core.declared import bounded, check_declared
from cliffguard.trainer.data import Corpus, DataConfig, Sampler, load_corpus
from cliffguard.trainer.faults import FaultInjector
from cliffguard.trainer.schedule import WarmupCosine

SEQ_LEN = 64
GLOBAL_BATCH = 16
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 20
"""The bundled trainer's defaults (trainer/config.py), so the scenarios compare."""
GRAD_CLIP = 1.0
"""Every demo trainer clips the global gradient norm at 1.0, as nanoGPT, Llama and DeepSpeed's and
the HF Trainer's defaults do. Unclipped, the 2-rank run sits at the edge of stability at its peak
LR: on an AMD CI machine (other SIMD kernels, so other rounding) it spiked by itself at step 37 and
the smoke's corrupted stretch at 55 never came (CI timed out); its worst healthy excursion over
8 seeds was +21 % unclipped and +13 % clipped, and the final loss 2.9 against 2.6."""
VAL_BATCHES = 8
MAX_BYTES = 2_000_000
RING = KitConfig(ring_size=12, snapshot_every=10, val_every=50, val_max_share=0.0)
"""120 steps of memory snapshots: more than the controller's stable window (50 healthy steps make a
snapshot a rollback target), so a stable one is still in the ring when a spike needs it; a
validation every 50 steps, as the bundled trainer's, for the controller's baseline: asked for, so
kept whatever its share of the step time (measured ~5 % under the Hugging Face Trainer)."""


@dataclass(slots=True)
class DemoArgs:
    run: str
    steps: int = bounded(ge=1)
    faults: list[str] = field(default_factory=list)
    progress_every: int = bounded(20, ge=1)
    seed: int = 1234

    def __post_init__(self) -> None:
        check_declared(self)


def parse_args(prog: str, argv: list[str] | None = None) -> DemoArgs:
    p = argparse.ArgumentParser(prog=prog, description="a demo training run with cliffguard attached")
    p.add_argument("--run", required=True, help="run id")
    p.add_argument("--steps", type=int, default=600, help="optimizer steps")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC", help="as in `cliffguard train --fault`")
    p.add_argument("--progress-every", type=int, default=20, help="steps between progress lines")
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    return DemoArgs(run=a.run, steps=a.steps, faults=a.fault, progress_every=a.progress_every, seed=a.seed)


class DemoData:
    """The bundled trainer's corpus and sampler, one process; ``batch(position)`` applies the
    corrupt-batch faults by loader position (the position does not rewind on a rollback: the kit
    skips the bad window instead, and a spent fault window does not fire again)."""

    def __init__(self, args: DemoArgs) -> None:
        cfg = DataConfig(seq_len=SEQ_LEN, seed=args.seed, max_bytes=MAX_BYTES)
        self.corpus: Corpus = load_corpus(cfg)
        self.sampler = Sampler(self.corpus, cfg, GLOBAL_BATCH)
        self.faults = FaultInjector(args.faults, seed=args.seed)

    def batch(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _ = self.sampler.batch(position)
        return self.faults.corrupt_pair(position, x, y)  # as the bundled trainer corrupts (trainer/loop.py)

    def val_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.sampler.val_batches(VAL_BATCHES, GLOBAL_BATCH)


class StepStream(torch.utils.data.IterableDataset):
    """The batches of steps 0, 1, 2, ... in order (for a loader that would shuffle a map-style set)."""

    def __init__(self, data: DemoData, length: int) -> None:
        self.data, self.length = data, length

    def __iter__(self):
        return (self.data.batch(i) for i in range(self.length))


class StepDataset(torch.utils.data.Dataset):
    """Position i -> the (x, y) batch of step i (a loader over it uses batch_size=None)."""

    def __init__(self, data: DemoData, length: int) -> None:
        self.data, self.length = data, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(i)


def lr_multiplier(steps: int, faults: FaultInjector) -> Callable[[int], float]:
    """For ``LambdaLR`` on a base LR of ``LR``: the bundled warmup-cosine schedule times the LR
    blow-up faults (the scheduler's step is restored by a rollback, and a spent fault window does not
    fire again)."""
    schedule = WarmupCosine(LR, MIN_LR, WARMUP, steps)
    return lambda step: schedule.lr_at(step) / LR * faults.lr_factor(step)


def progress(step: int, steps: int, loss: float, lr: float, lr_scale: float) -> None:
    print(f"step {step:>5}/{steps}  loss {loss:.4f}  lr {lr:.2e}  lr_scale {lr_scale:g}", flush=True)
