"""The demo's scenario under PyTorch Lightning: the bundled GPT (built from its config) in a
LightningModule, cliffguard attached by ``agent.integrations.lightning.CliffguardLightningCallback``.

``python -m cliffguard.trainer.demo_trainers.lightning_run --run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytorch_lightning as pl
import torch

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.integrations.lightning import CliffguardLightningCallback
from cliffguard.trainer.demo_trainers.common import (
    GRAD_CLIP,
    LR,
    RING,
    SEQ_LEN,
    DemoArgs,
    DemoData,
    StepDataset,
    lr_multiplier,
    parse_args,
    progress,
)
from cliffguard.trainer.model import GPT, GPTConfig

MODEL = GPTConfig(block_size=SEQ_LEN)  # the bundled trainer's default model


class GPTModule(pl.LightningModule):
    def __init__(self, steps: int, data: DemoData) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = GPT(MODEL)
        self.steps, self.data = steps, data

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        _, loss = self.model(x, y)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)  # as trainer/loop.py
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(self.steps, self.data.faults))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Progress(pl.Callback):
    """Prints the demo's progress lines and ends the run when the agent's step (which a rollback
    moves back) reaches ``steps``."""

    def __init__(self, cliffguard: CliffguardLightningCallback, args: DemoArgs) -> None:
        self.cg, self.args = cliffguard, args

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        agent = self.cg.agent
        if agent is None or not agent.last:
            return
        if agent.step % self.args.progress_every == 0:
            d = agent.last
            progress(agent.step, self.args.steps, d["loss"], d["lr"], d["lr_scale"])
        if agent.step >= self.args.steps:
            trainer.should_stop = True


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args("lightning_run", argv)
    data = DemoData(args)
    module = GPTModule(args.steps, data)
    cliffguard = CliffguardLightningCallback(AgentConfig(run=args.run, recovery=RING), val_batches=data.val_batches(),
                                    shape=ModelShape.infer(module.model, SEQ_LEN))
    trainer = pl.Trainer(max_epochs=1, callbacks=[cliffguard, Progress(cliffguard, args)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, num_sanity_val_steps=0,
                         gradient_clip_val=GRAD_CLIP)
    # twice the steps of data: a rollback moves the step back, and the loader goes on past the bad window
    loader = torch.utils.data.DataLoader(StepDataset(data, 2 * args.steps), batch_size=None)
    trainer.fit(module, loader)
    kit = cliffguard.kit
    return 1 if kit is not None and kit.stop_reason.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
