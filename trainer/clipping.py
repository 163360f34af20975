"""Per-layer gradient clipping: each parameter tensor's gradient is clipped to its own norm limit.

A global-norm clip lets one exploding layer (an embedding row hit by a rare byte, the last
projection during a spike) shrink every other layer's update with it. Clipping per layer (here:
per named parameter tensor, the granularity the agent's per-layer grad norms use) confines the
damage to the layers that misbehave. The clip is applied without a host sync; the one sync reads
the count of clipped layers (and the norms, when asked for) together.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


@torch.no_grad()
def clip_per_layer_norms(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], max_norm: float, *, eps: float = 1e-6
) -> tuple[int, dict[str, float]]:
    """Scale each gradient whose L2 norm exceeds ``max_norm`` down to ``max_norm``; returns
    (layers clipped, pre-clip norm per layer).

    Non-finite norms are left for the loss scaler / guard to handle (they skip the step); their
    gradients are not touched here so the non-finite signal survives.
    """
    if max_norm <= 0:
        raise ValueError("max_norm: must be > 0")
    named = [(n, p.grad) for n, p in named_parameters if p.grad is not None]
    if not named:
        return 0, {}
    norms = torch.stack([torch.linalg.vector_norm(g.float()) for _, g in named])
    finite = torch.isfinite(norms)
    coef = torch.where(finite, (max_norm / (norms + eps)).clamp(max=1.0), torch.ones_like(norms))
    for (_, g), c in zip(named, coef, strict=True):
        g.mul_(c.to(g.dtype))
    over = (finite & (norms > max_norm)).sum()
    values = torch.cat([over.float().unsqueeze(0), norms]).tolist()  # the one host sync
    return int(values[0]), {n: v for (n, _), v in zip(named, values[1:], strict=True)}


def clip_per_layer(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], max_norm: float) -> int:
    """Per-layer clip (see ``clip_per_layer_norms``); returns how many layers were clipped."""
    return clip_per_layer_norms(named_parameters, max_norm)[0]
