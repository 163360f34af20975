"""The controller's loss rules (controller/rules/loss.py) and their figures on the labelled suite."""

from __future__ import annotations

import json
import math
import random

import pytest

from cliffguard.controller.backtest import replay_points
from cliffguard.controller.detect import RulesConfig
from cliffguard.controller.rules.divergence import DivergenceConfig
from cliffguard.controller.rules.loss import LossRules, LossSpikeConfig
from cliffguard.controller.verdict import Action
from cliffguard.core.enums import Level
from tests.controller.synthetic import base_curve, inject, max_trailing_z, replay_alarms, score, suite


def flat(n: int, start: int = 0, center: float = 2.0, amp: float = 0.02) -> list[tuple[int, float]]:
    return [(start + i, center + amp * ((i % 5) - 2)) for i in range(n)]


MODERATE = 2.08
"""4σ over flat() (σ at its floor, 1% of the median): a warning, short of k_crit alone."""
SPIKE = 2.4
"""+20%, 20σ over flat(): critical on its own evidence."""


def feed(rules: LossRules, points) -> list:
    return [v for s, x in points for v in rules.observe(s, x)]


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="^rebaseline_after:"):
        LossSpikeConfig(rebaseline_after=-1)
    with pytest.raises(ValueError, match="^budget:"):
        LossSpikeConfig(budget=0)  # the parent's checks still run
    assert LossSpikeConfig().budget == 1.0


def test_one_warn_and_one_critical_per_excursion_with_the_onset_step():
    rules = LossRules()
    assert feed(rules, flat(50)) == []
    verdicts = feed(rules, [(50 + i, MODERATE) for i in range(10)])
    assert [(v.rule, v.level, v.step, v.onset_step) for v in verdicts] == [
        ("loss_spike", Level.WARN, 50, 50),
        ("loss_spike", Level.CRITICAL, 52, 50),  # the third 4σ point's evidence passes the level
    ]
    assert verdicts[0].action is Action.ALERT and verdicts[1].action is Action.RECOVER
    ev = verdicts[1].evidence
    assert ev["median"] == pytest.approx(2.0) and ev["n"] == 50 and ev["last"][-1] == [52, MODERATE]
    assert ev["sigmas"] == pytest.approx(4.0) and ev["weight"] >= ev["weight_level"]
    # back to normal ends the excursion; the next spike is reported again
    assert feed(rules, flat(5, start=60)) == []
    again = feed(rules, [(65, MODERATE)])
    assert [(v.level, v.onset_step) for v in again] == [(Level.WARN, 65)]


def test_a_single_rare_outlier_is_critical_at_once_a_moderate_one_only_warns():
    # +70% at 70σ: its evidence alone passes the level; validation (or the backtest's proxy) then
    # finds the weights fine and the run resumes
    rules = LossRules()
    feed(rules, flat(50))
    verdicts = feed(rules, [(50, 2.0 * 1.7)] + flat(20, start=51))
    assert [(v.level, v.step) for v in verdicts] == [(Level.CRITICAL, 50)]
    assert "evidence" in verdicts[0].evidence["reason"]
    rules = LossRules()
    feed(rules, flat(50))
    assert [v.level for v in feed(rules, [(50, MODERATE)] + flat(20, start=51))] == [Level.WARN]


def test_nonfinite_is_critical_at_once_and_asks_for_recovery():
    rules = LossRules()
    feed(rules, flat(30))
    (v,) = rules.observe(30, math.nan)
    assert v.rule == "nonfinite" and v.level is Level.CRITICAL and v.action is Action.RECOVER
    assert v.onset_step == 30 and "nan" in v.message


def test_slow_divergence_is_caught_with_its_onset_while_no_point_is_a_spike():
    rules = LossRules(divergence=DivergenceConfig(grace_steps=0))
    rng = random.Random(4)  # 1% Gaussian noise: the climb trails the window's median by ~1.5σ
    points = [(i, 2.0 + 0.02 * rng.gauss(0, 1)) for i in range(100)]
    points += [(100 + i, 2.0 * (1 + 0.0003 * i) + 0.02 * rng.gauss(0, 1)) for i in range(400)]
    verdicts = feed(rules, points)
    crit = [v for v in verdicts if v.level is Level.CRITICAL]
    # a climb that goes on is reported again only once it has been the baseline for rebaseline_after steps
    assert {v.rule for v in crit} == {"divergence"}
    assert all(b.step - a.step >= LossSpikeConfig().rebaseline_after for a, b in zip(crit, crit[1:], strict=False))
    assert crit[0].action is Action.RECOVER and crit[0].step <= 400
    assert 50 <= crit[0].onset_step <= 100  # at or before the true onset (100), within the margin
    assert "rising since step" in crit[0].message and crit[0].evidence["statistic"] >= 40


def test_divergence_is_not_reported_again_for_the_points_of_a_critical_spike():
    rules = LossRules(divergence=DivergenceConfig(grace_steps=0))
    feed(rules, flat(50))
    verdicts = feed(rules, [(50 + i, SPIKE) for i in range(60)])
    assert [v.rule for v in verdicts] == ["loss_spike"]  # critical at once, then the excursion goes on


def test_divergence_re_arms_after_the_sum_drains():
    rules = LossRules(divergence=DivergenceConfig(grace_steps=0, threshold=5))
    feed(rules, flat(50))
    first = feed(rules, [(50 + i, 2.05) for i in range(20)])
    assert [v.rule for v in first] == ["divergence"]
    feed(rules, flat(100, start=70) + [(170 + i, 1.9) for i in range(3)])  # back to normal
    assert rules.divergence.state_dict()["sum"] == 0  # drained: the rule re-arms
    second = feed(rules, [(173 + i, 2.05) for i in range(20)])
    assert [v.rule for v in second] == ["divergence"]


