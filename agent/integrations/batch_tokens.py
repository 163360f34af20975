"""The token ids of a training batch, as the integrations hand them to the data watch.

A batch from a user's loader has the user's shape; the data watch (agent/data_watch/) needs a
[B, T] tensor of integer ids. The shapes the libraries' own examples use are read here: the
tensor itself, a mapping with ``input_ids`` (and ``attention_mask``: the padding share), or a
list/tuple whose first element is one of those (``(inputs, targets)``). Anything else has no ids
the watch could read, and the caller says so once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def _ids(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor) and value.dim() == 2 and not value.is_floating_point() \
            and not value.is_complex() and value.dtype is not torch.bool:
        return value
    return None


def batch_tokens(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(input ids [B, T], attention mask or None)`` of ``batch``, or None where it holds none."""
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    if isinstance(first, Mapping):
        ids = _ids(first.get("input_ids"))
        mask = first.get("attention_mask")
        if ids is None:
            return None
        return ids, mask if isinstance(mask, torch.Tensor) and mask.shape == ids.shape else None
    ids = _ids(first)
    return None if ids is None else (ids, None)
