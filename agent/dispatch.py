"""Commands applied by a table: ``CommandType`` -> how to check its arguments, which
``CommandTarget`` method applies it, and which trainer mode it leads to.

``dispatch`` does, in order, and acks the result:

1. no route for the type -> ``rejected`` (a type added to the enum without a route does nothing
   rather than pretend it was applied);
2. arguments checked -> ``rejected`` with the reason, before anything changes;
3. every mode the command may lead to must be a legal move from the current mode
   (agent/modes.py) -> else ``rejected`` (e.g. a rollback after a stop), again before any change;
4. the target applies it; an exception is ``failed`` with its message;
5. the mode moves: to the route's ``to`` when applied, to ``on_failure`` when not (a failed
   rollback pauses, so the controller can pick another step). A route without a target mode
   keeps the mode, except that a command answered while ``held`` ends the hold: the controller
   has taken over, so the run is ``paused`` and the guard's local timeout no longer applies.

A rejected command changes nothing, not even a hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cliffguard.agent.command_target import CommandTarget, Outcome
from cliffguard.agent.detail import detail_steps
from cliffguard.agent.lr_scale import check_lr_scale
from cliffguard.agent.modes import HELD, PAUSED, RUNNING, STOPPING, VALIDATING, ModeMachine
from cliffguard.core.enums import AckStatus, CheckpointKind, CommandType, TrainerMode
from cliffguard.core.events import Command

log = logging.getLogger(__name__)

Ack = Callable[..., None]
"""``ack(cmd, status, detail)``; a failed rollback adds ``available=`` (the steps every rank can restore)."""


@dataclass(frozen=True, slots=True)
class RollbackRequest:
    """A rollback command's arguments once range-checked (the wire form is core/payloads.py's
    ``RollbackArgs``)."""

    to_step: int
    lr_scale: float
    skip_data: tuple[int, int] | None


# Every Command was checked against core/events.py's COMMAND_ARG_SCHEMAS when it was built or
# decoded (required fields present, types right); these add the ranges the schema cannot say.


def _at_least(value: int, name: str, minimum: int) -> int:
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _lr_scale(args: Mapping[str, Any]) -> float:
    return check_lr_scale(args["lr_scale"])


def _rollback(args: Mapping[str, Any]) -> RollbackRequest:
    skip = args.get("skip_data")
    window: tuple[int, int] | None = None
    if skip is not None:
        if len(skip) != 2:
            raise ValueError(f"skip_data: must be [first, stop), got {skip!r}")
        first = _at_least(skip[0], "skip_data[0]", 0)
        window = (first, _at_least(skip[1], "skip_data[1]", first + 1))
    return RollbackRequest(_at_least(args["to_step"], "to_step", 0), _lr_scale(args), window)


def _batches(args: Mapping[str, Any]) -> int | None:
    return None if args.get("batches") is None else _at_least(args["batches"], "batches", 1)


def _kind(args: Mapping[str, Any]) -> CheckpointKind:
    return CheckpointKind(args.get("kind") or CheckpointKind.FULL)


def _none(args: Mapping[str, Any]) -> None:
    return None


def _restart(args: Mapping[str, Any]) -> None:
    from cliffguard.core.restart_plan import MODES

    if args.get("mode") not in MODES:
        raise ValueError(f"mode: one of {', '.join(MODES)}, got {args.get('mode')!r}")
    _at_least(args["life"], "life", 0)
    if args["mode"] == "exclude" and not (args.get("exclude_nodes") or args.get("exclude_devices")):
        raise ValueError("exclude_nodes: an exclude restart names the nodes (or devices) to leave out")
    for d in args.get("exclude_devices") or ():
        if not (isinstance(d.get("node"), str) and isinstance(d.get("slot"), int)):
            raise ValueError(f"exclude_devices: each one is {{node, slot}}, got {d!r}")


@dataclass(frozen=True, slots=True)
class Route:
    parse: Callable[[Mapping[str, Any]], Any]
    """Checks the command's arguments (ValueError = rejected) and returns what ``call`` gets."""
    call: Callable[[CommandTarget, Command, Any], Outcome]
    to: TrainerMode | None = None
    """The mode once applied; None keeps the mode (a hold becomes ``paused``)."""
    on_failure: TrainerMode | None = None
    """The mode when not applied; None keeps the mode (a hold becomes ``paused``)."""
    via: TrainerMode | None = None
    """A mode the target passes through while applying it (checked up front)."""


