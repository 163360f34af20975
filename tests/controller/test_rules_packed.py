"""controller.rules.packed and the packed rank windows: what is stored is what loads, and a
stored state that cannot be what was saved raises PackedStateError, never loads wrong windows."""

from __future__ import annotations

import base64
import json
import random
import zlib

import numpy as np
import pytest

from cliffguard.controller.rules.packed import PackedStateError, pack, pack_array, unpack, unpack_array
from cliffguard.controller.rules.rank_window import RankWindows, packed_layout


def test_columns_round_trip():
    assert unpack("q", pack("q", [1, -2, 3])) == [1, -2, 3]
    a = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    assert np.array_equal(unpack_array(pack_array(a), np.float64, (3, 4), "a"), a)


@pytest.mark.parametrize("text", [None, 7, "not base64!", base64.b64encode(b"not zlib").decode(),
                                  pack("q", [1, 2])[:-6]])
def test_garbage_is_a_packed_state_error(text):
    with pytest.raises(PackedStateError, match="packed column"):
        unpack("q", text)


def test_wrong_byte_counts_are_refused():
    odd = base64.b64encode(zlib.compress(b"abc")).decode()
    with pytest.raises(PackedStateError, match="whole number"):
        unpack("q", odd)
    with pytest.raises(PackedStateError, match=r"x: byte plane 0 holds 2 bytes where shape \(3,\) needs 3"):
        unpack_array(pack_array(np.zeros(2)), np.float64, (3,), "x")
    with pytest.raises(PackedStateError, match="expected 8 byte planes"):
        unpack_array(pack_array(np.zeros(2, np.int32)), np.float64, (2,), "x")


