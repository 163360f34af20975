"""The demo's scenario in torchtitan (agent/integrations/torchtitan.py): its debug Llama (2 layers, the
bundled corpus's 256 byte ids) with FSDP over the ranks, ``guarded(config, run=...)`` and torchtitan's
own loop, on the CPU path of trainer/demo_trainers/torchtitan_cpu.py. Always under torchrun: torchtitan
starts the gloo group from the launcher's environment; every rank trains on its share of the step's
global batch, as ``plain_run`` does, with the demo's LR schedule and faults.

``python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.demo_trainers.torchtitan_run
-- --run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.config import AgentConfig
from cliffguard.trainer.demo_trainers.common import (
    GLOBAL_BATCH,
    GRAD_CLIP,
    LR,
    RING,
    SEQ_LEN,
    VAL_BATCHES,
    DemoData,
    lr_multiplier,
    parse_args,
    progress,
)
from cliffguard.trainer.demo_trainers.plain_run import shard
from cliffguard.trainer.demo_trainers.torchtitan_cpu import TokenBatches, TokenTokenizer, on_cpu

VOCAB = 256
"""The bundled corpus is bytes (trainer/data.py)."""
LAYERS = 2
"""Of the debug Llama's 6 (dim 256): a step in about the bundled GPT's time on 2 shared cores."""


def _config(args: Any, data: DemoData, world: int, dump: str) -> Any:
    from torchtitan.components.loss import ChunkedLossWrapper
    from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
    from torchtitan.components.validate import Validator
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    @dataclass(kw_only=True, slots=True)
    class DemoSchedule(LRSchedulersContainer.Config):
        """The demo's warmup-cosine schedule times its LR blow-up faults (common.lr_multiplier)."""

        lr_lambda: Callable[[int], float] | None = None

        def build(self, *, optimizers: Any, training_steps: int) -> LRSchedulersContainer:
            assert self.lr_lambda is not None
            return LRSchedulersContainer(optimizers, self.lr_lambda)

    cfg = llama3_debugmodel()
    model = cfg.model_spec.model
    model.layers = model.layers[:LAYERS]
    model.vocab_size = model.tok_embeddings.num_embeddings = model.lm_head.out_features = VOCAB
    if isinstance(cfg.loss, ChunkedLossWrapper.Config):
        cfg.loss.loss_fn.global_vocab_size = VOCAB
    cfg.tokenizer = TokenTokenizer.Config(vocab_size=VOCAB)
    cfg.dataloader = TokenBatches.Config(batch_fn=lambda p, r, w: shard(data.batch(p), r, w), length=2 * args.steps)
    val = data.val_batches()
    cfg.validator = Validator.Config(enable=True, freq=10**9, steps=VAL_BATCHES, dataloader=TokenBatches.Config(
        batch_fn=lambda p, r, w: shard(val[p], r, w), length=len(val)))
    cfg.optimizer = default_adamw(lr=LR)  # AdamW, betas (0.9, 0.95), weight decay 0.1: as every demo trainer
    cfg.lr_scheduler = DemoSchedule(lr_lambda=lr_multiplier(args.steps, data.faults))
    t = cfg.training
    t.seq_len, t.local_batch_size, t.steps, t.max_norm = SEQ_LEN, GLOBAL_BATCH // world, args.steps, GRAD_CLIP
    t.disable_cuda_graphs = True
    cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.metrics.log_freq = 10**9  # the demo's own progress lines instead
    cfg.checkpoint.enable = False  # the memory ring (RING), as the other demo trainers
    cfg.dump_folder = dump
    return cfg


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args("torchtitan_run", argv)
    on_cpu()
    from cliffguard.agent.integrations.torchtitan import CliffguardTrainer, guarded

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])  # set by torchrun
    data = DemoData(args)
    torch.manual_seed(0)

    class DemoTrainer(CliffguardTrainer):
        def train_step(self, data_iterator: Any) -> None:
            super().train_step(data_iterator)
            d = self.agent.last
            if rank == 0 and d and self.agent.step % args.progress_every == 0:
                progress(self.agent.step, args.steps, d["loss"], d["lr"], d["lr_scale"])

    with tempfile.TemporaryDirectory(prefix="cliffguard-torchtitan-") as dump:
        cfg = guarded(_config(args, data, world, dump), run=args.run, agent=AgentConfig(run=args.run, recovery=RING))
        trainer = DemoTrainer(cfg)
        try:
            trainer.train()
        finally:
            trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()
    return 1 if trainer.kit.stop_reason.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
