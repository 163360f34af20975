"""Collectors: histograms (counts add up, bins are right), MFU formula and peak, timing, memory."""

from __future__ import annotations

import gc
import math
import time

import pytest
import torch

from cliffguard.agent.collectors.grad_hist import GradHistogram, HistConfig, grad_histograms, layer_name
from cliffguard.agent.collectors.memory import memory_stats
from cliffguard.agent.collectors.mfu import ModelShape, calibrate_peak, mfu, resolve_peak, table_peak
from cliffguard.agent.collectors.timing import StepClock
from cliffguard.agent.guard import Guard, GuardConfig
from cliffguard.core.enums import GuardDecision
from cliffguard.core.spike import SpikeConfig


def _param(grad: torch.Tensor) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros_like(grad))
    p.grad = grad
    return p


def test_histogram_bins_counts_and_specials():
    cfg = HistConfig(lo_exp=-4, hi_exp=2)
    g = torch.tensor([0.0, 0.0, 1.0, 1.5, -0.25, 2**-6, 8.0, float("nan"), float("inf"), 0.5])
    out = grad_histograms([("module.w", _param(g))], cfg)
    layer = out["w"]  # the DDP prefix is stripped
    assert layer["zeros"] == 2 and layer["nonfinite"] == 2
    assert sum(layer["counts"]) + layer["zeros"] + layer["nonfinite"] == g.numel()
    edges = cfg.edges()
    # 1.0 and 1.5 share the [1, 2) bin; 0.5 in [0.5, 1); -0.25 in [0.25, 0.5); 2**-6 underflows into bin 0;
    # 8.0 overflows into the last bin.
    assert layer["counts"][edges.index(1.0)] == 2
    assert layer["counts"][edges.index(0.5)] == 1
    assert layer["counts"][edges.index(0.25)] == 1
    assert layer["counts"][0] == 1 and layer["underflow"] == pytest.approx(1 / g.numel())
    assert layer["counts"][-1] == 1
    assert layer["max"] == 8.0
    assert layer["p50"] == 0.0 or layer["p50"] >= 0.25  # 10 values, 2 zeros: the median is non-zero
    assert math.isnan(layer["norm"])  # non-finite gradients show in the norm


@pytest.mark.parametrize("lo_exp", [-40, -140])
def test_histogram_bins_match_a_per_value_reference_with_subnormals_and_bf16(lo_exp):
    """Binning by the float32 exponent field, subnormals included when the bins reach them."""
    cfg = HistConfig(lo_exp=lo_exp, hi_exp=4)
    g = torch.tensor([0.0, -0.0, 1e-42, -3e-39, 2.0**-126, 2.0**-41, 2.0**-40, 0.3, -16.0, 1e30,
                      float("-inf"), 3.0])
    bf = torch.tensor([0.5, -0.125, 0.0, 1e-3]).bfloat16()
    p_bf = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    p_bf.grad = bf
    out = grad_histograms([("w", _param(g)), ("b", p_bf)], cfg)
    for name, vals in (("w", g.tolist()), ("b", bf.float().tolist())):
        want = [0] * cfg.n_bins
        finite = [abs(v) for v in vals if math.isfinite(v) and v != 0]
        for a in finite:
            want[min(max(math.frexp(a)[1] - 1 - cfg.lo_exp, 0), cfg.n_bins - 1)] += 1
        assert out[name]["counts"] == want
        assert out[name]["zeros"] == sum(v == 0 for v in vals)
        assert out[name]["max"] == max(finite)  # the largest finite magnitude, -inf aside
        assert out[name]["underflow"] == sum(a < 2.0**lo_exp for a in finite) / len(vals)


def _reference_layer(values: list[float], cfg: HistConfig) -> dict:
    """A per-value reference for one layer: the contract, value by value in Python."""
    counts = [0] * cfg.n_bins
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    for a in finite:
        counts[min(max(math.frexp(a)[1] - 1 - cfg.lo_exp, 0), cfg.n_bins - 1)] += 1
    return {"counts": counts, "zeros": sum(v == 0 for v in values),
            "nonfinite": sum(not math.isfinite(v) for v in values),
            "max": max(finite, default=0.0), "underflow": sum(a < 2.0**cfg.lo_exp for a in finite) / max(len(values), 1),
            "numel": len(values)}


