"""The demo's scenario in an Accelerate loop watched by the report-only ``AgentTracker``
(agent/integrations/accelerate.py): the bundled GPT, ``accelerator.log`` every step, no recovery kit.
The run declares no command, so the controller must alert on the faults and send nothing; the
faults' damage stays (nothing here can skip an update or roll back).

``python -m cliffguard.trainer.demo_trainers.accelerate_tracker_run --run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import sys

import torch
from accelerate import Accelerator

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.accelerate import AgentTracker
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.trainer.demo_trainers.common import (
    GRAD_CLIP,
    LR,
    RING,
    SEQ_LEN,
    DemoData,
    lr_multiplier,
    parse_args,
    progress,
)
from cliffguard.trainer.model import GPT, GPTConfig

MODEL = GPTConfig(block_size=SEQ_LEN)  # the bundled trainer's default model


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args("accelerate_tracker_run", argv)
    data = DemoData(args)
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)  # as trainer/loop.py
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(args.steps, data.faults))
    config, wiring = agent_wiring(args.run, AgentConfig(run=args.run, recovery=RING))
    tracker = AgentTracker(lambda: Agent(accelerator, model, optimizer, config, seq_len=SEQ_LEN, **wiring))
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.init_trackers(args.run, config={"integration": "accelerate-tracker", "max_steps": args.steps})
    try:
        for step in range(args.steps):
            x, y = data.batch(step)
            lr = optimizer.param_groups[0]["lr"]
            _, loss = model(x, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()  # report-only: every update is applied, good or bad
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            value = float(loss.detach())
            accelerator.log({"loss": value, "lr": lr, "tokens": x.numel()}, step=step)
            if (step + 1) % args.progress_every == 0:
                progress(step + 1, args.steps, value, lr, 1.0)
    finally:
        accelerator.end_training()  # the tracker's finish(): run.finished
    return 0


if __name__ == "__main__":
    sys.exit(main())