ROUTES: dict[CommandType, Route] = {
    CommandType.PAUSE: Route(_none, lambda t, c, a: t.pause(), to=PAUSED),
    CommandType.RESUME: Route(_none, lambda t, c, a: t.resume(), to=RUNNING),
    CommandType.VALIDATE: Route(_batches, lambda t, c, a: t.validate(c.id, a), via=VALIDATING),
    CommandType.ROLLBACK: Route(_rollback, lambda t, c, a: t.rollback(a.to_step, a.lr_scale, a.skip_data),
                                to=RUNNING, on_failure=PAUSED),
    CommandType.SET_LR_SCALE: Route(_lr_scale, lambda t, c, a: t.set_lr_scale(a)),
    CommandType.CHECKPOINT_NOW: Route(_kind, lambda t, c, a: t.checkpoint_now(a)),
    CommandType.STOP: Route(_none, lambda t, c, a: t.stop(f"stopped by command {c.id}"), to=STOPPING),
    # applied by the agent itself when it hands the command out (agent/detail.py)
    CommandType.DETAIL: Route(detail_steps, lambda t, c, a: Outcome.applied(f"per-rank step events for {a} steps")),
    # the mode stays: an applied restart makes the loop leave (the kit raises RestartRequested);
    # one for an earlier life changes nothing
    CommandType.RESTART: Route(_restart, lambda t, c, a: t.restart(c)),
}


def _kept(mode: TrainerMode) -> TrainerMode:
    return PAUSED if mode is HELD else mode


def apply(cmd: Command, target: CommandTarget, modes: ModeMachine,
          routes: Mapping[CommandType, Route] = ROUTES) -> Outcome:
    """Apply one command (steps 1-5 of the module docstring) without acking it."""
    route = routes.get(cmd.type)
    if route is None:
        return Outcome.rejected(f"no handler for command type {cmd.type!r}")
    try:
        args = route.parse(cmd.args)
    except (ValueError, TypeError, KeyError) as exc:
        return Outcome.rejected(f"invalid args: {exc}")
    before = modes.mode
    after = route.to or _kept(before)
    after_failure = route.on_failure or _kept(before)
    for mode in (route.via, after, after_failure):
        if mode is not None and not modes.allows(mode):
            return Outcome.rejected(f"{cmd.type} is not allowed while {before}")
    try:
        outcome = route.call(target, cmd, args)
    except Exception as exc:  # noqa: BLE001 - a failed command is acked failed; training goes on
        log.warning("command %s (%s) failed: %s", cmd.id, cmd.type, exc)
        available = getattr(exc, "available", None)  # a rollback's target was gone: what is there
        outcome = Outcome.failed(str(exc) or type(exc).__name__, None if available is None else tuple(available))
    modes.move(after if outcome.status is AckStatus.APPLIED else after_failure)
    return outcome


def dispatch(cmd: Command, target: CommandTarget, modes: ModeMachine, ack: Ack,
             routes: Mapping[CommandType, Route] = ROUTES) -> Outcome:
    """Apply one command and ack it (every rank calls this; ``Agent.ack`` speaks on rank 0 only)."""
    outcome = apply(cmd, target, modes, routes)
    if outcome.status is AckStatus.REJECTED:
        log.warning("command %s (%s) rejected: %s", cmd.id, cmd.type, outcome.detail)
    if outcome.available is None:
        ack(cmd, outcome.status, outcome.detail)
    else:
        ack(cmd, outcome.status, outcome.detail, available=outcome.available)
    return outcome
