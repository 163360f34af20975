"""The trainer-mode table: the legal moves, illegal ones raising, validation returning."""

from __future__ import annotations

import pytest

from cliffguard.agent.modes import MOVES, ModeMachine, ModeNotAllowed
from cliffguard.core.enums import TrainerMode as M


def test_every_mode_has_a_row_and_stopping_is_terminal_and_reachable_from_everywhere():
    assert set(MOVES) == set(M)
    assert MOVES[M.STOPPING] == {M.STOPPING}
    assert all(M.STOPPING in targets for targets in MOVES.values())


@pytest.mark.parametrize(("start", "to"), [
    (M.RUNNING, M.PAUSED), (M.RUNNING, M.HELD), (M.RUNNING, M.STOPPING), (M.PAUSED, M.RUNNING),
    (M.HELD, M.PAUSED), (M.HELD, M.RUNNING), (M.PAUSED, M.PAUSED), (M.VALIDATING, M.HELD),
])
def test_legal_moves(start, to):
    m = ModeMachine(start)
    assert m.move(to) is to and m.mode is to


@pytest.mark.parametrize(("start", "to"), [
    (M.STOPPING, M.RUNNING), (M.STOPPING, M.PAUSED), (M.STOPPING, M.VALIDATING),
    (M.PAUSED, M.HELD), (M.HELD, M.HELD), (M.VALIDATING, M.VALIDATING),
])
def test_illegal_moves_raise_and_leave_the_mode(start, to):
    m = ModeMachine(start)
    with pytest.raises(ModeNotAllowed, match=f"from {start} to {to}"):
        m.move(to)
    assert m.mode is start


@pytest.mark.parametrize("start", [M.RUNNING, M.PAUSED, M.HELD])
def test_validating_returns_to_where_it_came_from_even_on_error(start):
    m = ModeMachine(start)
    with m.validating():
        assert m.mode is M.VALIDATING
    assert m.mode is start
    with pytest.raises(RuntimeError, match="boom"), m.validating():
        raise RuntimeError("boom")
    assert m.mode is start


def test_no_validation_once_stopping():
    m = ModeMachine(M.STOPPING)
    with pytest.raises(ModeNotAllowed):
        with m.validating():
            pass
    assert m.mode is M.STOPPING
