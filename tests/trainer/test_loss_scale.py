import pytest
import torch

from cliffguard.trainer.loss_scale import AdaptiveLossScaler, LossScaleConfig


def model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def backward(scaler, model, x_scale=1.0):
    model.zero_grad()
    loss = model(torch.ones(2, 4) * x_scale).sum()
    scaler.scale_loss(loss).backward()


def test_overflow_skips_the_step_and_backs_off():
    model, opt = model_and_opt()
    scaler = AdaptiveLossScaler(LossScaleConfig(init_scale=1024.0))
    before = [p.clone() for p in model.parameters()]
    backward(scaler, model)
    model.weight.grad[0, 0] = float("inf")
    assert scaler.step(opt, model.parameters()) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.scale == 512.0 and scaler.skipped == 1 and scaler.last_decision == "overflow"


def test_finite_step_applies_unscaled_gradients():
    model, opt = model_and_opt()
    ref, ref_opt = model_and_opt()
    scaler = AdaptiveLossScaler(LossScaleConfig(init_scale=256.0))
    backward(scaler, model)
    assert scaler.step(opt, model.parameters()) is True
    ref(torch.ones(2, 4)).sum().backward()
    ref_opt.step()
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, b)


def test_grows_when_the_histogram_shows_underflow():
    model, opt = model_and_opt()
    cfg = LossScaleConfig(init_scale=1.0, growth_interval=1)
    scaler = AdaptiveLossScaler(cfg)
    backward(scaler, model, x_scale=1e-7)  # weight grads 2e-7 << 2^-14 at scale 1
    scaler.step(opt, model.parameters())
    assert scaler.last_underflow > 0.5 and scaler.last_decision == "underflow" and scaler.scale == 2.0


def test_shrinks_before_overflow_when_the_top_tail_nears_the_limit():
    model, opt = model_and_opt()
    scaler = AdaptiveLossScaler(LossScaleConfig(init_scale=2.0**14))
    backward(scaler, model)  # |g·scale| = 2·2^14 = 32768: within 2^3 of 65504
    assert scaler.step(opt, model.parameters()) is True
    assert scaler.last_decision == "headroom" and scaler.scale == 2.0**13


def test_holds_when_healthy_and_respects_growth_interval():
    model, opt = model_and_opt()
    scaler = AdaptiveLossScaler(LossScaleConfig(init_scale=64.0, growth_interval=3))
    decisions = []
    for _ in range(3):
        backward(scaler, model, x_scale=1e-7)
        scaler.step(opt, model.parameters())
        decisions.append(scaler.last_decision)
    assert decisions == ["hold", "hold", "underflow"]


def test_disabled_still_skips_non_finite():
    model, opt = model_and_opt()
    scaler = AdaptiveLossScaler(LossScaleConfig(enabled=False))
    backward(scaler, model)
    model.bias.grad[0] = float("nan")
    assert scaler.step(opt, model.parameters()) is False and scaler.scale == 1.0 and scaler.skipped == 1


def test_state_round_trip():
    scaler = AdaptiveLossScaler(LossScaleConfig(init_scale=128.0))
    scaler.scale, scaler.skipped, scaler.since_change = 32.0, 3, 7
    other = AdaptiveLossScaler()
    other.load_state_dict(scaler.state_dict())
    assert (other.scale, other.skipped, other.since_change) == (32.0, 3, 7)


@pytest.mark.parametrize("kw, field", [({"growth_factor": 1.0}, "growth_factor"), ({"backoff_factor": 1.0}, "backoff_factor"),
                                       ({"init_scale": 0.5}, "init_scale")])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LossScaleConfig(**kw)
