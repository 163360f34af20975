"""Which rules a detector runs, in which order, and how each is built from the rules config.

A ``RuleRegistry`` is an immutable, ordered mapping name -> factory(config) -> ``Rule``. The
controller's table is ``controller.detect.RULES`` (next to ``RulesConfig``, whose fields the
factories read); adding a rule there is one ``with_rule`` entry. Order matters: it is the order
in which the detector calls the rules, hence the order of their verdicts for one event.

Generic in the config type so this module needs nothing from controller/detect.py (no cycle).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from cliffguard.controller.rules.base import Rule

C = TypeVar("C")
RuleFactory = Callable[[C], Rule]


class RuleRegistry(Generic[C]):
    def __init__(self, *, reserved: frozenset[str] = frozenset()) -> None:
        self._factories: dict[str, RuleFactory[C]] = {}
        self.reserved = reserved
        """Names a rule may not take (the detector's own state keys sit beside the rules')."""

    def with_rule(self, name: str, factory: RuleFactory[C]) -> RuleRegistry[C]:
        """A copy with ``name`` appended (called last for each event)."""
        if not name.isidentifier():
            raise ValueError(f"name: {name!r} must be an identifier (it is a state key)")
        if name in self._factories:
            raise ValueError(f"name: rule {name!r} is already registered")
        if name in self.reserved:
            raise ValueError(f"name: {name!r} is reserved for the detector's own state")
        out = RuleRegistry[C](reserved=self.reserved)
        out._factories = {**self._factories, name: factory}
        return out

    def without(self, name: str) -> RuleRegistry[C]:
        """A copy without ``name`` (e.g. a test isolating one rule)."""
        if name not in self._factories:
            raise ValueError(f"name: no rule {name!r} is registered")
        out = RuleRegistry[C](reserved=self.reserved)
        out._factories = {k: f for k, f in self._factories.items() if k != name}
        return out

    def build(self, config: C) -> dict[str, Rule]:
        """One fresh instance of every rule, in registry order."""
        rules: dict[str, Rule] = {}
        for name, factory in self._factories.items():
            rule = factory(config)
            if not isinstance(rule, Rule):
                raise TypeError(f"rule {name!r}: {type(rule).__name__} does not implement Rule")
            if rule.name != name:
                raise ValueError(f"rule {name!r}: the instance calls itself {rule.name!r}")
            rules[name] = rule
        return rules

    def names(self) -> list[str]:
        return list(self._factories)

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def __len__(self) -> int:
        return len(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories
