import pytest
import torch

from cliffguard.trainer.clipping import clip_per_layer, clip_per_layer_norms


def layers(*grads: list[float]) -> list[tuple[str, torch.nn.Parameter]]:
    out = []
    for i, g in enumerate(grads):
        p = torch.nn.Parameter(torch.zeros(len(g)))
        p.grad = torch.tensor(g)
        out.append((f"l{i}", p))
    return out


def test_only_layers_over_the_limit_are_clipped_to_it():
    named = layers([3.0, 4.0], [0.3, 0.4], [0.0, 10.0])
    n, norms = clip_per_layer_norms(named, max_norm=1.0)
    assert n == 2
    assert norms == pytest.approx({"l0": 5.0, "l1": 0.5, "l2": 10.0})
    after = [float(p.grad.norm()) for _, p in named]
    assert after == pytest.approx([1.0, 0.5, 1.0], rel=1e-4)
    assert torch.allclose(named[0][1].grad, torch.tensor([0.6, 0.8]), atol=1e-5)  # direction kept


def test_nothing_clipped_under_the_limit():
    named = layers([0.1], [0.2])
    assert clip_per_layer(named, max_norm=1.0) == 0
    assert [float(p.grad[0]) for _, p in named] == pytest.approx([0.1, 0.2])


def test_non_finite_layers_are_left_for_the_skip_logic():
    named = layers([float("nan"), 1.0], [5.0])
    assert clip_per_layer(named, max_norm=1.0) == 1
    assert torch.isnan(named[0][1].grad[0])


def test_on_a_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    model(torch.randn(4, 8)).pow(2).sum().mul(1000).backward()
    n = clip_per_layer(model.named_parameters(), max_norm=0.5)
    assert n == 4
    assert all(float(p.grad.norm()) <= 0.5 + 1e-4 for p in model.parameters())


def test_bad_limit():
    with pytest.raises(ValueError, match="^max_norm:"):
        clip_per_layer(layers([1.0]), 0.0)
