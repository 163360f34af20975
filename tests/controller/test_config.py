"""``ControllerConfig``'s process-wide GC threshold (controller/config.py)."""

from __future__ import annotations

import gc

import pytest

from cliffguard.controller.config import ControllerConfig


@pytest.fixture
def gc_threshold():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_gc_threshold_is_set_for_the_young_generation_only(gc_threshold):
    gc.set_threshold(700, 10, 10)
    ControllerConfig(gc_gen0_threshold=12_345).apply_gc_threshold()
    assert gc.get_threshold() == (12_345, 10, 10)


def test_gc_threshold_zero_keeps_pythons(gc_threshold):
    gc.set_threshold(700, 10, 10)
    ControllerConfig(gc_gen0_threshold=0).apply_gc_threshold()
    assert gc.get_threshold() == (700, 10, 10)


def test_negative_gc_threshold_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^gc_gen0_threshold: "):
        ControllerConfig(gc_gen0_threshold=-1)
