"""controller/store/fit.py: values made to fit their columns, by row dict or by value list."""

from __future__ import annotations

from cliffguard.controller.store.fit import fit_rows, fit_values
from cliffguard.controller.store.models import StepMetricRow

COLS = ("event_id", "run_id", "step", "tokens", "guard", "loss")


def test_fit_values_leaves_fitting_columns_alone_and_clips_only_what_does_not_fit():
    rows = [["e1", "run", 5, 100, "ok", 1.0], ["e2", "run", 6, None, None, None]]
    before = [list(r) for r in rows]
    assert fit_values(StepMetricRow, COLS, rows) is rows and rows == before
    rows = [["e1", "run", 2**40, 100, "ok\x00", 1.0], ["e2", "run", 6, -(2**40), "x" * 20, 2.0]]
    fit_values(StepMetricRow, COLS, rows)
    assert rows == [["e1", "run", 2**31 - 1, 100, "ok", 1.0], ["e2", "run", 6, -(2**31), "x" * 8, 2.0]]


def test_fit_values_leaves_values_of_another_type_as_they_are():
    """A float or a bool in an integer column, a number in a text one: not clipped (the schema
    decides what is valid; fitting only bounds sizes)."""
    rows = [["e1", "run", 1.5, True, 7, 1.0], ["e2" * 40, "run", 3, 2**40, "ok", 1.0]]
    fit_values(StepMetricRow, COLS, rows)
    assert rows == [["e1", "run", 1.5, True, 7, 1.0], [("e2" * 40)[:32], "run", 3, 2**31 - 1, "ok", 1.0]]


def test_fit_rows_fits_dicts_in_place():
    rows = [{"step": 2**40, "guard": "abc\x00", "loss": 1.0}, {"step": 1}]
    assert fit_rows(StepMetricRow, rows) is rows
    assert rows == [{"step": 2**31 - 1, "guard": "abc", "loss": 1.0}, {"step": 1}]
