"""The demo's scenario on a DeepSpeed engine (agent/integrations/deepspeed.py): the bundled GPT under
ZeRO-2, ``attach(engine, ...)`` and DeepSpeed's own ``backward``/``step``. Always under torchrun:
every rank joins a gloo group first and trains on its share of the step's global batch, as
``plain_run`` does.

``python -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.demo_trainers.deepspeed_run
-- --run ID --steps 600 --fault corrupt@198 ...``
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist

from cliffguard.agent.config import AgentConfig
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
from cliffguard.trainer.demo_trainers.plain_run import MODEL, shard
from cliffguard.trainer.model import GPT


def _deepspeed_on_cpu() -> None:
    """The demo runs on CPU: gloo's collectives, not DeepSpeed's shared-memory all-reduce, whose
    first use JIT-builds it (about 4.5 minutes with g++ and ninja). ``__compatible_ops__`` is the
    dict DeepSpeed reads that choice from; marking the op incompatible skips the build."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args("deepspeed_run", argv)
    dist.init_process_group("gloo")  # always under torchrun (cliffguard demo starts it so, --nproc 1 too)
    world = dist.get_world_size()
    _deepspeed_on_cpu()
    import deepspeed

    from cliffguard.agent.integrations.deepspeed import attach

    rank = dist.get_rank()
    data = DemoData(args)
    torch.manual_seed(0)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)  # as plain_run
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(args.steps, data.faults))
    ds_config = {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // world, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True,
                 "gradient_clipping": GRAD_CLIP, "steps_per_print": 10**9}  # as every demo trainer
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config,
                                      dist_init_required=False)
    val = [shard(b, rank, world) for b in data.val_batches()]

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return engine(*batch)[1]

    guard = attach(engine, config=AgentConfig(run=args.run, recovery=RING), loss_fn=loss_fn, val_batches=val,
                   seq_len=SEQ_LEN)

    def stream() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for position in range(2 * args.steps):  # the loader goes on past a rolled-back window
            yield shard(data.batch(position), rank, world)

    error: BaseException | None = None
    try:
        for batch in guard.batches(stream()):
            if guard.step >= args.steps:
                break
            engine.backward(loss_fn(batch))
            engine.step()
            d = guard.agent.last
            if rank == 0 and d and guard.step % args.progress_every == 0:
                progress(guard.step, args.steps, d["loss"], d["lr"], d["lr_scale"])
    except BaseException as exc:
        error = exc
        raise
    finally:
        guard.close(error)
        dist.destroy_process_group()
    return 1 if guard.kit.stop_reason.startswith("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