def _awkward(n: int, gen: torch.Generator) -> torch.Tensor:
    """Normal values over many magnitudes, with zeros (both signs), subnormals, exact powers of
    two, huge values and inf/NaN sprinkled in."""
    g = torch.randn(n, generator=gen) * torch.pow(2.0, torch.randint(-60, 20, (n,), generator=gen).float())
    specials = torch.tensor([0.0, -0.0, 1e-42, -3e-39, 2.0**-126, 2.0**-40, 2.0**-41, 1.0, -2.0**3, 3e38,
                             float("inf"), float("-inf"), float("nan")])
    where = torch.randint(0, n, (n // 4,), generator=gen)
    g[where] = specials[torch.randint(0, len(specials), (n // 4,), generator=gen)]
    return g


@pytest.mark.parametrize("chunk_numel", [1 << 22, 7, 300])
def test_histogram_reader_matches_the_per_value_reference_on_awkward_layers(chunk_numel):
    """Packed small layers, layers cut across chunks, other dtypes, an empty layer: every layer's
    counts, zeros, non-finite count, max and norm equal a per-value reference, and
    ``sum(counts) + zeros + nonfinite == numel``; a reader reused on new gradients stays right."""
    cfg = HistConfig()
    gen = torch.Generator().manual_seed(1)
    reader = GradHistogram(cfg, chunk_numel=chunk_numel)
    for _ in range(2):  # the second read reuses the layout and buffers
        grads = {"a": _awkward(1000, gen), "b": _awkward(5, gen), "empty": torch.zeros(0),
                 "c": _awkward(777, gen).reshape(7, 111), "bf": _awkward(64, gen).bfloat16(),
                 "half": torch.randn(50, generator=gen).half(), "f64": _awkward(40, gen).double()}
        params = [(k, _param(g)) for k, g in grads.items()] + [("frozen", torch.nn.Parameter(torch.zeros(3)))]
        out = reader.read(params)
        assert list(out) == list(grads)  # no gradient, no layer
        for name, g in grads.items():
            vals = g.float().reshape(-1).tolist()
            want = _reference_layer(vals, cfg)
            got = out[name]
            for key in ("counts", "zeros", "nonfinite", "numel"):
                assert got[key] == want[key], (name, key)
            assert sum(got["counts"]) + got["zeros"] + got["nonfinite"] == got["numel"]
            assert got["max"] == want["max"] and got["underflow"] == pytest.approx(want["underflow"])
            norm = float(g.float().norm())
            assert got["norm"] == pytest.approx(norm, rel=1e-5) or (math.isnan(norm) and math.isnan(got["norm"])) \
                or (math.isinf(norm) and got["norm"] == norm), name
            assert 0.0 <= got["p50"] <= got["p99"] <= got["max"] or got["numel"] == 0


def test_histogram_reader_keeps_each_layer_its_own_numbers_when_big_layers_run_alone():
    """A layer too big to pack runs alone, ahead of the packed small ones around it: every
    layer's norm, max and counts stay its own."""
    cfg = HistConfig(lo_exp=-4, hi_exp=4)
    grads = {"s1": torch.full((3,), 0.25), "big": torch.full((16,), 4.0), "s2": torch.full((2, 2), 1.0)}
    out = GradHistogram(cfg, chunk_numel=16).read([(k, _param(g)) for k, g in grads.items()])
    for name, g in grads.items():
        assert out[name]["norm"] == pytest.approx(float(g.norm())) and out[name]["max"] == float(g.max())
        assert out[name]["counts"][int(math.log2(float(g.max()))) - cfg.lo_exp] == g.numel()


def test_histogram_reader_follows_a_change_of_layers():
    cfg = HistConfig(lo_exp=-4, hi_exp=2)
    reader = GradHistogram(cfg)
    assert reader.read([("w", _param(torch.tensor([1.0, 0.0])))])["w"]["counts"][4] == 1
    out = reader.read([("w", _param(torch.tensor([0.5, 0.5, 0.0]))), ("v", _param(torch.tensor([0.0])))])
    assert out["w"]["counts"][3] == 2 and out["w"]["zeros"] == 1 and out["v"]["zeros"] == 1
    assert reader.read([("w", torch.nn.Parameter(torch.zeros(2)))]) == {}
    with pytest.raises(ValueError, match="chunk_numel"):
        GradHistogram(cfg, chunk_numel=0)


def test_histogram_percentiles_and_norm_on_real_gradients():
    torch.manual_seed(0)
    g = torch.randn(1000)
    layer = grad_histograms([("w", _param(g))], HistConfig())["w"]
    a = g.abs()
    assert layer["norm"] == pytest.approx(float(g.norm()), rel=1e-5)
    assert layer["max"] == pytest.approx(float(a.max()))
    # Percentiles are read off the log2 histogram: within their factor-2 bin, interpolated.
    for key, q in (("p50", 0.5), ("p99", 0.99)):
        exact = float(a.quantile(q))
        assert exact / 2 <= layer[key] <= exact * 2, (key, layer[key], exact)
    assert layer["p50"] < layer["p99"] <= layer["max"]
    assert layer["numel"] == 1000 and layer["zeros"] == 0


def test_layer_name_strips_wrappers():
    assert layer_name("module._orig_mod.h.0.attn.weight") == "h.0.attn.weight"


def test_palm_flops_and_mfu():
    shape = ModelShape(n_params=1_000_000, n_layers=4, n_heads=4, head_dim=32, seq_len=64)
    assert shape.flops_per_token() == 6e6 + 12 * 4 * 4 * 32 * 64
    assert mfu(1000, 1e6, 1.0, 1e10) == pytest.approx(0.1)
    assert mfu(1000, 1e6, 0.0, 1e10) == 0.0


def test_shape_infer_reads_nanogpt_and_hf_names():
    class Cfg:
        num_hidden_layers, num_attention_heads, hidden_size = 2, 4, 64

    m = torch.nn.Linear(3, 3)
    m.config = Cfg()
    s = ModelShape.infer(m, seq_len=16)
    assert (s.n_layers, s.n_heads, s.head_dim, s.seq_len, s.n_params) == (2, 4, 16, 16, 12)
    with pytest.raises(ValueError, match="model"):
        ModelShape.infer(torch.nn.Linear(2, 2), seq_len=4)


def test_peak_sources():
    cpu = torch.device("cpu")
    assert table_peak(cpu) is None
    assert resolve_peak(cpu, 5e12) == (5e12, "config")
    peak, source = resolve_peak(cpu, None, calibration_s=0.05)
    assert source == "calibration" and peak > 1e8
    assert calibrate_peak(cpu, size=64, seconds=0.02) > 0


def test_step_clock_split_adds_up():
    clock = StepClock()
    clock.data_wait = 0.01
    clock.comm_exposed = 0.02
    time.sleep(0.05)
    total, data, comm, compute = clock.split()
    assert total >= 0.05 and data == 0.01 and comm == 0.02
    assert compute == pytest.approx(total - 0.03)


def test_memory_stats_cpu_is_rss():
    alloc, reserved = memory_stats(torch.device("cpu"))
    assert alloc > 10_000_000 and reserved == alloc


def test_guard_skips_crit_and_holds_after_consecutive_trips():
    guard = Guard(GuardConfig(hold_after=3, spike=SpikeConfig(window=16, min_history=8)))
    for i in range(10):
        assert guard.decide(2.0 + 0.01 * (i % 3), i) is GuardDecision.OK
    assert guard.decide(float("nan"), 10) is GuardDecision.SKIP
    assert guard.decide(2.0, 11) is GuardDecision.OK  # the run of skips is broken
    assert guard.decide(50.0, 12) is GuardDecision.SKIP
    assert guard.decide(50.0, 13) is GuardDecision.SKIP
    assert guard.decide(50.0, 14) is GuardDecision.HOLD
    assert guard.first_skip_step == 12
    state = guard.state_dict()
    other = Guard(GuardConfig(hold_after=3, spike=SpikeConfig(window=16, min_history=8)))
    other.load_state_dict(state)
    assert other.state_dict() == state



def test_a_resume_answers_the_skips_but_keeps_the_stretch_that_goes_on():
    """Five bad steps 120-124, paused after two and resumed: every one is skipped, the hold comes
    ``hold_after`` skips after the resume, and the stretch still starts at 120."""
    guard = Guard(GuardConfig(hold_after=3, spike=SpikeConfig(window=16, min_history=8)))
    for i in range(110, 120):
        guard.decide(2.0 + 0.01 * (i % 3), i)
    assert [guard.decide(50.0, s) for s in (120, 121)] == [GuardDecision.SKIP] * 2
    guard.answer_hold()  # the controller's resume at the boundary before 122
    decisions = [guard.decide(50.0, s) for s in (122, 123, 124)]
    assert decisions == [GuardDecision.SKIP, GuardDecision.SKIP, GuardDecision.HOLD]
    assert guard.first_skip_step == 120 and guard.consecutive_skips == 5
    assert not any(Guard.applies_update(d) for d in decisions)
    restored = Guard(GuardConfig(hold_after=3, spike=SpikeConfig(window=16, min_history=8)))
    restored.load_state_dict(guard.state_dict())
    guard.answer_hold()
    restored.answer_hold()
    assert guard.decide(50.0, 125) is restored.decide(50.0, 125) is GuardDecision.SKIP
    assert guard.decide(2.0, 126) is GuardDecision.OK  # a step that passes ends the stretch
    assert (guard.consecutive_skips, guard.answered_skips, guard.first_skip_step) == (0, 0, None)

def test_guard_config_validation():
    with pytest.raises(ValueError, match="on_timeout"):
        GuardConfig(on_timeout="panic")
    with pytest.raises(ValueError, match="hold_after"):
        GuardConfig(hold_after=0)


def test_ddp_hook_gives_the_global_grad_norm_of_the_reduced_buckets(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from cliffguard.agent.collectors.timing import attach_comm_timer

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)), bucket_cap_mb=0.0001)
        timer = attach_comm_timer(model)
        for want in (False, True, True):  # DDP rebuilds its buckets after the first step
            timer.reset()
            timer.want_grad_norm = want
            model.zero_grad()
            model(torch.randn(5, 8)).square().sum().backward()
            got = timer.grad_norm_sq()
            if not want:
                assert got is None and timer.buckets >= 1
                continue
            assert timer.buckets >= 1 and len(timer.bucket_norms) == timer.buckets
            expected = sum(float(p.grad.double().square().sum()) for p in model.parameters())
            assert float(got) == pytest.approx(expected, rel=1e-5)
    finally:
        # Free the DDP model (its reducer and the hook state hold the gloo group) here, on this
        # thread, before the group goes, so the group's last reference is dropped on this thread
        # and not on one of its own workers (whose destructor would join itself and abort the
        # whole test process: "Resource deadlock avoided"; see CommTimer.hook).
        model = timer = None
        gc.collect()
        dist.destroy_process_group()


def test_the_guard_does_not_skip_on_the_rules_cold_start():
    """Before min_history the spike rule only sees a rise over the median so far (no noise estimate):
    the verdict may be critical for the controller, but the guard lets the update through."""
    from cliffguard.agent.guard import Guard
    from cliffguard.core.enums import GuardDecision, Level

    g = Guard()
    decisions = [g.decide(x, i) for i, x in enumerate([17.4, 27.9, 49.2, 58.5, 33.8, 38.1, 41.7])]
    assert g.last_verdict.level is Level.CRITICAL and g.last_verdict.reason.startswith("cold start")
    assert GuardDecision.SKIP not in decisions and GuardDecision.HOLD not in decisions
    assert g.decide(float("nan"), 7) is GuardDecision.SKIP  # a non-finite loss is skipped at once
