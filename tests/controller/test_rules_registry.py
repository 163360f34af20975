"""RuleRegistry (controller/rules/registry.py) and the controller's table (controller/detect.py RULES)."""

from __future__ import annotations

import pytest

from cliffguard.controller.detect import DETECTOR_STATE_KEYS, RULES, RulesConfig
from cliffguard.controller.rules.base import RankScope, RewindingRule, Rule, TickingRule
from cliffguard.controller.rules.heartbeat import HeartbeatRule
from cliffguard.controller.rules.registry import RuleRegistry
from cliffguard.core.enums import EventType


def test_the_controller_table_keeps_the_stored_state_keys_and_the_calling_order():
    # The names are the keys of the stored detector state: renaming one drops its state.
    assert RULES.names() == ["heartbeat", "straggler", "mfu", "memory", "loss", "held", "grad_norm", "loss_scale",
                            "elastic", "hang", "data", "sdc"]


def test_every_registered_rule_implements_the_protocol_and_declares_its_inputs():
    rules = RULES.build(RulesConfig())
    for name, rule in rules.items():
        assert isinstance(rule, Rule) and rule.name == name
        assert rule.consumes and rule.consumes <= frozenset(EventType)
    scopes = {n: r.scope for n, r in rules.items()}
    assert [n for n, s in scopes.items() if s is RankScope.LOSS_RANK] == ["loss", "held", "grad_norm", "loss_scale", "sdc"]
    assert [n for n, r in rules.items() if isinstance(r, TickingRule)] == ["heartbeat", "hang"]
    assert [n for n, r in rules.items() if isinstance(r, RewindingRule)] == ["loss", "held"]
    assert rules["heartbeat"].consumes == frozenset(EventType)


def test_each_build_makes_fresh_rules_from_the_config():
    a, b = RULES.build(RulesConfig()), RULES.build(RulesConfig())
    assert all(a[n] is not b[n] for n in a)


@pytest.mark.parametrize("name, match", [
    ("loss", "already registered"),
    ("rewinds", "reserved"),
    ("not a key", "identifier"),
])
def test_bad_names_are_refused(name, match):
    with pytest.raises(ValueError, match=f"^name: .*{match}"):
        RULES.with_rule(name, lambda c: HeartbeatRule(c.heartbeat))


def test_reserved_names_are_the_detectors_own_state_keys():
    assert RULES.reserved == DETECTOR_STATE_KEYS


def test_with_rule_and_without_return_copies():
    grown = RULES.with_rule("extra", lambda c: HeartbeatRule(c.heartbeat))
    assert "extra" in grown and "extra" not in RULES and len(grown) == len(RULES) + 1
    assert "mfu" not in RULES.without("mfu") and "mfu" in RULES
    with pytest.raises(ValueError, match="^name: no rule"):
        RULES.without("nope")


def test_build_checks_what_a_factory_returns():
    misnamed = RuleRegistry[RulesConfig]().with_rule("beat", lambda c: HeartbeatRule(c.heartbeat))
    with pytest.raises(ValueError, match="calls itself 'heartbeat'"):
        misnamed.build(RulesConfig())
    not_a_rule = RuleRegistry[RulesConfig]().with_rule("thing", lambda c: object())
    with pytest.raises(TypeError, match="does not implement Rule"):
        not_a_rule.build(RulesConfig())
