import pytest

from cliffguard.plan.layout import Cluster, Layout
from cliffguard.plan.memory import params_on_first_stage
from cliffguard.plan.model import ModelShape, Recompute
from cliffguard.plan.step_time import ring_allreduce_s, step_time, throughput

GPT3 = ModelShape(96, 12288, 96, 51200, 2048)


def test_ring_allreduce_hand_computed():
    assert ring_allreduce_s(1e9, 4, 10.0) == pytest.approx(2 * 3 / 4 * 1e9 / 10e9)
    assert ring_allreduce_s(1e9, 1, 10.0) == 0.0


def test_compute_is_flops_over_gpus_peak_and_efficiency():
    cluster = Cluster(gpus=8, gpu_mem_gb=80, peak_tflops=312, mfu=0.5)
    lay = Layout(1, 1, 8, 0, Recompute.NONE, 1)
    st = step_time(GPT3, lay, cluster, global_batch=64)
    flops = GPT3.train_flops_per_token(Recompute.NONE) * 64 * 2048
    assert st.compute == pytest.approx(flops / (8 * 312e12 * 0.5))
    assert st.bubble == 0 and st.tp_comm == 0 and st.pp_comm == 0


def test_bubble_is_p_minus_1_over_m():
    # no tensor parallelism, one replica, fast links: the bubble is all that is added
    cluster = Cluster(gpus=4, gpu_mem_gb=80, gpus_per_node=4, intra_gbps=1e12)
    lay = Layout(1, 4, 1, 0, Recompute.NONE, 1)
    st = step_time(GPT3, lay, cluster, global_batch=16)
    assert st.bubble / st.compute == pytest.approx(3 / 16, rel=1e-6)


def test_tp_all_reduces_per_layer_hand_computed():
    cluster = Cluster(gpus=8, gpu_mem_gb=80, intra_gbps=300)
    one = 2 * 7 / 8 * (2 * 2048 * 12288) / 300e9  # one all-reduce of s·b·h 16-bit values over 8
    for rc, n in ((Recompute.NONE, 4), (Recompute.SELECTIVE, 4), (Recompute.FULL, 6)):
        st = step_time(GPT3, Layout(8, 1, 1, 0, rc, 1), cluster, global_batch=3)
        assert st.tp_comm == pytest.approx(3 * 96 * n * one)


def test_dp_gradient_all_reduce_over_inter_node_half_exposed():
    cluster = Cluster(gpus=1024, gpu_mem_gb=80, inter_gbps=25)
    lay = Layout(8, 8, 16, 0, Recompute.FULL, 1)
    grad_bytes = 2 * params_on_first_stage(GPT3, lay)
    expected = 0.5 * 2 * 15 / 16 * grad_bytes / 25e9
    assert step_time(GPT3, lay, cluster, 1536).dp_comm == pytest.approx(expected)
    lay3 = Layout(8, 8, 16, 3, Recompute.FULL, 1)
    assert step_time(GPT3, lay3, cluster, 1536).dp_comm == pytest.approx(1.5 * expected)


def test_throughput_is_tokens_over_step_time():
    cluster = Cluster(gpus=1024, gpu_mem_gb=80)
    lay = Layout(8, 8, 16, 0, Recompute.FULL, 1)
    st = step_time(GPT3, lay, cluster, 1536)
    tp = throughput(GPT3, lay, cluster, 1536, st)
    assert tp.tokens_per_s == pytest.approx(1536 * 2048 / st.total)
    # end-to-end MFU is below the compute efficiency: bubble and communication come on top
    assert tp.mfu < cluster.mfu
    assert tp.tflops_per_gpu > tp.mfu * cluster.peak_tflops  # recomputed FLOPs count as hardware work


@pytest.mark.parametrize("kwargs, field", [
    ({"gpus": 0, "gpu_mem_gb": 80}, "gpus"),
    ({"gpus": 8, "gpu_mem_gb": -1}, "gpu_mem_gb"),
    ({"gpus": 8, "gpu_mem_gb": 80, "mfu": 1.5}, "mfu"),
])
def test_cluster_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        Cluster(**kwargs)
