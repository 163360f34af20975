"""A plain or Accelerate loop attached in five lines: the recovery kit's step calls behind three.

The kit's loop is six calls a step (``at_boundary``, ``remember``, ``after_forward``,
``after_backward``, ``before_optimizer_step``, ``after_step``; see docs/trainers.md), and their order
matters: the boundary before the batch is used, the guard between backward and ``optimizer.step()``.
``GuardedLoop`` keeps that order for a loop that has the usual shape, so the user writes::

    loop = guarded_loop(model, optimizer, scheduler, run="my-run", loss_fn=loss_fn)
    for batch in loop.batches(loader):              # commands at each boundary; ends on a stop
        step = loop.current_step                    # the step this batch runs (back after a rollback)
        loop.backward(loss_fn(batch), tokens=n)     # records the loss, backward, the DDP hook's time
        loop.step()                                 # the guard, optimizer.step(), zero_grad(), scheduler
    loop.close()

A loop of another shape (gradient accumulation, several optimizers) calls the kit directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

import torch

from cliffguard.agent.integrations.accelerate import accelerate_kit


class GuardedLoop:
    """One step of a guarded loop: ``batches`` → ``backward`` → ``step``, then ``close``."""

    def __init__(self, kit: Any, optimizer: torch.optim.Optimizer, scheduler: Any = None,
                 backward: Callable[[torch.Tensor], None] | None = None) -> None:
        self.kit = kit
        self.agent = kit.agent
        self.optimizer = optimizer
        self.scheduler = scheduler
        self._backward = backward or (lambda loss: loss.backward())
        self.current_step = self.agent.step
        """The step the batch ``batches`` just yielded runs (the kit's counter, from its boundary:
        after a rollback, the restored step). A loop with its own step counter takes it from here."""

    def batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The loader's batches (each fetch timed as data wait), each after the step boundary: the
        controller's commands applied, a pause or hold waited out, the batch kept for validation.
        Ends when the loader does or a command stops the run."""
        for batch in self.agent.wrap_loader(loader):
            boundary = self.kit.at_boundary()
            if not boundary:
                return
            self.current_step = boundary.step
            self.kit.remember(batch)
            yield batch

    def backward(self, loss: torch.Tensor, *, tokens: int = 0) -> None:
        """Record the micro-batch's loss and tokens, run the backward (Accelerate's when attached)."""
        self.agent.after_forward(loss, tokens=tokens)
        self._backward(loss)
        self.agent.after_backward()

    def step(self) -> bool:
        """The guard, then the update it allows; the gradients cleared and the schedule advanced
        either way. True when the update was applied."""
        applied = self.kit.before_optimizer_step()
        if applied:
            self.optimizer.step()
        self.optimizer.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        self.agent.after_step()
        return applied

    def close(self, error: BaseException | str | None = None) -> None:
        """``run.finished`` with the final loss (or ``run.failed`` with ``error``), then everything closed."""
        if error is None:
            self.agent.close(final_loss=self.agent.global_loss)
        else:
            self.agent.close(error)

    def __enter__(self) -> GuardedLoop:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(exc)


def guarded_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, *,
                 run: str, accelerator: Any = None, **kit_kwargs: Any) -> GuardedLoop:
    """The agent and the recovery kit for ``model``, started, behind a ``GuardedLoop``. Settings
    (Kafka, keys, ``[agent]``) come from ``CLIFFGUARD_CONFIG`` and the ``CLIFFGUARD_*`` environment
    like every process's; ``accelerator`` (prepared objects) makes the backward Accelerate's;
    ``kit_kwargs`` go to ``accelerate_kit`` and the kit (``loss_fn``, ``validate_fn``, ``config``,
    ``global_batch``: the samples per optimizer step over all ranks, for ``run.started``, ...)."""
    kit = accelerate_kit(accelerator, model, optimizer, scheduler, run=run, **kit_kwargs)
    return GuardedLoop(kit, optimizer, scheduler, accelerator.backward if accelerator is not None else None)