def test_noise_planes_are_stored_raw_and_repeats_zipped():
    rng = np.random.default_rng(0)
    a = 0.5 + 0.05 * rng.random(100_000)
    planes = pack_array(a)
    assert planes[0][0] == "r" and planes[7] == "c63:100000"  # low mantissa byte: noise; sign and exponent: one value
    assert planes[6][0] == "z"  # the exponent's low bits and the top mantissa bits: a few values
    assert np.array_equal(unpack_array(planes, np.float64, a.shape, "a"), a)
    assert sum(map(len, pack_array(np.arange(100_000) // 50))) < 0.02 * 8 * 100_000


def _windows(seed: int, size: int = 5) -> RankWindows:
    """Rotated rings, part-filled rows, ranks first seen out of order, a rollback."""
    rng = random.Random(seed)
    w = RankWindows(size, 2)
    for step in range(40):
        ranks = rng.sample(range(30), rng.choice([1, 4, 12]))
        w.push(w.rows_for(np.array(ranks, np.int64)), step, np.array([[rng.random(), step] for _ in ranks]))
        if step == 30:
            w.drop_from(w.rows_for(np.array(w.ranks, np.int64)), 28)
    return w


@pytest.mark.parametrize("seed", range(3))
def test_packed_windows_load_to_the_same_points(seed):
    w = _windows(seed)
    again = RankWindows(w.size, w.width)
    again.load_packed(json.loads(json.dumps(w.packed())))
    assert again.ranks == w.ranks
    assert [again.points(i) for i in range(len(again))] == [w.points(i) for i in range(len(w))]
    assert again.packed() == w.packed()
    again.push(again.rows_for(np.array([3], np.int64)), 99, np.array([[1.0, 2.0]]))
    assert again.packed() != w.packed()  # a new point: packed again, not the cached text


def test_a_resized_window_keeps_each_ranks_newest_points():
    w = _windows(1, size=8)
    small = RankWindows(4, 2)
    small.load_packed(w.packed())
    assert [small.points(i) for i in range(len(small))] == [w.points(i)[-4:] for i in range(len(w))]


def _broken(change) -> dict:
    stored = json.loads(json.dumps(_windows(0).packed()))
    change(stored)
    return stored


def _dup_ranks(s):
    n = s["rows"]
    s["rank_gaps"] = pack_array(np.array([1] + [0] * (n - 1), np.int64))


@pytest.mark.parametrize(("change", "match"), [
    (lambda s: s.update(v=2), "unknown packed layout"),
    (lambda s: s["values"].__setitem__(0, s["values"][0][: len(s["values"][0]) // 2]), "values|packed column"),
    (lambda s: s["values"].__setitem__(3, "x"), "values: byte plane 3 is not a packed plane"),
    (lambda s: s["values"].__setitem__(3, "r!!"), "values: byte plane 3 is not base64"),
    (lambda s: s["values"].pop(), "values: expected 8 byte planes"),
    (lambda s: s.update(step_gaps=pack_array(np.arange(3))), "steps: byte plane 0 holds 3 bytes"),
    (lambda s: s["values"].__setitem__(7, "c256"), "values: byte plane 7 is no byte value"),
    (lambda s: s["values"].__setitem__(7, "c63:5"), "values: byte plane 7 holds 5 bytes"),
    (lambda s: s.update(rows=s["rows"] + 1), "ranks: byte plane 0 holds"),
    (lambda s: s.update(rows=-1), "rows must be"),
    (lambda s: s.update(width=3), "values per point"),
    (lambda s: s.pop("count"), "counts: expected 8 byte planes"),
    (lambda s: s.update(count=pack_array(np.full(s["rows"], 9, np.int64))), "count outside"),
    (_dup_ranks, "not distinct"),
])
def test_a_corrupt_packed_state_raises_and_leaves_no_half_windows(change, match):
    w = _windows(2)
    before = w.packed()
    with pytest.raises(PackedStateError, match=match):
        w.load_packed(_broken(change))
    assert w.packed() == before  # checked before anything was replaced


def test_the_layout_marker_is_checked():
    assert packed_layout({"packed": 1}) and not packed_layout({"0": {}})
    with pytest.raises(PackedStateError, match="unknown packed layout"):
        packed_layout({"packed": 9})
    with pytest.raises(PackedStateError, match="expected an object"):
        packed_layout([])


WORLD = 16_384


def _sweep(step: int, rng: np.random.Generator, slow: bool) -> list:
    """One ``ranks`` sweep of a 16k-rank run: noisy timings, rank 5000 slow once ``slow``, and
    past step 120 (after the reload) MFU low and memory creeping up on rank 7."""
    from cliffguard.core.events import make_event

    out = []
    for first in range(0, WORLD, 2048):
        n = 2048
        st = 0.5 + 0.05 * rng.random(n)
        if slow and first <= 5000 < first + n:
            st[5000 - first] *= 3
        mem = np.full(n, 40_000_000_000) + rng.integers(0, 10**6, n)
        if first == 0 and step > 120:
            mem[7] -= 10**8 * (step - 120)  # reserved-minus-allocated grows
        data = {"first_rank": first, "steps": 10, "step_time_s": st.tolist(),
                "data_wait_s": (0.01 * rng.random(n)).tolist(), "comm_exposed_s": (0.05 * rng.random(n)).tolist(),
                "mfu": ((0.2 if step > 150 else 0.45) + 0.01 * rng.random(n)).tolist(),
                "tokens_per_s": [8000.0] * n, "loss_local": [3.0] * n,
                "mem_allocated": mem.tolist(), "mem_reserved": [60_000_000_000] * n}
        out.append(make_event("ranks", "fleet", step, data, rank=first, world=WORLD))
    return out


def test_a_16k_rank_state_reloads_to_the_same_verdicts_packed_and_from_the_old_layout():
    from cliffguard.controller.rules.memory import MemoryConfig, MemoryRule
    from cliffguard.controller.rules.mfu import MfuConfig, MfuRule
    from cliffguard.controller.rules.straggler import StragglerConfig, StragglerRule

    rng = np.random.default_rng(0)
    stream = [_sweep(10 * k, rng, slow=k > 12) for k in range(1, 25)]
    rules = [StragglerRule(StragglerConfig(window=8)), MfuRule(MfuConfig(window=8)), MemoryRule(MemoryConfig(window=8))]
    for sweep in stream[:11]:  # windows full, their rings turned
        for ev in sweep:
            for rule in rules:
                rule.on_event(ev)
    packed = [type(r)(r.config) for r in rules]
    old_layout = [type(r)(r.config) for r in rules]
    for rule, twin, old in zip(rules, packed, old_layout, strict=True):
        text, lists = json.dumps(rule.state_dict()), json.dumps(rule.list_state_dict())
        # full-precision noise: the low bytes of every float stay (bench.rules_speed's timings pack 10x smaller)
        assert len(text) * 2 < len(lists), rule.name
        twin.load_state_dict(json.loads(text))
        old.load_state_dict(json.loads(lists))
        assert twin.state_dict() == rule.state_dict()
        assert old.list_state_dict() == twin.list_state_dict()  # the old memory layout held no steps

    def verdicts(rs):
        return [(v.rule, v.step, v.rank, v.onset_step, v.message)
                for sweep in stream[11:] for ev in sweep for r in rs for v in r.on_event(ev)]

    want = verdicts(rules)
    assert {v[0] for v in want} == {"straggler", "mfu_low", "memory_growth"}
    assert verdicts(packed) == want and verdicts(old_layout) == want
    assert [r.state_dict() for r in packed] == [r.state_dict() for r in rules]
