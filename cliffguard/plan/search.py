"""Enumerate layouts for a model on a cluster, reject those that cannot run or do not fit,
rank the rest by estimated tokens/s."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cliffguard.plan.layout import Cluster, Layout
from cliffguard.plan.memory import MemoryBreakdown, memory_per_device
from cliffguard.plan.model import ModelShape, Recompute
from cliffguard.plan.step_time import StepTime, Throughput, step_time, throughput

ZERO_STAGES = (0, 1, 2, 3)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Plan:
    layout: Layout
    memory: MemoryBreakdown
    step: StepTime
    throughput: Throughput

    def to_dict(self) -> dict[str, object]:
        lay = self.layout
        return {
            "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "zero": lay.zero, "recompute": str(lay.recompute),
            "micro_batch": lay.micro_batch,
            "memory_gb_per_device": round(self.memory.total, 3),
            "tokens_per_s": round(self.throughput.tokens_per_s, 1),
            "tflops_per_gpu": round(self.throughput.tflops_per_gpu, 1),
            "mfu": round(self.throughput.mfu, 4),
            "step_s": self.step.to_dict(),
            "memory_gb": self.memory.to_dict(),
        }


@dataclass
class SearchResult:
    plans: list[Plan]  # fitting layouts, best first
    evaluated: int
    rejected: Counter[str]  # reason -> count


def candidate_layouts(model: ModelShape, cluster: Cluster, global_batch: int,
                      rejected: Counter[str] | None = None, *, tp: int | None = None,
                      pp: int | None = None) -> Iterator[Layout]:
    """Every layout that can run at all; ``rejected`` counts the degree combinations that cannot.
    ``tp``/``pp`` pin a degree (the published-layout check)."""
    rejected = Counter() if rejected is None else rejected
    tps = [tp] if tp else divisors(min(cluster.gpus_per_node, cluster.gpus))
    pps = [pp] if pp else divisors(model.layers)
    for t in tps:
        if model.heads % t:
            rejected["tp does not divide heads"] += 1
            continue
        for p in pps:
            if model.layers % p:
                rejected["pp does not divide layers"] += 1
                continue
            if cluster.gpus % (t * p):
                rejected["tp·pp does not divide gpus"] += 1
                continue
            d = cluster.gpus // (t * p)
            if global_batch % d:
                rejected["dp does not divide global batch"] += 1
                continue
            for zero in ZERO_STAGES:
                if zero and d == 1:
                    rejected["zero without data parallelism"] += 1
                    continue
                for rc in Recompute:
                    for mb in divisors(global_batch // d):
                        yield Layout(t, p, d, zero, rc, mb)


def evaluate(model: ModelShape, layout: Layout, cluster: Cluster, global_batch: int) -> Plan:
    mem = memory_per_device(model, layout, layout.micro_batches(global_batch))
    step = step_time(model, layout, cluster, global_batch)
    return Plan(layout, mem, step, throughput(model, layout, cluster, global_batch, step))


def search(model: ModelShape, cluster: Cluster, global_batch: int, *,
           progress: Callable[[int], None] | None = None, progress_every: int = 1000,
           tp: int | None = None, pp: int | None = None) -> SearchResult:
    if global_batch <= 0:
        raise ValueError(f"global_batch: must be positive, got {global_batch!r}")
    rejected: Counter[str] = Counter()
    plans: list[Plan] = []
    evaluated = 0
    for layout in candidate_layouts(model, cluster, global_batch, rejected, tp=tp, pp=pp):
        plan = evaluate(model, layout, cluster, global_batch)
        evaluated += 1
        if progress is not None and evaluated % progress_every == 0:
            progress(evaluated)
        if plan.memory.total > cluster.gpu_mem_gb:
            rejected["out of memory"] += 1
            continue
        plans.append(plan)
    plans.sort(key=lambda p: (-p.throughput.tokens_per_s, p.memory.total))
    return SearchResult(plans=plans, evaluated=evaluated, rejected=rejected)
