"""Per-device memory of one layout, on the busiest device: the first pipeline stage.

Model states follow ZeRO (Rajbhandari et al. 2020) for mixed-precision Adam: 16 bytes per
parameter, 2Φ fp16 weights + 2Φ fp16 gradients + 12Φ fp32 master weights, momentum and variance;
ZeRO stage 1 shards the 12Φ over the data-parallel group, stage 2 also the gradients, stage 3 also
the weights. Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models") with sequence parallelism: per layer and micro-batch
s·b·h·(34 + 5·a·s/h)/t bytes; selective recomputation keeps s·b·h·34/t; full recomputation keeps
only the layer input, 2·s·b·h/t, plus one layer's full activations while it is recomputed.
Under 1F1B the first stage holds min(p, m) micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cliffguard.plan.layout import Layout
from cliffguard.plan.model import ModelShape, Recompute

GIB = 2**30
WEIGHT_BYTES = 2  # fp16/bf16
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12  # fp32 master weights, Adam momentum and variance
CONTEXT_GIB = 1.0  # CUDA context, NCCL and cuBLAS workspaces
FRAGMENTATION = 0.10  # caching-allocator slack over what tensors hold


@dataclass(frozen=True)
class MemoryBreakdown:
    """GiB on the first pipeline stage's device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


def params_on_first_stage(model: ModelShape, layout: Layout) -> float:
    """Parameters one device of the first stage holds: its layers and the embedding, split by TP."""
    layers = model.layers / layout.pp
    return (layers * model.params_per_layer + model.embedding_params) / layout.tp


def activation_bytes_per_layer(model: ModelShape, layout: Layout) -> float:
    """Bytes one layer keeps for the backward pass of one micro-batch."""
    sbh = model.seq * layout.micro_batch * model.hidden
    if layout.recompute is Recompute.FULL:
        return 2.0 * sbh / layout.tp
    if layout.recompute is Recompute.SELECTIVE:
        return 34.0 * sbh / layout.tp
    return sbh * (34.0 + 5.0 * model.heads * model.seq / model.hidden) / layout.tp


def activation_bytes(model: ModelShape, layout: Layout, micro_batches: int) -> float:
    in_flight = min(layout.pp, micro_batches)
    stored = activation_bytes_per_layer(model, layout) * (model.layers / layout.pp) * in_flight
    if layout.recompute is Recompute.FULL:
        full = Layout(layout.tp, layout.pp, layout.dp, layout.zero, Recompute.NONE, layout.micro_batch)
        stored += activation_bytes_per_layer(model, full)  # the layer being recomputed
    return stored


def memory_per_device(model: ModelShape, layout: Layout, micro_batches: int) -> MemoryBreakdown:
    phi = params_on_first_stage(model, layout)
    d = layout.dp
    weights = WEIGHT_BYTES * phi / (d if layout.zero >= 3 else 1)
    grads = GRAD_BYTES * phi / (d if layout.zero >= 2 else 1)
    optimizer = OPTIMIZER_BYTES * phi / (d if layout.zero >= 1 else 1)
    acts = activation_bytes(model, layout, micro_batches)
    held = (weights + grads + optimizer + acts) / GIB
    return MemoryBreakdown(
        weights=weights / GIB,
        gradients=grads / GIB,
        optimizer=optimizer / GIB,
        activations=acts / GIB,
        buffers=CONTEXT_GIB + FRAGMENTATION * held,
    )
