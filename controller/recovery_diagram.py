"""The recovery policy drawn from its table: a Mermaid state diagram and the page
``docs/recovery-policy.md``, so the picture can never disagree with the machine.

``python -m cliffguard.controller.recovery_diagram --write`` regenerates the page (``--check``
exits 1 when it is stale; no flag prints it); a test fails when the committed page differs.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from cliffguard.controller import recovery_budgets
from cliffguard.controller.recovery_budgets import BUDGETS
from cliffguard.controller.recovery_table import (
    CAPABILITIES,
    GUARDS,
    LADDER,
    TABLE,
    Transition,
    escalation_level,
    rollback_bound,
)
from cliffguard.controller.recovery_types import RecoveryConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "recovery-policy.md"
"""The generated page, in the repository's docs/ (the controller folder sits at the root)."""
REGENERATE = "python -m cliffguard.controller.recovery_diagram --write"

_INTRO = """\
# Recovery policy

<!-- Generated from controller/recovery_table.py by `{regenerate}`; do not edit by hand. -->

The controller runs one recovery state machine per training run (`controller/recovery.py`, a pure
`transition(state, input) -> (state, actions)`). Everything it may do is declared in one table,
`controller/recovery_table.py`: this page is drawn from that table, and a test fails when the two
differ.

A run starts `running`. A rule's verdict that asks for recovery pauses the run, a validation pass
judges the frozen weights, and the machine either resumes (a transient spike), rolls back to the
newest stable checkpoint with a smaller learning rate, or halts for a human. The trainer's guard
holding (`hold`, `controller/rules/held.py`) is such a verdict too. What was decided without the
machine is a move of its own, naming who decided: a trainer-side timeout that fired anyway
(`trainer_*`, from the trainer's `trainer.timeout` event) and an operator's LR scale; the machine
adopts the LR scale either set. Any move the table does not declare raises `TransitionNotAllowed`.

How to read a transition: in *state*, the input mapped to *trigger* moves the run to *next state*
when every term of its *guard* holds (the handler asks each term, and the move checks that they
held); it then emits *actions*, besides the recorded transition itself. Transitions of one state
and input are listed in the order they are tried.
"""


def _label(t: Transition) -> str:
    return " and ".join(t.guard) if t.guard else "—"


def render(table: Iterable[Transition] = TABLE) -> str:
    """Mermaid ``stateDiagram-v2`` text: one edge per transition, labelled with its trigger."""
    lines = ["stateDiagram-v2", "    [*] --> running"]
    lines += [f"    {t.source} --> {t.target}: {t.trigger}" for t in table]
    return "\n".join(lines) + "\n"


def transitions_table(table: Iterable[Transition] = TABLE) -> str:
    """The transitions as a Markdown table: state, trigger, guard, next state, actions."""
    rows = ["| state | trigger | guard | next state | actions |", "| --- | --- | --- | --- | --- |"]
    rows += [f"| {t.source} | {t.trigger} | {_label(t)} | {t.target} | {'; '.join(t.actions) or '—'} |"
             for t in table]
    return "\n".join(rows) + "\n"


def terms_table() -> str:
    """Every guard term: the named predicates of GUARDS and the capability terms."""
    rows = ["| term | holds when |", "| --- | --- |"]
    for name, fn in GUARDS.items():
        doc = " ".join((inspect.getdoc(fn) or "").split())
        rows.append(f"| {name} | {doc} |")
    for name, commands in CAPABILITIES.items():
        rows.append(f"| {name} | the run declared (`run.started`) {', '.join(str(c) for c in commands)} |")
    return "\n".join(rows) + "\n"


def ladder_table() -> str:
    """The escalation ladder: each rung's LR cut, rollback reach and what it is for."""
    rows = ["| rung | LR cut per rollback | rollback goes to | when |", "| --- | --- | --- | --- |"]
    for i, r in enumerate(LADDER):
        cut = "—" if r.halt else ("`lr_factor`" if r.lr_cuts == 1 else f"`lr_factor`^{r.lr_cuts}")
        reach = ("— (paused and halted)" if r.halt else
                 "a stable checkpoint before the previous rollback's target" if r.longer else
                 "the newest stable checkpoint at or before the onset")
        rows.append(f"| {i}{'+' if i == len(LADDER) - 1 else ''} | {cut} | {reach} | {r.why} |")
    return "\n".join(rows) + "\n"


def budgets_table() -> str:
    """Each rung's budget: what one use is, its ``[recovery]`` fields with their defaults, the trigger
    its exhaustion fires and what the run gets instead."""
    defaults = RecoveryConfig()
    rows = ["| rung | one use is | per window | per run (0 = no cap) | spent: trigger | escalates to |",
            "| --- | --- | --- | --- | --- | --- |"]
    for b in BUDGETS:
        per_window, window, per_run = recovery_budgets.limits(defaults, b.rung)
        rows.append(f"| {b.rung} | {b.use} | `{b.per_window}` {per_window} per `{b.window_s}` {window:.0f} s | "
                    f"`{b.per_run}` {per_run} | {b.spent} (guard `{b.guard}`) | {b.escalates_to}: {b.why} |")
    return "\n".join(rows) + "\n"


def _doc(fn: object) -> str:
    return " ".join((inspect.getdoc(fn) or "").split())


def page(table: Sequence[Transition] = TABLE) -> str:
    """The whole of docs/recovery-policy.md."""
    return (_INTRO.format(regenerate=REGENERATE)
            + "\n## Diagram\n\n```mermaid\n" + render(table) + "```\n"
            + "\n## Transitions\n\n" + transitions_table(table)
            + "\n## Guard terms\n\n"
            + "`not` before a term negates it. `timed_out` and `is_stable` decide which inputs count "
              "(a tick, a checkpoint becoming a target) rather than a move.\n\n"
            + terms_table()
            + "\n## Escalation ladder\n\n"
            + "A run that goes off again soon after an incident is not answered as if for the first time. "
              f"`escalation_level`: {_doc(escalation_level)} `rollback_bound`: {_doc(rollback_bound)}\n\n"
            + ladder_table()
            + "\n## Budgets\n\n"
            + f"{_doc(recovery_budgets).split(' The guards of')[0]}\n\n"
            + budgets_table())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cliffguard.controller.recovery_diagram", description=__doc__)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"regenerate {PAGE.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {PAGE.name} is stale")
    ap.add_argument("--page", type=Path, default=PAGE, help="the page's path (default: the repository's docs/)")
    args = ap.parse_args(argv)
    text = page()
    if args.write:
        args.page.write_text(text)
        print(f"wrote {args.page}")
    elif args.check:
        if not args.page.exists() or args.page.read_text() != text:
            print(f"{args.page} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
