"""What the planner chooses (a `Layout`) and what it is given (a `Cluster`, a global batch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cliffguard.plan.model import Recompute


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}: must be positive, got {value!r}")


@dataclass(frozen=True)
class Layout:
    tp: int  # tensor-parallel degree (with sequence parallelism, as Megatron-LM runs it)
    pp: int  # pipeline stages, 1F1B schedule without interleaving
    dp: int  # data-parallel replicas
    zero: int  # ZeRO stage 0-3 over the data-parallel group
    recompute: Recompute
    micro_batch: int  # sequences per micro-batch

    def __post_init__(self) -> None:
        _positive(self, "tp", "pp", "dp", "micro_batch")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero: must be 0, 1, 2 or 3, got {self.zero!r}")
        object.__setattr__(self, "recompute", Recompute(self.recompute))

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def micro_batches(self, global_batch: int) -> int:
        """Micro-batches each pipeline runs per step (the m of the bubble (p-1)/m)."""
        per_replica, rest = divmod(global_batch, self.dp * self.micro_batch)
        if rest or per_replica == 0:
            raise ValueError(f"global_batch: {global_batch} is not a multiple of dp·micro_batch = "
                             f"{self.dp}·{self.micro_batch}")
        return per_replica


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpu_mem_gb: float  # GiB per device
    gpus_per_node: int = 8
    # A100 SXM dense BF16. H100 SXM: 989.
    peak_tflops: float = 312.0
    # Fraction of peak the matmuls reach while computing; bubble and exposed communication come on
    # top, so end-to-end MFU is lower (Narayanan et al. 2021 measured 44-52% end to end on A100).
    mfu: float = 0.5
    # GB/s (gigabytes) per GPU, one direction: NVLink 3 on A100 (600 GB/s both ways) and one
    # 200 Gb/s HDR InfiniBand adapter per GPU, as in a DGX A100.
    intra_gbps: float = 300.0
    inter_gbps: float = 25.0

    def __post_init__(self) -> None:
        _positive(self, "gpus", "gpus_per_node", "gpu_mem_gb", "peak_tflops", "mfu", "intra_gbps", "inter_gbps")
        if not isinstance(self.gpus, int) or not isinstance(self.gpus_per_node, int):
            raise ValueError("gpus: gpus and gpus_per_node must be integers")
        if self.mfu > 1:
            raise ValueError(f"mfu: a fraction of peak, at most 1, got {self.mfu!r}")
