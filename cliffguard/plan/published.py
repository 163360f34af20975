"""Published training layouts and their measured throughput, and the estimator's error on each.

Only figures stated in the cited papers are in the table. Each check pins the published degrees
(TP, PP, DP) and ZeRO stage, lets the estimator choose the micro-batch size and, where the paper
does not pin it, the recomputation, and compares its best fitting estimate with the published
per-GPU throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.plan.layout import Cluster, Layout
from cliffguard.plan.model import ModelShape, Recompute
from cliffguard.plan.search import Plan, divisors, evaluate

NARAYANAN = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters "
             "Using Megatron-LM, Table 1")
LLAMA3 = "Llama Team 2024, The Llama 3 Herd of Models, Table 4"
# DGX A100 80GB (312 TFLOP/s BF16, NVLink 3, 8 x 200 Gb/s HDR InfiniBand per node).
A100 = {"peak_tflops": 312.0, "gpu_mem_gb": 80.0, "intra_gbps": 300.0, "inter_gbps": 25.0}
# H100 SXM 80GB (989 TFLOP/s dense BF16, NVLink 4, 400 Gb/s RoCE per GPU).
H100 = {"peak_tflops": 989.0, "gpu_mem_gb": 80.0, "intra_gbps": 450.0, "inter_gbps": 50.0}


@dataclass(frozen=True)
class PublishedRun:
    name: str
    source: str
    model: ModelShape
    tp: int
    pp: int
    gpus: int
    global_batch: int  # sequences
    tflops_per_gpu: float  # published
    # "hardware": counts the recomputed forward (Narayanan et al.'s 96·B·s·l·h² accounting);
    # "model": useful FLOPs only (MFU accounting, as Llama 3 reports).
    flops: str
    hardware: dict[str, float]
    zero: int = 0
    recompute: tuple[Recompute, ...] = tuple(Recompute)
    note: str = ""

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


def _narayanan(params_b: str, heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int,
               batch: int, tflops: float) -> PublishedRun:
    return PublishedRun(
        name=f"GPT {params_b}", source=NARAYANAN, model=ModelShape(layers, hidden, heads, 51200, 2048),
        tp=tp, pp=pp, gpus=gpus, global_batch=batch, tflops_per_gpu=tflops, flops="hardware",
        hardware=A100, zero=0, recompute=(Recompute.FULL,),
        note="full recomputation and no optimizer sharding, as in the paper's runs")


PUBLISHED: tuple[PublishedRun, ...] = (
    _narayanan("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135.0),
    _narayanan("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138.0),
    _narayanan("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140.0),
    _narayanan("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148.0),
    _narayanan("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155.0),
    _narayanan("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163.0),
    _narayanan("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163.0),
    PublishedRun(
        name="GPT-3 175B", source=NARAYANAN.replace("Table 1", "§5.1 (end-to-end training time)"),
        model=ModelShape(96, 12288, 96, 51200, 2048), tp=8, pp=8, gpus=1024, global_batch=1536,
        tflops_per_gpu=140.0, flops="hardware", hardware=A100, zero=0, recompute=(Recompute.FULL,),
        note="1024 A100s, batch 1536, 140 TFLOP/s per GPU (34 days for 300B tokens); the passage does "
             "not give the degrees: TP 8 x PP 8 is assumed, as in the 145.6B row"),
    PublishedRun(
        name="Llama 3 405B, 16k GPUs", source=LLAMA3, model=ModelShape(126, 16384, 128, 128256, 8192),
        tp=8, pp=16, gpus=16384, global_batch=2048, tflops_per_gpu=400.0, flops="model", hardware=H100,
        zero=2, note="CP 1, DP 128, 16M-token batch, 41% BF16 MFU; the paper's interleaved pipeline "
                     "schedule and uneven first/last stages are not modelled (plain 1F1B here)"),
    PublishedRun(
        name="Llama 3 405B, 8k GPUs", source=LLAMA3, model=ModelShape(126, 16384, 128, 128256, 8192),
        tp=8, pp=16, gpus=8192, global_batch=2048, tflops_per_gpu=430.0, flops="model", hardware=H100,
        zero=2, note="CP 1, DP 64, 16M-token batch, 43% BF16 MFU; interleaving not modelled"),
)


@dataclass(frozen=True)
class Check:
    run: PublishedRun
    plan: Plan | None  # the best fitting estimate for the pinned layout, None if nothing fits

    @property
    def estimated_tflops(self) -> float | None:
        if self.plan is None:
            return None
        tp = self.plan.throughput
        return tp.tflops_per_gpu if self.run.flops == "hardware" else tp.mfu * self.run.hardware["peak_tflops"]

    @property
    def error(self) -> float | None:
        """(estimate - published) / published."""
        est = self.estimated_tflops
        return None if est is None else (est - self.run.tflops_per_gpu) / self.run.tflops_per_gpu

    def to_dict(self) -> dict[str, object]:
        r = self.run
        return {
            "name": r.name, "source": r.source, "note": r.note, "params_b": round(r.model.params / 1e9, 1),
            "tp": r.tp, "pp": r.pp, "dp": r.dp, "gpus": r.gpus, "global_batch": r.global_batch,
            "flops": r.flops, "published_tflops_per_gpu": r.tflops_per_gpu,
            "estimated_tflops_per_gpu": None if self.estimated_tflops is None else round(self.estimated_tflops, 1),
            "error": None if self.error is None else round(self.error, 4),
            "fits": self.plan is not None,
            "estimate": None if self.plan is None else self.plan.to_dict(),
        }


def check(run: PublishedRun, mfu: float = Cluster.mfu) -> Check:
    cluster = Cluster(gpus=run.gpus, mfu=mfu, **run.hardware)
    best: Plan | None = None
    for rc in run.recompute:
        for mb in divisors(run.global_batch // run.dp):
            plan = evaluate(run.model, Layout(run.tp, run.pp, run.dp, run.zero, rc, mb), cluster, run.global_batch)
            if plan.memory.total > cluster.gpu_mem_gb:
                continue
            if best is None or plan.throughput.tokens_per_s > best.throughput.tokens_per_s:
                best = plan
    return Check(run, best)


def check_all(mfu: float = Cluster.mfu) -> list[Check]:
    return [check(run, mfu) for run in PUBLISHED]