def test_a_long_level_shift_becomes_the_new_baseline():
    rules = LossRules(LossSpikeConfig(rebaseline_after=30))
    feed(rules, flat(50))
    shifted = [(50 + i, 3.0 + 0.02 * ((i % 5) - 2)) for i in range(60)]
    verdicts = feed(rules, shifted)
    assert [v.level for v in verdicts] == [Level.CRITICAL]  # +50%: extreme, critical at once
    assert rules.window_evidence()["median"] == pytest.approx(3.0, abs=0.03)
    assert feed(rules, flat(10, start=110, center=3.0)) == []


def test_a_long_run_of_nonfinite_losses_is_never_taken_as_a_baseline():
    rules = LossRules(LossSpikeConfig(rebaseline_after=30))
    feed(rules, flat(50))
    feed(rules, [(50 + i, math.nan) for i in range(40)])
    assert rules.window_evidence()["median"] == pytest.approx(2.0)


def test_rewind_forgets_the_excursion_but_keeps_the_healthy_window():
    rules = LossRules()
    feed(rules, flat(50))
    feed(rules, [(50 + i, MODERATE) for i in range(5)])  # critical reported
    window = rules.spike.state_dict()["window"]
    rules.rewind()
    assert rules.spike.state_dict()["window"] == window and not rules.spike.alarm
    verdicts = feed(rules, [(45, MODERATE), (46, MODERATE), (47, MODERATE)])  # replayed steps judged afresh
    assert [(v.level, v.onset_step) for v in verdicts] == [(Level.WARN, 45), (Level.CRITICAL, 45)]


def test_state_dict_round_trips_through_json_mid_excursion():
    rules = LossRules()
    feed(rules, flat(50))
    feed(rules, [(50, MODERATE)])
    twin = LossRules()
    twin.load_state_dict(json.loads(json.dumps(rules.state_dict())))
    a = feed(rules, [(51, MODERATE), (52, MODERATE)])
    b = feed(twin, [(51, MODERATE), (52, MODERATE)])
    assert [(v.level, v.step, v.onset_step, v.evidence) for v in a] == [(v.level, v.step, v.onset_step, v.evidence) for v in b]
    assert [(v.level, v.onset_step) for v in b] == [(Level.CRITICAL, 50)]
    empty = LossRules()
    empty.load_state_dict(json.loads(json.dumps(LossRules().state_dict())))
    assert empty.state_dict() == LossRules().state_dict()


# ---------------------------------------------------------------------------------------------
# Figures on the labelled suite (held-out seed: the defaults were tuned on seeds 1 and 3)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def held_out():
    return suite(10, 4, seed=7, length=1500)


def alarms(config: RulesConfig):
    return lambda curve: replay_alarms(curve, config)


def test_defaults_meet_recall_and_false_alarm_targets_on_the_suite(held_out):
    onsets = []

    def run(curve):
        events = replay_points(curve.points(), RulesConfig())
        for lab in curve.labels:
            crit = [e for e in events if e.level == "critical" and lab.onset <= e.step <= lab.end]
            if crit:
                onsets.append((lab.kind, crit[0].onset_step - lab.onset))
        return replay_alarms(curve, RulesConfig())

    s = score(held_out, run)
    # the rollback target must be at or before the first step of the excursion, and not far before
    assert onsets and all(-100 <= err <= 0 for _, err in onsets), onsets
    assert all(err == 0 for kind, err in onsets if kind != "divergence"), onsets
    figures = s.summary()
    for kind in ("stepup", "nan", "single", "divergence"):
        assert s.recall(kind) == 1.0, figures
    # Where the synthetic labels and the real curves disagree, the real ones won: one of the four
    # few-step spikes (+174%, 3 points) sits on a curve whose own benign outliers reach +46σ; its
    # first point's evidence is a hair under the level, its second is critical, and the loss is
    # back within three points, so the backtest's validation proxy resumes (scored as a pause that
    # validated normal, not a critical). The old fixed +25%/10σ "extreme" rule called it at once
    # and also paused for 16 one-step data outliers of the real per-rank logs.
    assert s.recall("few") >= 0.75, figures
    assert s.median_delay("nan") == 0 and s.median_delay("few") <= 2, figures
    assert s.median_delay("divergence") <= 200, figures
    assert s.clean_curves_with_false_critical == 0 and s.false_critical == 0, figures
    # a benign +15-70% outlier may be paused for and validated (extreme rule), never rolled back
    assert s.outliers > 50 and s.outliers_called_critical == 0, figures


def test_without_the_divergence_rule_slow_divergences_are_missed(held_out):
    curves = [c for c in held_out if c.labels and c.labels[0].kind == "divergence"]
    assert all(max_trailing_z(c) < 5 for c in curves)  # no single point of the trend is a 5σ spike
    off = RulesConfig(divergence=DivergenceConfig(enabled=False))
    # the spike rule's evidence, adding up over the climb's points, finds some; not all
    assert score(curves, alarms(off)).recall("divergence") < 1.0
    assert score(curves, alarms(RulesConfig())).recall("divergence") == 1.0


def test_onset_step_names_the_first_step_of_an_injected_spike():
    curve = inject(base_curve(4242, 1500), "few", 4242)
    (label,) = curve.labels
    crit = [e for e in replay_points(curve.points()) if e.level == "critical"]
    assert crit and crit[0].onset_step == label.onset and crit[0].step >= label.onset
