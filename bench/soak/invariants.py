"""The soak's invariants (pure): each a named check over what one seed left behind, with a count of
the cases that break it (0 = holds) and evidence lines for the first few.

The inputs (``Observed``) come from three sides that do not share a path: the store (what the
controller recorded), the witness (what the topics carried) and the trainer's own record and logs
(what it did). ``CHECKS`` is the one table of them, in the order the soak's table prints them; the
checks live by what they are about: data (checks_data.py), effects (checks_effects.py) and health
(checks_health.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.soak.checks_data import run_finished, steps_lost, steps_repeated, witnessed_stored
from bench.soak.checks_effects import (
    applied_twice,
    commands_repeated,
    fault_outcomes,
    incidents_repeated,
    incidents_unexplained,
    lr_unexplained,
    rolled_back_twice,
)
from bench.soak.checks_health import (
    GAP_BOUND_S,
    STUCK_BOUND_S,
    commands_stuck,
    commands_unknown,
    controller_exits,
    gap_after_faults,
    library_tracebacks,
    tracebacks,
)
from bench.soak.observed import Check, Observed

__all__ = ["CHECKS", "GAP_BOUND_S", "STUCK_BOUND_S", "Check", "Invariant", "Observed", "check_all"]


@dataclass(frozen=True)
class Invariant:
    name: str
    short: str
    """The table's column."""
    doc: str
    fn: Callable[[Observed, Check], None]


CHECKS: tuple[Invariant, ...] = (
    Invariant(
        "run_finished",
        "fin",
        "the run finished all its steps; training exited 0; stored as finished",
        run_finished,
    ),
    Invariant(
        "steps_lost",
        "lost",
        "every step the trainer ran is stored (retention's folds accounted)",
        steps_lost,
    ),
    Invariant("steps_repeated", "rep", "no step stored more often than the trainer ran it", steps_repeated),
    Invariant(
        "witnessed_not_stored",
        "wit",
        "every event the witness read (of the kinds stored by id) is stored",
        witnessed_stored,
    ),
    Invariant(
        "incidents_repeated", "inc2", "one incident per training fault's excursion", incidents_repeated
    ),
    Invariant("incidents_unexplained", "inc?", "no incident without a training fault", incidents_unexplained),
    Invariant("commands_repeated", "cmd2", "one command per incident, type and attempt", commands_repeated),
    Invariant("command_applied_twice", "app2", "no command id applied twice by the trainer", applied_twice),
    Invariant("incident_rolled_back_twice", "rb2", "no incident rolled back twice", rolled_back_twice),
    Invariant(
        "lr_unexplained",
        "lr?",
        "every lr_scale change the trainer applied is an incident's, and the "
        "store's lr_scale is the trainer's",
        lr_unexplained,
    ),
    Invariant(
        "fault_outcomes",
        "out",
        "each training fault got its expected outcome, or an incident that explains what happened instead",
        fault_outcomes,
    ),
    Invariant(
        "commands_stuck",
        "stuck",
        f"no command waits over {STUCK_BOUND_S:.0f}s outside faults for the broker's ack",
        commands_stuck,
    ),
    Invariant("commands_unknown", "cmd?", "every command on the topic is in the store", commands_unknown),
    Invariant(
        "gap_after_faults",
        "gap",
        f"after the last fault the store never stands still over "
        f"{GAP_BOUND_S:.0f}s while the trainer is ahead",
        gap_after_faults,
    ),
    Invariant(
        "tracebacks", "tb", "no Python traceback of this project's code (or uncaught) in any log", tracebacks
    ),
    Invariant(
        "library_tracebacks",
        "libtb",
        "no traceback a library logged from its own frames in any log (kafka-python on a dropped socket)",
        library_tracebacks,
    ),
    Invariant("controller_exits", "exit", "the controller exited only when killed, or 0", controller_exits),
)


def check_all(o: Observed) -> dict[str, Check]:
    out = {}
    for inv in CHECKS:
        c = Check()
        inv.fn(o, c)
        out[inv.name] = c
    return out
