from collections import Counter

from cliffguard.plan.layout import Cluster
from cliffguard.plan.model import ModelShape
from cliffguard.plan.search import candidate_layouts, divisors, search

TINY = ModelShape(layers=2, hidden=4, heads=2, vocab=10, seq=6)


def test_divisors():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]


def test_candidate_layouts_hand_counted():
    # gpus 4 in one node, batch 4. tp 4 does not divide 2 heads. tp1·pp1: dp 4, 4 zero x 3 recompute
    # x 1 micro-batch = 12; tp1·pp2: dp 2, 4 x 3 x 2 = 24; tp2·pp1: 24; tp2·pp2: dp 1, zero 0 only,
    # 3 x 3 micro-batches = 9.
    rejected: Counter[str] = Counter()
    layouts = list(candidate_layouts(TINY, Cluster(gpus=4, gpu_mem_gb=80, gpus_per_node=4), 4, rejected))
    assert len(layouts) == 12 + 24 + 24 + 9
    assert rejected == {"tp does not divide heads": 1, "zero without data parallelism": 3}
    assert all(lay.gpus == 4 and 4 % (lay.dp * lay.micro_batch) == 0 for lay in layouts)


def test_tp_stays_inside_a_node():
    model = ModelShape(4, 64, 16)
    layouts = list(candidate_layouts(model, Cluster(gpus=32, gpu_mem_gb=80, gpus_per_node=4), 32))
    assert max(lay.tp for lay in layouts) == 4


def test_search_ranks_fitting_layouts_by_tokens_per_s():
    model = ModelShape.from_params(175e9)
    result = search(model, Cluster(gpus=1024, gpu_mem_gb=80), 1536)
    assert result.plans
    rates = [p.throughput.tokens_per_s for p in result.plans]
    assert rates == sorted(rates, reverse=True)
    assert all(p.memory.total <= 80 for p in result.plans)
    assert result.rejected["out of memory"] > 0  # 16 bytes x 175B cannot sit on 8 GPUs' worth of shards
    assert result.evaluated == len(result.plans) + result.rejected["out of memory"]
    best = result.plans[0].layout
    assert best.tp * best.pp * best.dp == 1024 and best.tp <= 8


def test_nothing_fits_in_too_little_memory():
    result = search(ModelShape.from_params(175e9), Cluster(gpus=8, gpu_mem_gb=80), 8)
    assert result.plans == []
    assert result.rejected["out of memory"] == result.evaluated > 0


def test_progress_is_reported_every_n_layouts():
    seen: list[int] = []
    result = search(TINY, Cluster(gpus=4, gpu_mem_gb=80, gpus_per_node=4), 4, progress=seen.append,
                    progress_every=10)
    assert seen == list(range(10, result.evaluated + 1, 10))


def test_pinned_degrees():
    result = search(ModelShape.from_params(175e9), Cluster(gpus=1024, gpu_mem_gb=80), 1536, tp=8, pp=8)
    assert {(p.layout.tp, p.layout.pp, p.layout.dp) for p in result.plans} == {(8, 8, 16)}
