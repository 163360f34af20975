"""controller.runstate: a run's saved state is plain JSON, whether or not it holds non-finite floats."""

from __future__ import annotations

import json
import math

from cliffguard.controller.detect import RunDetector
from cliffguard.controller.recovery import new_state
from cliffguard.controller.runstate import RunSlot
from cliffguard.core.events import Event, make_event
from cliffguard.core.floats import to_json
from testing import store_factory as f


def _slot(losses: list[float]) -> RunSlot:
    det = RunDetector()
    for step, loss in enumerate(losses):
        det.on_event(make_event("step", "r", step, f.step(step, loss).data))
    return RunSlot("r", det, new_state("r", "salt"))


def _ranks(k: int) -> Event:
    """A 2-rank run's ``ranks`` event of round ``k`` (rank 1 a little slower each round)."""
    return make_event("ranks", "r", 10 * k, {"first_rank": 0, "steps": 10, "step_time_s": [0.5, 0.5 + k / 100],
                                             "data_wait_s": [0.0, 0.0], "comm_exposed_s": [0.1, 0.0],
                                             "tokens_per_s": [1.0, 1.0], "mfu": [0.4, 0.4], "loss_local": [3.0, 3.0],
                                             "mem_allocated": [1, 1], "mem_reserved": [2, 2]}, world=2)


def test_finite_state_is_the_same_json_as_the_python_walk():
    slot = _slot([2.0 - 0.01 * i for i in range(40)])
    state = slot.to_json()
    assert json.dumps(state, sort_keys=True) == json.dumps(to_json({
        "v": state["v"], "partition": None, "detector": slot.detector.state_dict(),
        "recovery": slot.recovery.state_dict(), "judged_ts": 0.0}), sort_keys=True)


def test_non_finite_floats_take_the_wire_spelling():
    slot = _slot([2.0] * 30 + [math.nan, math.inf])
    text = json.dumps(slot.to_json(), allow_nan=False)  # would raise on a bare NaN
    assert '"NaN"' in text or '"Infinity"' in text


def test_rule_states_are_saved_apart_only_when_changed_and_load_back(tmp_path):
    from sqlalchemy import select

    from cliffguard.controller.runstate import RunTable, default_detector_factory, save_slots
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.ingest import ingest_events
    from cliffguard.controller.store.models import RuleStateRow, RunRow
    from testing.controller_stack import fresh_store

    engine = fresh_store(tmp_path)
    table = RunTable(default_detector_factory())
    events = [make_event("step", "r", s, f.step(s, 2.0 - 0.01 * s).data) for s in range(30)]
    with session_scope(engine) as s:
        ingest_events(s, events)
        slot = table.get(s, "r")
        for ev in events:
            slot.detector.on_event(ev)
        save_slots(s, [slot])
    with session_scope(engine) as s:
        first = dict(s.execute(select(RuleStateRow.rule, RuleStateRow.state)).all())
        # a new run: every rule once, and each ring slot of the per-rank window rules' windows
        assert {name for name in first if "#" not in name} == set(slot.detector.rules)
        assert {name.partition("#")[0] for name in first if "#" in name} == {"mfu", "straggler", "memory"}
        assert "straggler" not in s.get(RunRow, "r").controller_state["detector"]
    # later than the heartbeat rule's PERSIST_S: its packed snapshot is taken again
    slot.detector.on_event(make_event("heartbeat", "r", 30, {"state": "running"}, ts=events[-1].ts + 10))
    assert slot.detector.changed == {"heartbeat"}
    with session_scope(engine) as s:
        save_slots(s, [slot])
    with session_scope(engine) as s:
        second = dict(s.execute(select(RuleStateRow.rule, RuleStateRow.state)).all())
        assert second["straggler"] == first["straggler"] and second["heartbeat"] != first["heartbeat"]
        reloaded = RunTable(default_detector_factory()).get(s, "r")
    assert reloaded.detector.state_dict() == json.loads(json.dumps(to_json(slot.detector.state_dict())))
    assert reloaded.detector.changed == set()


def test_an_unreadable_rule_state_starts_that_rule_fresh_with_a_warning(tmp_path, caplog):
    from sqlalchemy import update

    from cliffguard.controller.runstate import RunTable, default_detector_factory, save_slots
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.ingest import ingest_events
    from cliffguard.controller.store.models import RuleStateRow
    from testing.controller_stack import fresh_store

    engine = fresh_store(tmp_path)
    events = [_ranks(k) for k in range(1, 8)]
    with session_scope(engine) as s:
        ingest_events(s, events)
        slot = RunTable(default_detector_factory()).get(s, "r")
        for ev in events:
            slot.detector.on_event(ev)
        save_slots(s, [slot])
    saved = slot.detector.state_dict()
    with session_scope(engine) as s:
        part = json.loads(s.get(RuleStateRow, ("r", "mfu#recent.0")).state)
        part["values"][0] = part["values"][0][:9]  # truncated
        s.execute(update(RuleStateRow).where(RuleStateRow.rule == "mfu#recent.0").values(state=json.dumps(part)))
        s.execute(update(RuleStateRow).where(RuleStateRow.rule == "memory").values(state='{"packed": 1, "rec'))
        reloaded = RunTable(default_detector_factory()).get(s, "r")
    det = reloaded.detector
    assert len(det.rules["mfu"]._recent) == 0 and len(det.rules["memory"]._recent) == 0  # fresh
    assert det.rules["straggler"].state_dict() == saved["straggler"]  # the readable rest as saved
    assert {"mfu", "memory"} <= det.changed  # saved again at the next save
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "mfu rule state is unreadable" in warned and "memory rule state is not JSON" in warned


