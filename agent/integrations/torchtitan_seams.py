"""What the torchtitan integration reads from torchtitan's loop without changing it
(agent/integrations/torchtitan.py): values torchtitan computes and keeps to itself.

Each is read for the length of one call by wrapping the function torchtitan calls there, and put
back after it, so nothing outside that call sees the wrapper.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def grad_norms(seen: list[torch.Tensor]) -> Iterator[None]:
    """Record what torchtitan's ``clip_grad_norm_`` returns during one ``train_step``: the global norm
    before clipping, which its ``train_step`` keeps to itself until a log step."""
    import torchtitan.distributed.utils as dist_utils

    inner = dist_utils.clip_grad_norm_

    def clip(*args: Any, **kwargs: Any) -> torch.Tensor:
        norm = inner(*args, **kwargs)
        seen.append(norm.detach())
        return norm

    dist_utils.clip_grad_norm_ = clip  # trainer.py calls it through the module: dist_utils.clip_grad_norm_
    try:
        yield
    finally:
        dist_utils.clip_grad_norm_ = inner


def validator_loss(validator: Any, metrics: Any, model_parts: list[torch.nn.Module], step: int) -> float:
    """One run of torchtitan's validator (every rank: its forward is collective), its loss read from
    what it logs (``validate`` returns nothing)."""
    seen: list[float] = []
    inner = metrics.log_validation

    def log_validation(loss: float, step: int) -> None:
        seen.append(float(loss))
        inner(loss=loss, step=step)

    metrics.log_validation = log_validation
    try:
        validator.validate(model_parts, step)
    finally:
        metrics.log_validation = inner
    if not seen:
        raise RuntimeError("torchtitan's validator logged no loss")
    return seen[-1]
