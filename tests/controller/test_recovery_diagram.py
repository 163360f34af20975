"""The recovery table as data (controller/recovery_table.py) and the page drawn from it
(controller/recovery_diagram.py, docs/recovery-policy.md)."""

from __future__ import annotations

import pytest

from cliffguard.controller import recovery_diagram
from cliffguard.controller.recovery_diagram import PAGE, REGENERATE, main, page, render
from cliffguard.controller.recovery_table import CAPABILITIES, GUARDS, TABLE, guard_terms, holds
from cliffguard.controller.recovery_types import Phase, RecoveryConfig, Trigger
from cliffguard.core.enums import CommandType


def test_the_committed_page_is_what_the_table_generates():
    assert PAGE.read_text() == page(), f"docs/recovery-policy.md is stale: run {REGENERATE}"


def test_the_diagram_has_one_edge_per_transition():
    lines = render().splitlines()
    assert lines[:2] == ["stateDiagram-v2", "    [*] --> running"]
    assert lines[2:] == [f"    {t.source} --> {t.target}: {t.trigger}" for t in TABLE]
    assert {t.source for t in TABLE} | {t.target for t in TABLE} == set(Phase)


def test_every_trigger_is_declared_and_every_guard_term_is_known():
    assert {t.trigger for t in TABLE} == set(Trigger)
    assert guard_terms() <= set(GUARDS) | set(CAPABILITIES)
    assert set(GUARDS) - guard_terms() == {"timed_out", "is_stable"}  # they filter inputs (the page says so)


def test_a_term_is_a_guard_a_capability_or_a_negation():
    from cliffguard.controller.recovery import new_state

    s = new_state("r", "salt")
    cfg = RecoveryConfig()
    assert holds("not can_retry", cfg, s) and not holds("can_retry", cfg, s)  # nothing pending
    assert holds("can_roll_back", cfg, s)  # every command until run.started says otherwise
    s.capabilities = (CommandType.PAUSE,)
    assert holds("not can_pause_cycle", cfg, s) and holds("not rollback_target", cfg, s, 10)
    with pytest.raises(KeyError):
        holds("no_such_guard", cfg, s)


def test_check_fails_on_a_stale_page_and_write_mends_it(tmp_path, capsys):
    stale = tmp_path / "recovery-policy.md"
    stale.write_text("# hand-edited\n")
    assert main(["--check", "--page", str(stale)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--write", "--page", str(stale)]) == 0
    assert main(["--check", "--page", str(stale)]) == 0
    assert stale.read_text() == recovery_diagram.page()
