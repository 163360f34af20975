import math

import pytest

from cliffguard.hpo.divergence import DivergenceCheck
from cliffguard.hpo.space import SearchSpace


def test_non_finite_and_rise_diverge_healthy_does_not():
    check = DivergenceCheck(start_loss=2.0, rise_margin=0.5)
    assert check.observe(1.9) is None
    assert "above" in check.observe(3.1)
    assert "non-finite" in check.observe(math.nan)


def test_spike_rule_critical_diverges():
    check = DivergenceCheck(start_loss=100.0)
    for i in range(30):
        assert check.observe(2.0 + 0.01 * (i % 3)) is None
    assert "spike rule" in check.observe(5.0)


def test_space_rejects_non_power_of_two_batches():
    with pytest.raises(ValueError, match="batches"):
        SearchSpace(batches=[12])
