import pytest

from cliffguard.plan.layout import Layout
from cliffguard.plan.memory import (
    CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    activation_bytes,
    activation_bytes_per_layer,
    memory_per_device,
    params_on_first_stage,
)
from cliffguard.plan.model import ModelShape, Recompute

GPT3 = ModelShape(96, 12288, 96, 51200, 2048)


def _layout(zero=0, recompute=Recompute.FULL, tp=8, pp=8, dp=16, mb=1):
    return Layout(tp, pp, dp, zero, recompute, mb)


def test_params_on_first_stage_hand_computed():
    # 12 layers of 12·12288² + 13·12288 = 1,812,099,072, plus the embedding (51200 + 2048)·12288
    # = 654,311,424, split over 8 TP ranks.
    assert params_on_first_stage(GPT3, _layout()) == (12 * 1_812_099_072 + 654_311_424) / 8


@pytest.mark.parametrize("zero, weights, grads, optimizer", [
    (0, 2, 2, 12),
    (1, 2, 2, 12 / 16),
    (2, 2, 2 / 16, 12 / 16),
    (3, 2 / 16, 2 / 16, 12 / 16),
])
def test_zero_stages_shard_the_16_bytes_per_parameter(zero, weights, grads, optimizer):
    mem = memory_per_device(GPT3, _layout(zero=zero), micro_batches=96)
    phi_gib = params_on_first_stage(GPT3, _layout()) / GIB
    assert mem.weights == pytest.approx(weights * phi_gib)
    assert mem.gradients == pytest.approx(grads * phi_gib)
    assert mem.optimizer == pytest.approx(optimizer * phi_gib)


def test_zero0_states_are_16_bytes_per_parameter():
    mem = memory_per_device(GPT3, _layout(zero=0), micro_batches=96)
    phi = params_on_first_stage(GPT3, _layout())
    assert (mem.weights + mem.gradients + mem.optimizer) * GIB == pytest.approx(16 * phi)


@pytest.mark.parametrize("recompute, expected", [
    # s·b·h = 2048·12288 = 25,165,824; 5·a·s/h = 5·96·2048/12288 = 80
    (Recompute.NONE, 25_165_824 * 114 / 8),
    (Recompute.SELECTIVE, 25_165_824 * 34 / 8),
    (Recompute.FULL, 2 * 25_165_824 / 8),
])
def test_korthikanti_activations_per_layer(recompute, expected):
    assert activation_bytes_per_layer(GPT3, _layout(recompute=recompute)) == pytest.approx(expected)


def test_first_stage_holds_pp_micro_batches_and_one_recomputed_layer():
    # 12 layers x 8 in flight x 6,291,456 bytes + one full layer (358,612,992 bytes) recomputed
    assert activation_bytes(GPT3, _layout(), micro_batches=96) == pytest.approx(
        12 * 8 * 6_291_456 + 358_612_992)


def test_fewer_micro_batches_than_stages_are_all_in_flight():
    lay = _layout(recompute=Recompute.SELECTIVE)
    assert activation_bytes(GPT3, lay, micro_batches=2) == pytest.approx(12 * 2 * 25_165_824 * 34 / 8)


def test_micro_batch_scales_activations():
    one = activation_bytes_per_layer(GPT3, _layout(recompute=Recompute.NONE, mb=1))
    assert activation_bytes_per_layer(GPT3, _layout(recompute=Recompute.NONE, mb=4)) == pytest.approx(4 * one)


def test_buffers_are_context_plus_fragmentation():
    mem = memory_per_device(GPT3, _layout(), micro_batches=96)
    held = mem.weights + mem.gradients + mem.optimizer + mem.activations
    assert mem.buffers == pytest.approx(CONTEXT_GIB + FRAGMENTATION * held)
    assert mem.total == pytest.approx(held + mem.buffers)


def test_layout_validation_names_the_field():
    with pytest.raises(ValueError, match="^zero:"):
        Layout(1, 1, 1, 4, Recompute.NONE, 1)
    with pytest.raises(ValueError, match="^tp:"):
        Layout(0, 1, 1, 0, Recompute.NONE, 1)
    with pytest.raises(ValueError, match="^global_batch:"):
        Layout(1, 1, 4, 0, Recompute.NONE, 2).micro_batches(12)
