"""The scenarios: one per hole of the hostile-input issue, plus the attacks the service held.

A scenario is a function ``(Ctx) -> Measured`` registered with ``@scenario``; each family module
(``s_*.py``) holds the scenarios of one part of the system.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from bench.faults.harness import Ctx, Measured

FAMILIES = ("s_store", "s_rules", "s_agent", "s_checkpoints", "s_commands", "s_ops")


@dataclass(frozen=True)
class Scenario:
    name: str
    hole: str
    """What it covers: the issue's hole number and words, or the attack that held."""
    func: Callable[[Ctx], Measured]
    timeout_s: float = 120.0
    smoke: bool = False
    """Part of ``--smoke`` (CI): fast, real broker + SQLite only."""
    postgres: bool = False

    @property
    def family(self) -> str:
        return self.func.__module__.rsplit(".", 1)[-1]


_REGISTRY: dict[str, Scenario] = {}


def scenario(name: str, hole: str, *, timeout_s: float = 120.0, smoke: bool = False,
             postgres: bool = False) -> Callable[[Callable[[Ctx], Measured]], Callable[[Ctx], Measured]]:
    def register(func: Callable[[Ctx], Measured]) -> Callable[[Ctx], Measured]:
        if name in _REGISTRY:
            raise ValueError(f"scenario {name!r} registered twice")
        _REGISTRY[name] = Scenario(name, hole, func, timeout_s, smoke, postgres)
        return func
    return register


def scenarios() -> dict[str, Scenario]:
    """Every registered scenario, in registration order (family by family)."""
    for family in FAMILIES:
        importlib.import_module(f"bench.faults.{family}")
    return dict(_REGISTRY)
