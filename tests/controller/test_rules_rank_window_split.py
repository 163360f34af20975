"""controller.rules.rank_window_split: rank windows saved as a row table and the ring slots written
since the last save. The store then holds what was saved (the newest part of each slot), a round
of ``ranks`` events writes one slot, and a stored state that cannot be what was saved raises
PackedStateError without loading half a window."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from cliffguard.controller.rules.packed import PackedStateError, pack_array
from cliffguard.controller.rules.rank_window import RankWindows
from cliffguard.controller.rules.rank_window_split import load_split, split


def _store(saved: dict, w: RankWindows) -> None:
    """What the controller's rows would hold after this save: the table replaced, the parts upserted."""
    table, parts = split(w)
    saved["table"] = json.loads(json.dumps(table))
    saved.setdefault("parts", {}).update(json.loads(json.dumps(parts)))


def _loaded(saved: dict, size: int = 5, width: int = 2) -> RankWindows:
    w = RankWindows(size, width)
    load_split(w, saved["table"], saved["parts"])
    return w


def test_saves_in_parts_load_back_the_windows_exactly_through_growth_rotation_and_rollback():
    """Ranks first seen out of order and between saves (rows a saved slot never had), rings turned
    unlike, part-filled rows, a rollback: after every save the stored parts load the windows held."""
    rng = random.Random(3)
    w = RankWindows(5, 2)
    saved: dict = {}
    for step in range(60):
        ranks = rng.sample(range(40), rng.choice([1, 4, 12]))
        w.push(w.rows_for(np.array(ranks, np.int64)), step, np.array([[rng.random(), step] for _ in ranks]))
        if step == 30:
            w.drop_from(w.rows_for(np.array(w.ranks, np.int64)), 27)
        if rng.random() < 0.4:
            _store(saved, w)
            assert _loaded(saved).packed() == w.packed()
    _store(saved, w)
    again = _loaded(saved)
    assert again.packed() == w.packed()
    assert again.dirty == set()  # loaded = stored: the next save writes only what changes


def test_a_round_of_every_rank_writes_one_slot_and_the_table_is_kept_until_a_row_changes():
    w = RankWindows(50, 4)
    rows = w.rows_for(np.arange(16_384))
    for step in range(60):
        w.push(rows, step, np.full((16_384, 4), step / 7))
    first, parts = split(w)
    assert len(parts) == 50  # a new table: every slot once
    w.push(rows, 60, np.full((16_384, 4), 0.5))
    table, parts = split(w)
    assert list(parts) == [str((60 - 50) % 50)] and parts[str(10)]["rows"] == 16_384
    assert split(w)[1] == {} and split(w)[0] is table  # nothing new: the kept table, no part


def test_a_resized_window_keeps_each_ranks_newest_points():
    w = RankWindows(5, 2)
    rows = w.rows_for(np.array([3, 1], np.int64))
    for step in range(8):
        w.push(rows, step, np.array([[step, 0.5], [step, 1.5]]))
    saved: dict = {}
    _store(saved, w)
    small = RankWindows(3, 2)
    load_split(small, saved["table"], saved["parts"])
    assert [p[0] for p in small.points(small.row_of(3))] == [5, 6, 7]
    assert small.dirty is None  # a new layout: saved whole next time


def _saved() -> dict:
    w = RankWindows(5, 2)
    rows = w.rows_for(np.array([4, 0, 9], np.int64))
    for step in range(7):
        w.push(rows, step, np.array([[step, 1.0]] * 3))
    saved: dict = {}
    _store(saved, w)
    return saved


@pytest.mark.parametrize(("change", "match"), [
    (lambda s: s["parts"].pop("2"), r"no part for slots \[2\]"),
    (lambda s: s["table"].update(v=1), "not a split row table"),
    (lambda s: s["table"].update(width=3), "values per point"),
    (lambda s: s["table"].update(start=pack_array(np.array([0, 7, 0], np.int64))), "ring start"),
    (lambda s: s["table"].update(count=pack_array(np.array([0, 6, 0], np.int64))), "count outside"),
    (lambda s: s["table"].update(rank_gaps=pack_array(np.array([4, 0, 5], np.int64))), "not distinct"),
    (lambda s: s["parts"]["1"].update(rows=2), "slot 1 steps: byte plane 0 holds 3 bytes"),
    (lambda s: s["parts"]["1"]["values"].pop(), "slot 1 values: expected 8 byte planes"),
    (lambda s: s["parts"].__setitem__("3", [1]), "slot 3 is not a part"),
    (lambda s: s.update(parts=[]), "slot parts must be a table"),
])
def test_a_corrupt_split_state_raises_and_leaves_the_windows_as_they_were(change, match):
    saved = _saved()
    change(saved)
    w = RankWindows(5, 2)
    w.push(w.rows_for(np.array([1], np.int64)), 1, np.array([[1.0, 2.0]]))
    before = w.packed()
    with pytest.raises(PackedStateError, match=match):
        load_split(w, saved["table"], saved["parts"])
    assert w.packed() == before


def test_a_slot_of_a_larger_window_saved_before_a_resize_is_not_read():
    saved = _saved()
    saved["parts"]["7"] = {"rows": 1, "steps": "garbage", "values": []}
    assert len(_loaded(saved)) == 3
