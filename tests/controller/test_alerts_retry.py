"""Retry policy: status classification, exponential backoff with full jitter, the give-up horizon."""

from __future__ import annotations

import random

import pytest

from cliffguard.controller.alerts.http import parse_retry_after
from cliffguard.controller.alerts.retry import (
    Outcome,
    backoff_ceiling,
    classify_status,
    next_attempt_at,
    retry_delay,
)
from testing.alerts import ConstRng


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.DELIVERED), (202, Outcome.DELIVERED), (204, Outcome.DELIVERED),
        (410, Outcome.GONE),
        (500, Outcome.RETRY), (502, Outcome.RETRY), (503, Outcome.RETRY), (408, Outcome.RETRY), (429, Outcome.RETRY),
        (301, Outcome.RETRY),
        (400, Outcome.REJECTED), (401, Outcome.REJECTED), (403, Outcome.REJECTED), (404, Outcome.REJECTED),
    ],
)
def test_status_classification(status, outcome):
    assert classify_status(status) == outcome


def test_ceiling_doubles_per_attempt_up_to_the_cap():
    ceilings = [backoff_ceiling(n, 2.0, 60.0) for n in range(1, 9)]
    assert ceilings == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert backoff_ceiling(10_000, 2.0, 60.0) == 60.0  # no overflow on a long outage


def test_full_jitter_spans_zero_to_the_ceiling():
    top = [retry_delay(n, base_s=1.0, cap_s=100.0, rng=ConstRng(0.999999)) for n in (1, 2, 3)]
    assert top == pytest.approx([1.0, 2.0, 4.0], rel=1e-5)
    assert retry_delay(5, base_s=1.0, cap_s=100.0, rng=ConstRng(0.0)) == 0.0
    rng = random.Random(7)
    samples = [retry_delay(4, base_s=1.0, cap_s=100.0, rng=rng) for _ in range(2000)]
    assert all(0.0 <= s <= 8.0 for s in samples)
    assert min(samples) < 0.5 and max(samples) > 7.5  # spread over the whole range, not clustered


def test_retry_after_raises_the_wait_within_the_cap():
    assert retry_delay(1, base_s=1.0, cap_s=100.0, rng=ConstRng(0.5), retry_after_s=30.0) == 30.0
    assert retry_delay(1, base_s=1.0, cap_s=100.0, rng=ConstRng(0.5), retry_after_s=1e6) == 100.0
    assert retry_delay(3, base_s=1.0, cap_s=100.0, rng=ConstRng(0.5), retry_after_s=0.1) == 2.0


def test_retry_after_header_forms():
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 - 60) == pytest.approx(60.0)
    assert parse_retry_after("whenever") is None and parse_retry_after(None) is None


def test_last_attempt_lands_on_the_horizon_then_gives_up():
    assert next_attempt_at(now=100.0, created_at=0.0, delay_s=10.0, give_up_after_s=1000.0) == 110.0
    assert next_attempt_at(now=995.0, created_at=0.0, delay_s=10.0, give_up_after_s=1000.0) == 1000.0
    assert next_attempt_at(now=1000.0, created_at=0.0, delay_s=10.0, give_up_after_s=1000.0) is None
