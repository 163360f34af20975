"""The bundled trainer's re-run of a step (issue 22, part 1): the recovery kit's ``rerun_fn``.

When the guard skips or holds a step, the kit (agent/recovery/triage_run.py) re-executes it from
its pre-step state to tell bad data from a transient fault, a bad rank or the optimizer. Its
contract, ``rerun_fn(step, shard_rank, sync) -> (loss, local grad norm)``, is met here the way
``Trainer.train_step`` runs a step, so a re-run of a healthy step gives the step's own loss:

- the batch is rank ``shard_rank``'s shard of ``step``, rebuilt from the sampler (deterministic by
  step) on whichever rank runs it, with the content faults that fed it (``shard_batch``:
  trainer/fault_wrappers.py), so no batch moves between ranks;
- the kit has put the global RNGs back to the step's own start and zeroed the gradients first;
- gradient accumulation as in the step: the shard split into ``micro_batch`` micro-batches,
  each backward of ``loss / n``; the loss returned is their mean (the agent's per-rank loss);
- ``sync`` False: every backward under ``no_sync``, so the gradients stay this rank's own and the
  norm is local (what ``core/triage.py`` compares between ranks); ``sync`` True (a transient's
  retry, whose update is applied): the last backward all-reduces, as in the step;
- the fp16-style loss scaler: the backward is scaled as in the step, and the gradients are
  unscaled (a retry's in place, ready for ``optimizer.step``; a measurement's norm divided by
  the scale). A retry's own finiteness replaces the original backward's for the update
  (``finite_after_retry``), so a step whose first backward overflowed is applied once retried clean.

What a re-run costs: one forward/backward of the shard (``global_batch / world`` sequences) per
call, at most three calls per triaged step, and only on critical steps (``[agent.recovery]
triage_max_steps`` bounds how many).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

from cliffguard.trainer.data import Sampler
from cliffguard.trainer.loss_scale import AdaptiveLossScaler


class RerunHost(Protocol):
    """What a re-run needs from the bundled trainer (trainer/loop.py's ``Trainer``)."""

    accelerator: Any
    model: torch.nn.Module
    raw_model: torch.nn.Module
    sampler: Sampler
    scaler: AdaptiveLossScaler | None
    micro_batch: int

    def _autocast(self) -> contextlib.AbstractContextManager[Any]: ...


class StepRerun:
    """``rerun`` and ``sample_ids`` for the kit; ``finite_after_retry`` for the loop."""

    def __init__(self, host: RerunHost, comm: Any = None) -> None:
        self.host = host
        self.comm = comm
        """The agent's DDP comm timer (agent/collectors/timing.py), reset after a retry's all-reduce so
        the next step's exposed-communication time does not count it."""
        self._retry_finite: bool | None = None

    def sample_ids(self, step: int, shard: int) -> list[int]:
        """The sample ids of rank ``shard``'s share of ``step`` (the bad-batch list's entry)."""
        return list(self.host.sampler.sample_ids(step, rank=shard))

    def rerun(self, step: int, shard: int, sync: bool) -> tuple[torch.Tensor, float]:
        h = self.host
        device = h.accelerator.device
        x, y, _ = h.sampler.shard_batch(step, shard)
        xs, ys = x.to(device).split(h.micro_batch), y.to(device).split(h.micro_batch)
        n = len(xs)
        total = torch.zeros((), dtype=torch.float32, device=device)
        for i, (xb, yb) in enumerate(zip(xs, ys, strict=True)):
            reduce_now = sync and i == n - 1
            with contextlib.nullcontext() if reduce_now else h.accelerator.no_sync(h.model):
                with h._autocast():
                    _, loss = h.model(xb, yb)
                total += loss.detach().float()
                scaled = loss / n if h.scaler is None else h.scaler.scale_loss(loss / n)
                h.accelerator.backward(scaled)
        params = [p for p in h.raw_model.parameters() if p.grad is not None]
        if sync:
            if self.comm is not None:
                self.comm.reset()
            if h.scaler is not None:
                self._retry_finite = h.scaler.unscale_(params)
            return total / n, self._norm(params, 1.0)
        scale = h.scaler.scale if h.scaler is not None and h.scaler.cfg.enabled else 1.0
        return total / n, self._norm(params, scale)

    @staticmethod
    def _norm(params: list[torch.nn.Parameter], scale: float) -> float:
        if not params:
            return 0.0
        sq = torch.stack([p.grad.detach().float().pow(2).sum() for p in params]).sum()  # type: ignore[union-attr]
        return float(sq.sqrt()) / scale  # NaN or inf as it is: core/triage.py counts either as a carrier

    def finite_after_retry(self, finite: bool) -> bool:
        """The gradients' finiteness for the update: the retry's, when this step was retried under
        the loss scaler, else the step's own backward's (``finite``). Read once per step."""
        retried, self._retry_finite = self._retry_finite, None
        return finite if retried is None else retried
