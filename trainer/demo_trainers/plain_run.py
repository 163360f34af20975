"""The demo's scenario in a plain PyTorch loop on the recovery kit (agent/recovery/kit.py): the
bundled GPT, the README's loop shape, ``RecoveryKit`` + ``Agent`` and nothing else. Under torchrun
(``WORLD_SIZE`` > 1) every rank joins a gloo group, the model is wrapped in DDP and each rank trains
on its share of the step's global batch, as the bundled trainer does.

``python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.demo_trainers.plain_run
--run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import os
import sys

import torch
import torch.distributed as dist

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.integrations.settings import agent_wiring
from cliffguard.agent.recovery import RecoveryKit
from cliffguard.trainer.demo_trainers.common import (
    GLOBAL_BATCH,
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


def shard(batch: tuple[torch.Tensor, torch.Tensor], rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of a global batch (rank r takes rows r, r + world, ...)."""
    x, y = batch
    return x[rank::world], y[rank::world]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args("plain_run", argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    data = DemoData(args)
    torch.manual_seed(0)
    model = GPT(MODEL)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)  # as trainer/loop.py
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(args.steps, data.faults))
    val = [shard(b, rank, world) for b in data.val_batches()]

    @torch.no_grad()
    def validate(batches: int | None) -> tuple[float, int]:
        use = val[:batches] if batches else val
        total = torch.zeros(2, dtype=torch.float64)
        model.eval()
        try:
            for x, y in use:
                total += torch.tensor([float(model(x, y)[1]), 1.0], dtype=torch.float64)
        finally:
            model.train()
        if world > 1:
            dist.all_reduce(total)
        return float(total[0] / total[1]), len(use)

    config, wiring = agent_wiring(args.run, AgentConfig(run=args.run, recovery=RING))
    agent = Agent(None, model, optimizer, config, seq_len=SEQ_LEN, **wiring)
    kit = RecoveryKit(agent, model, optimizer, scheduler, validate_fn=validate)
    kit.start(global_batch=GLOBAL_BATCH, config={"integration": "plain", "world": world})
    position = 0  # the loader goes on past a rolled-back window (it does not rewind)
    error: BaseException | None = None
    try:
        while agent.step < args.steps and position < 2 * args.steps and kit.at_boundary():
            x, y = shard(data.batch(position), rank, world)
            position += 1
            lr = optimizer.param_groups[0]["lr"]
            _, loss = net(x, y)
            agent.after_forward(loss, tokens=x.numel())
            loss.backward()
            agent.after_backward()  # the norm the agent reports is the unclipped one
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            if kit.before_optimizer_step():  # False: skipped on every rank
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step = agent.step
            d = agent.after_step(lr=lr * kit.lr_scale_applied)
            if rank == 0 and d and (step + 1) % args.progress_every == 0:
                progress(step + 1, args.steps, d["loss"], d["lr"], d["lr_scale"])
    except BaseException as exc:
        error = exc
        raise
    finally:
        failed = kit.stop_reason if kit.stop_reason.startswith("failed") else None
        agent.close(error or failed, final_loss=None if error else (agent.last or {}).get("loss"))
        if world > 1:
            dist.destroy_process_group()
    return 1 if kit.stop_reason.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
