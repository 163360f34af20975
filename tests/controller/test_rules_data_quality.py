"""The data rules (controller/rules/data_quality.py) on the events the real data watch makes of
real batches: code windows of the standard library, and from step 250 a shift to prose, a
duplicate burst, garbled text or one random-byte batch (testing/data_watch.py). Each raises its
verdict in the window holding its first step (within 10 steps: ``every``), naming sample ids of
the affected steps; clean runs raise none."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.rules.data_quality import STATISTICS, DataQualityConfig, DataQualityRule
from cliffguard.core.enums import Level
from cliffguard.core.events import Event, make_event
from testing.data_watch import code_batches, garble, shift, watch

AT = 250
DETECT_WITHIN = 10
"""Steps from the first affected step to the verdict: the window holding it (``every`` = 10)."""


def _ids(steps: range) -> set[int]:
    return {i for _, _, ids in code_batches(steps) for i in ids}


def _run(events: list[Event], rule: DataQualityRule | None = None):
    rule = rule or DataQualityRule()
    return [v for e in events for v in rule.on_event(e)]


def _dup_burst(n: int = 20):
    first = None
    for step, x, ids in code_batches(range(AT + 60)):
        if AT <= step < AT + n:
            first = first or (x, ids)
            x, ids = first[0].clone(), list(first[1])
        yield step, x, ids


def _with(fault, steps: range):
    for step, x, ids in code_batches(range(AT + 60)):
        yield fault(step, x, ids) if step in steps else (step, x, ids)


def _random_bytes(step, x, ids):
    return step, torch.randint(0, 256, x.shape, generator=torch.Generator().manual_seed(step)), ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_code_raises_nothing(seed):
    events = watch(code_batches(range(600), seed=seed))
    rule = DataQualityRule()
    assert _run(events, rule) == []
    assert set(rule._ranks[0].thresholds) == {s.name for s in STATISTICS}


@pytest.mark.parametrize(("fault", "verdict", "named"), [
    (lambda: _with(shift, range(AT, 10**9)), "data_drift", range(AT, AT + DETECT_WITHIN)),
    (lambda: _dup_burst(), "data_duplicates", range(AT, AT + 1)),
    (lambda: _with(garble, range(AT, AT + 10)), "data_garbled", range(AT, AT + DETECT_WITHIN)),
    (lambda: _with(_random_bytes, {AT + 3}), "data_perplexity", range(AT + 3, AT + 4)),
])
def test_each_fault_raises_its_verdict_within_a_window_naming_its_samples(fault, verdict, named):
    verdicts = [v for v in _run(watch(fault())) if v.rule == verdict]
    assert len(verdicts) == 1, [v.message for v in verdicts]
    v = verdicts[0]
    assert AT <= v.step < AT + DETECT_WITHIN and v.level is Level.WARN and v.rank == 0
    ids = v.evidence["sample_ids"]
    assert ids and set(ids) <= _ids(named)
    assert str(ids[0]) in v.message and "rank 0 at step" in v.message
    assert v.evidence["baseline_steps"] == [0, 199] and v.evidence["value"] > v.evidence["threshold"]


def test_the_garbled_verdict_names_the_garbled_sequences():
    v = next(v for v in _run(watch(_with(garble, range(AT, AT + 10)))) if v.rule == "data_garbled")
    garbled_ids = {ids[i] for _, _, ids in code_batches(range(AT, AT + 10)) for i in range(0, 8, 2)}
    assert set(v.evidence["sample_ids"]) <= garbled_ids and v.evidence["value"] == 0.5


def test_a_perplexity_verdict_names_its_step_and_fires_once_per_excursion():
    events = watch(_with(_random_bytes, {AT + 3, AT + 4, AT + 25}))
    found = [v for v in _run(events) if v.rule == "data_perplexity"]
    assert [(v.evidence["steps"], v.onset_step) for v in found] == [([AT + 3, AT + 4], AT + 3), ([AT + 25], AT + 25)]


def test_a_lasting_shift_is_one_verdict_and_the_rule_rearms_when_the_data_returns():
    back = range(AT, AT + 30)
    found = [v for v in _run(watch(_with(shift, back))) if v.rule == "data_drift"]
    assert [v.step for v in found] == [AT + 9]
    twice = _with(shift, set(back) | set(range(AT + 50, AT + 60)))
    assert [v.step for v in _run(watch(twice)) if v.rule == "data_drift"] == [AT + 9, AT + 59]


def test_a_window_too_small_to_judge_is_skipped():
    events = watch(_with(shift, range(AT, 10**9)))
    judged = events[:25]
    small = make_event("data.stats", "data-run", judged[-1].step + 1,
                       {**events[26].data, "sketch": [c // 10 for c in events[26].data["sketch"]]})
    assert [v.rule for v in _run([*judged, small]) if v.rule == "data_drift"] == []


def test_state_round_trips_in_the_baseline_and_after_it():
    events = watch(_with(shift, range(AT, 10**9)))
    straight = _run(events)
    for cut in (7, 23):
        first = DataQualityRule()
        _run(events[:cut], first)
        twin = DataQualityRule()
        twin.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert [(v.rule, v.step, v.evidence) for v in _run(events[cut:], twin)] == \
               [(v.rule, v.step, v.evidence) for v in straight]


def test_each_rank_has_its_own_baseline_and_ranks_beyond_max_ranks_are_left_out(caplog):
    rank0 = watch(code_batches(range(AT + 60)))
    rank1 = watch(_with(shift, range(AT, 10**9)), rank=1)
    rank2 = watch(_with(shift, range(AT, 10**9)), rank=2)
    rule = DataQualityRule(DataQualityConfig(max_ranks=2))
    with caplog.at_level(logging.WARNING):
        found = _run([e for trio in zip(rank0, rank1, rank2, strict=True) for e in trio], rule)
    assert {v.rank for v in found} == {1} and "rank 2 of run data-run left out" in caplog.text


def test_registered_in_the_detector_and_configurable():
    det = RunDetector(RulesConfig(data=DataQualityConfig(level="critical", baseline_windows=10)))
    found = [v for e in watch(_with(garble, range(150, 160))) for v in det.on_event(e)]
    assert any(v.rule == "data_garbled" and v.level is Level.CRITICAL for v in found)
    assert det.state_dict()["data"]["ranks"]["0"]["thresholds"]
    assert _run(watch(code_batches(range(300))), DataQualityRule(DataQualityConfig(enabled=False))) == []
