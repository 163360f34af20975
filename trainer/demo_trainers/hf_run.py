"""The demo's scenario under the Hugging Face ``Trainer``: a GPT-2 built from a config (the bundled
model's size, nothing downloaded), cliffguard attached by ``agent.integrations.hf.CliffguardHFCallback``.

``python -m cliffguard.trainer.demo_trainers.hf_run --run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import sys
import tempfile
from typing import Any

import torch
import transformers

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.integrations.hf import CliffguardHFCallback
from cliffguard.trainer.demo_trainers.common import (
    GRAD_CLIP,
    LR,
    RING,
    SEQ_LEN,
    DemoArgs,
    DemoData,
    StepStream,
    lr_multiplier,
    parse_args,
    progress,
)
from cliffguard.trainer.model import GPTConfig

BUNDLED = GPTConfig(block_size=SEQ_LEN)
MODEL = transformers.GPT2Config(vocab_size=BUNDLED.vocab_size, n_positions=SEQ_LEN, n_embd=BUNDLED.n_embd,
                                n_layer=BUNDLED.n_layer, n_head=BUNDLED.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0)


def one_batch(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Each item is a whole step's batch (batch size 1 of batches). GPT-2 shifts the labels itself: the
    labels are the window x came from (x's first token, then y; a corrupted batch has both garbage)."""
    x, y = items[0]
    return {"input_ids": x, "labels": torch.cat([x[:, :1], y[:, :-1]], dim=1)}


class Progress(transformers.TrainerCallback):
    def __init__(self, cliffguard: CliffguardHFCallback, args: DemoArgs) -> None:
        self.cg, self.args = cliffguard, args

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        agent = self.cg.agent
        if agent is not None and agent.last and agent.step % self.args.progress_every == 0:
            d = agent.last
            progress(agent.step, self.args.steps, d["loss"], d["lr"], d["lr_scale"])
        return control


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    transformers.logging.set_verbosity_error()
    args = parse_args("hf_run", argv)
    data = DemoData(args)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)  # as trainer/loop.py
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(args.steps, data.faults))
    cliffguard = CliffguardHFCallback(AgentConfig(run=args.run, recovery=RING), seq_len=SEQ_LEN)
    with tempfile.TemporaryDirectory(prefix="cliffguard-hf-demo-") as out:
        targs = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=1, per_device_eval_batch_size=1,
            eval_strategy="no", save_strategy="no",  # the kit validates every [agent.recovery] val_every steps
            report_to=[], use_cpu=True,
            disable_tqdm=True, dataloader_num_workers=0, seed=args.seed, max_grad_norm=GRAD_CLIP,
            remove_unused_columns=False, logging_steps=args.steps)
        trainer = transformers.Trainer(model=model, args=targs, optimizers=(opt, sched), data_collator=one_batch,
                                       train_dataset=StepStream(data, 2 * args.steps),
                                       eval_dataset=list(data.val_batches()),
                                       callbacks=[cliffguard, Progress(cliffguard, args)])
        cliffguard.train(trainer)  # bound: validate runs evaluate(); an exception sends run.failed
    kit = cliffguard.kit
    return 1 if kit is not None and kit.stop_reason.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
