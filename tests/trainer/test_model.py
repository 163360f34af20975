import math

import pytest
import torch

from cliffguard.trainer.model import GPT, GPTConfig


def small() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))


def test_forward_shapes_and_initial_loss_near_uniform():
    m = small()
    x = torch.randint(0, 256, (3, 16))
    logits, loss = m(x, torch.randint(0, 256, (3, 16)))
    assert logits.shape == (3, 16, 256)
    # A fresh model predicts near-uniform bytes: loss ~ ln(256).
    assert abs(loss.item() - math.log(256)) < 0.3
    _, none = m(x)
    assert none is None


def test_training_reduces_loss_on_a_fixed_batch():
    m = small()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.randint(0, 256, (4, 16))
    first = None
    for _ in range(30):
        _, loss = m(x, x.roll(-1, 1))
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first * 0.7


def test_flops_per_token_is_palm_formula():
    m = small()
    cfg = m.cfg
    n = sum(p.numel() for p in m.parameters()) - m.transformer.wpe.weight.numel()
    assert m.num_params(non_embedding=True) == n
    assert m.num_params() == n + 16 * 32
    assert m.flops_per_token(16) == 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * 16


def test_sequence_longer_than_context_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        small()(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize(
    "kwargs, field", [({"n_embd": 30, "n_head": 4}, "n_embd"), ({"dropout": 1.0}, "dropout"), ({"n_layer": 0}, "n_layer")]
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        GPTConfig(**kwargs)
