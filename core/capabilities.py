"""Which commands a run can apply: declared by its trainer integration in ``run.started``.

The controller sends a run only the commands it declared. A ``run.started`` without the field
comes from an agent older than the declaration and is read as every command (those agents were
the bundled trainer's, which applies them all).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cliffguard.core.enums import CommandType

ALL: tuple[CommandType, ...] = tuple(CommandType)
"""Every command: the bundled trainer and the recovery kit apply them all."""
REPORT_ONLY: tuple[CommandType, ...] = ()
"""No command: an integration that only reports (e.g. the Accelerate tracker)."""


def normalize(caps: Iterable[CommandType | str]) -> tuple[CommandType, ...]:
    """``caps`` as CommandType values in the enum's order, each once; raises ValueError on an
    unknown name."""
    given = set()
    for c in caps:
        try:
            given.add(CommandType(c))
        except ValueError:
            raise ValueError(f"capabilities: unknown command {c!r}") from None
    return tuple(c for c in CommandType if c in given)


def declared(run_started: dict[str, Any]) -> tuple[CommandType, ...]:
    """The capabilities a decoded ``run.started`` payload declares (every command when the field
    is absent)."""
    raw = run_started.get("capabilities")
    return ALL if raw is None else normalize(raw)


def describe(stored: list[str] | None) -> str:
    """A run's stored capabilities for people: ``all`` (none declared), ``none`` (report-only) or the list."""
    if stored is None:
        return "all"
    return ", ".join(stored) if stored else "none (alerts only)"


def describe_lr_scale(applied: float | None, asked: float | None) -> str:
    """The LR scale the trainer applied, and what the controller asked for when that differs (a
    rollback in flight, or one the trainer never applied): never an asked value shown as applied."""
    shown = "-" if applied is None else f"{applied:g}"
    if asked is not None and (applied is None or abs(applied - asked) > 1e-12):
        shown += f" (asked {asked:g})"
    return shown
