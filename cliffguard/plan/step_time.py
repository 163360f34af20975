"""Step time of one layout: compute at a given efficiency, the 1F1B pipeline bubble, and the
tensor-, pipeline- and data-parallel communication.

Each pipeline stage runs m micro-batches; the 1F1B schedule takes (m + p - 1) micro-batch slots,
so the bubble is (p - 1)/m of the useful time (Narayanan et al. 2021, §2.2). Per micro-batch and
layer, Megatron tensor parallelism runs two all-reduces forward and two backward (two more when a
fully recomputed forward is rerun) of s·b·h 16-bit values; with sequence parallelism these are
all-gather + reduce-scatter pairs of the same volume. A ring all-reduce moves 2(n-1)/n of the data
through each device. Gradients are all-reduced once per step over the data-parallel group, and
half of that is taken as hidden behind the backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.plan.layout import Cluster, Layout
from cliffguard.plan.memory import GRAD_BYTES, params_on_first_stage
from cliffguard.plan.model import ModelShape, Recompute

ACT_BYTES = 2
DP_OVERLAP = 0.5  # share of the gradient all-reduce hidden behind the backward pass
ZERO3_VOLUME = 1.5  # ZeRO-3 gathers the weights again for the backward pass


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step."""

    compute: float
    bubble: float
    tp_comm: float
    pp_comm: float
    dp_comm: float  # the exposed part

    @property
    def total(self) -> float:
        return self.compute + self.bubble + self.tp_comm + self.pp_comm + self.dp_comm

    def to_dict(self) -> dict[str, float]:
        return {"compute": round(self.compute, 4), "bubble": round(self.bubble, 4),
                "tp_comm": round(self.tp_comm, 4), "pp_comm": round(self.pp_comm, 4),
                "dp_comm": round(self.dp_comm, 4), "total": round(self.total, 4)}


def ring_allreduce_s(nbytes: float, n: int, gbps: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``n`` devices at ``gbps`` GB/s each."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / (gbps * 1e9)


def tp_collectives_per_layer(recompute: Recompute) -> int:
    return 6 if recompute is Recompute.FULL else 4


def step_time(model: ModelShape, layout: Layout, cluster: Cluster, global_batch: int) -> StepTime:
    m = layout.micro_batches(global_batch)
    layers_per_stage = model.layers / layout.pp
    tokens_mb = layout.micro_batch * model.seq
    flops_mb = model.train_flops_per_token(layout.recompute) * tokens_mb / (layout.tp * layout.pp)
    compute_mb = flops_mb / (cluster.peak_tflops * 1e12 * cluster.mfu)

    sbh_bytes = ACT_BYTES * tokens_mb * model.hidden
    tp_mb = layers_per_stage * tp_collectives_per_layer(layout.recompute) * ring_allreduce_s(
        sbh_bytes, layout.tp, cluster.intra_gbps)
    pp_mb = 0.0
    if layout.pp > 1:
        same_node = layout.tp * layout.pp <= cluster.gpus_per_node
        # Megatron scatters the boundary activations over the TP ranks before sending.
        pp_mb = 2 * (sbh_bytes / layout.tp) / ((cluster.intra_gbps if same_node else cluster.inter_gbps) * 1e9)

    slot = compute_mb + tp_mb + pp_mb
    dp_gbps = cluster.intra_gbps if layout.gpus <= cluster.gpus_per_node else cluster.inter_gbps
    grad_bytes = GRAD_BYTES * params_on_first_stage(model, layout)
    dp = ring_allreduce_s(grad_bytes, layout.dp, dp_gbps) * (ZERO3_VOLUME if layout.zero == 3 else 1.0)
    return StepTime(
        compute=m * compute_mb,
        bubble=(layout.pp - 1) * slot,
        tp_comm=m * tp_mb,
        pp_comm=m * pp_mb,
        dp_comm=(1 - DP_OVERLAP) * dp,
    )


@dataclass(frozen=True)
class Throughput:
    tokens_per_s: float
    tflops_per_gpu: float  # hardware FLOPs including recomputation (Narayanan et al.'s accounting)
    mfu: float  # model FLOPs (no recomputation) over peak, end to end


def throughput(model: ModelShape, layout: Layout, cluster: Cluster, global_batch: int,
               step: StepTime | None = None) -> Throughput:
    step = step or step_time(model, layout, cluster, global_batch)
    tokens_per_s = global_batch * model.seq / step.total
    gpus = layout.gpus
    hw = model.train_flops_per_token(layout.recompute) * tokens_per_s / gpus / 1e12
    useful = model.model_flops_per_token() * tokens_per_s / gpus / 1e12
    return Throughput(tokens_per_s=tokens_per_s, tflops_per_gpu=hw, mfu=useful / cluster.peak_tflops)
