"""``[data.reweight]``: live reweighting's settings (trainer/reweight.py), apart so ``DataConfig``
(trainer/data.py) can hold them without importing the reweighter, which imports the sampler."""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class ReweightConfig:
    enabled: bool = False
    """Lower the sampling weight of sources that keep scoring badly (needs a manifest with ``live_reweight``)."""
    every: int = bounded(50, ge=1)
    """Steps between decisions (each scores rank 0's share of the steps since the last)."""
    bad_share: float = bounded(0.2, gt=0, le=1)
    """A source whose scored sequences are at least this share bad is lowered."""
    factor: float = bounded(0.5, gt=0, lt=1)
    """Its factor is multiplied by this per decision (and divided by it when it scores clean again)."""
    min_sequences: int = bounded(16, ge=1)
    """Sequences of a source a decision needs (fewer: no change)."""
    tolerance: float = bounded(2.0, ge=1)
    """A sequence is bad above ``tolerance`` times the manifest model's median perplexity (cliffguard data's)."""

    def __post_init__(self) -> None:
        check_declared(self)
