import math

import pytest

from cliffguard.plan.model import ModelShape, Recompute

TINY = ModelShape(layers=2, hidden=4, heads=2, vocab=10, seq=6)


def test_params_hand_computed():
    # layer: 12·4² + 13·4 = 244; embedding (10 + 6)·4 = 64
    assert TINY.params_per_layer == 244
    assert TINY.params == 2 * 244 + 64


def test_train_flops_per_token_hand_computed():
    # forward per layer per token: 24·16 + 4·6·4 = 480; logits fwd+bwd: 6·10·4 = 240
    assert TINY.train_flops_per_token(Recompute.NONE) == 2 * 3 * 480 + 240
    assert TINY.train_flops_per_token(Recompute.SELECTIVE) == 2 * (3 * 480 + 96) + 240
    assert TINY.train_flops_per_token(Recompute.FULL) == 2 * 4 * 480 + 240


def test_full_recompute_matches_narayanan_formula():
    m = ModelShape(96, 12288, 96, 51200, 2048)
    n_layers, h, s, v = m.layers, m.hidden, m.seq, m.vocab
    expected = 96 * n_layers * h**2 * (1 + s / (6 * h) + v / (16 * n_layers * h))
    assert m.train_flops_per_token(Recompute.FULL) == pytest.approx(expected, rel=1e-12)


def test_from_params_gives_gpt3_shape_for_175b():
    m = ModelShape.from_params(175e9)
    assert (m.layers, m.hidden, m.heads) == (96, 12288, 96)
    assert m.params == pytest.approx(175e9, rel=0.01)


@pytest.mark.parametrize("kwargs, field", [
    ({"layers": 0, "hidden": 4, "heads": 2}, "layers"),
    ({"layers": 2, "hidden": 100, "heads": 7}, "heads"),
    ({"layers": 2, "hidden": 4, "heads": 2, "seq": -1}, "seq"),
])
def test_bad_shapes_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ModelShape(**kwargs)


@pytest.mark.parametrize("params", [0, -1.0, math.nan, math.inf])
def test_from_params_rejects_nonpositive(params):
    with pytest.raises(ValueError, match="^params:"):
        ModelShape.from_params(params)