def test_encode_json_reads_back_as_the_standard_encoding_whichever_encoder_wrote_it():
    """orjson writes the common case; what it would write differently (a NaN or infinity as null,
    a tuple as a list) or cannot write (an integer beyond 64 bits, a non-text key) goes the
    standard way, non-finite floats in the wire spelling."""
    from cliffguard.controller.runstate import encode_json

    cases = [
        {"window": [0.1 + 0.2, 1e-7, -0.0, 3.0], "n": 4, "none": None, "flag": True, "text": "é"},
        {"points": [1.5, float("nan"), float("inf")], "level": "warn"},
        {"pair": (1, 2.5)},
        {1: 2.5},
        [2**70],
    ]
    for obj in cases:
        try:
            want = json.loads(json.dumps(obj, allow_nan=False))
        except (ValueError, TypeError):
            want = json.loads(json.dumps(to_json(obj), allow_nan=False))
        assert json.loads(encode_json(obj)) == want, obj
    assert json.loads(encode_json({"p": [float("nan")]})) == {"p": ["NaN"]}



def test_a_round_of_ranks_events_saves_one_slot_per_window_rule_and_reloads_exactly(tmp_path):
    """The per-rank window rules save their row table and the ring slot the round wrote, not their
    whole windows (a 16k-rank run's were ~200 ms a save); the rows stored load the windows held."""
    from sqlalchemy import select

    from cliffguard.controller.runstate import RunTable, default_detector_factory, save_slots
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.ingest import ingest_events
    from cliffguard.controller.store.models import RuleStateRow
    from testing.controller_stack import fresh_store

    engine = fresh_store(tmp_path)
    table = RunTable(default_detector_factory())
    with session_scope(engine) as s:
        ingest_events(s, [_ranks(k) for k in range(1, 80)])
        slot = table.get(s, "r")
        for k in range(1, 79):
            slot.detector.on_event(_ranks(k))
        save_slots(s, [slot])
    with session_scope(engine) as s:
        before = dict(s.execute(select(RuleStateRow.rule, RuleStateRow.state)).all())
    slot.detector.on_event(_ranks(79))
    with session_scope(engine) as s:
        save_slots(s, [slot])
    with session_scope(engine) as s:
        after = dict(s.execute(select(RuleStateRow.rule, RuleStateRow.state)).all())
        reloaded = table.__class__(default_detector_factory()).get(s, "r")
    moved = {name for name in after if after[name] != before.get(name)}
    assert {name for name in moved if "#" in name} == {"mfu#recent.28", "straggler#busy.28", "memory#recent.28"}
    for name in ("mfu", "straggler", "memory"):
        assert reloaded.detector.rules[name].state_dict() == slot.detector.rules[name].state_dict()


def test_a_slot_part_that_is_not_json_starts_its_rule_fresh(tmp_path, caplog):
    from sqlalchemy import update

    from cliffguard.controller.runstate import RunTable, default_detector_factory, save_slots
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.ingest import ingest_events
    from cliffguard.controller.store.models import RuleStateRow
    from testing.controller_stack import fresh_store

    engine = fresh_store(tmp_path)
    with session_scope(engine) as s:
        ingest_events(s, [_ranks(k) for k in range(1, 8)])
        slot = RunTable(default_detector_factory()).get(s, "r")
        for k in range(1, 8):
            slot.detector.on_event(_ranks(k))
        save_slots(s, [slot])
    with session_scope(engine) as s:
        s.execute(update(RuleStateRow).where(RuleStateRow.rule == "straggler#busy.3").values(state='{"rows": 2, "st'))
        det = RunTable(default_detector_factory()).get(s, "r").detector
    assert len(det.rules["straggler"]._busy) == 0 and "straggler" in det.changed  # fresh, saved again
    assert len(det.rules["mfu"]._recent) == 2
    assert "straggler#busy.3 rule state is not JSON" in caplog.text


def test_the_controller_stores_the_recovery_limits_it_enforces_with_each_runs_state(tmp_path):
    """What ``cliffguard status RUN`` and the dashboard show the room by (controller/recovery_budgets.py)."""
    from cliffguard.controller.alerts import AlertsConfig
    from cliffguard.controller.batch import BatchContext, BatchProcessor
    from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
    from cliffguard.controller.recovery_budgets import left, limits_doc
    from cliffguard.controller.recovery_types import RecoveryConfig
    from cliffguard.controller.runstate import RunTable, default_detector_factory
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.models import RunRow
    from cliffguard.core.signing import Secret
    from testing.controller_stack import fresh_store

    engine = fresh_store(tmp_path)
    enforced = RecoveryConfig(rollback_budget=7, evict_run_budget=1)
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=enforced, alerts=AlertsConfig())
    proc = BatchProcessor(ctx, RunTable(default_detector_factory()))
    events = [f.run_started("r"), *(make_event("step", "r", s, f.step(s, 2.0 - 0.01 * s).data) for s in range(5))]
    with session_scope(engine) as s:
        batch = EdgeBatch(records=[EdgeRecord("m", 0, i, e) for i, e in enumerate(events)])
        proc.process(s, batch, now=events[-1].ts)
    with session_scope(engine) as s:
        state = s.get(RunRow, "r").controller_state
    assert state["budget_limits"] == limits_doc(enforced)
    found = left(RecoveryConfig(), state, now=events[-1].ts)
    assert found["source"] == "controller" and found["rungs"][2]["per_window"] == 7
