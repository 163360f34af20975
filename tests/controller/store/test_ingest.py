"""Events -> rows: every event type, idempotency, ordering, non-finite values; SQLite and PostgreSQL."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import func, select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_event, ingest_events, ingest_steps
from cliffguard.controller.store.models import (
    Base,
    CheckpointRow,
    CommandRow,
    DataFlagRow,
    GradHistRow,
    HeartbeatRow,
    RankArrayRow,
    RunRow,
    StepMetricRow,
    ValidationRow,
)
from cliffguard.core.enums import EventType
from cliffguard.core.events import MAX_STEP, new_id
from cliffguard.core.floats import store_kind as nonfinite_kind
from testing import store_factory as f


def _norm(value):
    if isinstance(value, float) and math.isnan(value):
        return "NaN"  # NaN != NaN; compare it as a token
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def snapshot(engine) -> dict[str, list[tuple]]:
    """Every row of every table, as comparable tuples."""
    out = {}
    with engine.connect() as conn:
        for name, table in Base.metadata.tables.items():
            rows = conn.execute(select(table)).all()
            out[name] = sorted((tuple(_norm(v) for v in r) for r in rows), key=repr)
    return out


def _command(s, run="run-a", status="sent") -> str:
    if s.get(RunRow, run) is None:
        s.add(RunRow(id=run))
        s.flush()  # no ORM relationship orders the inserts; the run must exist first
    cmd_id = new_id()
    s.add(
        CommandRow(
            id=cmd_id, run_id=run, type="pause", args={}, issued_at=f.T0, expires_at=f.T0 + 60, status=status
        )
    )
    return cmd_id


def _every_event_type(cmd_id: str) -> list:
    """One of each event type, in a plausible order."""
    return [
        f.run_started(),
        f.step(1, 2.5, rank=0),
        f.step(1, 2.5, rank=1, loss_local=2.6),
        f.grad_hist(1),
        f.event(EventType.HEARTBEAT, 1, {"state": "running"}, rank=1),
        f.checkpoint(1, kind="memory"),
        f.event(EventType.VALIDATION, 2, {"cmd": cmd_id, "val_loss": 2.4, "batches": 8}),
        f.ack(cmd_id, "applied", step=2, detail="paused"),
        f.event(EventType.DATA_FLAG, 2, {"sample_ids": [5, 9], "rule": "garbled", "score": 0.9}),
        f.event(EventType.RUN_FINISHED, 3, {"final_loss": 2.3, "steps": 3}),
    ]


def test_every_event_type_lands_in_its_table(engine):
    with session_scope(engine) as s:
        cmd_id = _command(s)
    with session_scope(engine) as s:
        assert ingest_events(s, _every_event_type(cmd_id)) == 10
    with session_scope(engine) as s:
        run = s.get(RunRow, "run-a")
        assert run.config["n_params"] == 1_000_000 and run.world_size == 2
        assert run.status == "finished" and run.ended_at == f.T0 + 3 and run.last_step == 3
        steps = s.scalars(select(StepMetricRow).order_by(StepMetricRow.rank)).all()
        assert [(m.step, m.rank, m.loss_local) for m in steps] == [(1, 0, 2.5), (1, 1, 2.6)]
        assert steps[0].guard == "ok" and steps[0].tokens == 2048 and steps[0].resolution == 1
        assert s.scalars(select(GradHistRow)).one().layers["h.0"]["counts"] == [1, 5, 3]
        hb = s.scalars(select(HeartbeatRow)).one()
        assert (hb.rank, hb.state, hb.step) == (1, "running", 1)
        ck = s.scalars(select(CheckpointRow)).one()
        assert (ck.kind, ck.step, ck.verified, ck.sha256) == ("memory", 1, True, "ab" * 32)
        val = s.scalars(select(ValidationRow)).one()
        assert (val.cmd, val.val_loss, val.batches) == (cmd_id, 2.4, 8)
        cmd = s.get(CommandRow, cmd_id)
        assert (cmd.status, cmd.ack_detail, cmd.acked_at) == ("applied", "paused", f.T0 + 2)
        flag = s.scalars(select(DataFlagRow)).one()
        assert (flag.rule, flag.sample_ids, flag.score) == ("garbled", [5, 9], 0.9)


def test_redelivering_every_event_changes_nothing(engine):
    with session_scope(engine) as s:
        cmd_id = _command(s)
    events = _every_event_type(cmd_id)
    with session_scope(engine) as s:
        ingest_events(s, events)
    before = snapshot(engine)
    with session_scope(engine) as s:
        assert ingest_events(s, events) == 0  # the whole batch again
    with session_scope(engine) as s:
        assert [ingest_event(s, e) for e in events] == [False] * len(events)  # one by one
    assert snapshot(engine) == before


def test_events_for_an_unseen_run_create_it(engine):
    with session_scope(engine) as s:
        assert ingest_event(s, f.step(7, 3.0, run="fresh", world=4, rank=3))
    with session_scope(engine) as s:
        run = s.get(RunRow, "fresh")
        assert (run.status, run.world_size, run.last_step, run.last_event_ts) == ("running", 4, 7, f.T0 + 7)


def test_run_last_step_follows_the_newest_event_even_backwards_after_a_rollback(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.step(i) for i in range(50)])
        # rollback to step 40: the re-trained step 41 comes later in time than step 49
        ingest_event(s, f.step(41, ts=f.T0 + 100))
        ingest_event(s, f.step(30, ts=f.T0 + 30.5))  # a late, older event does not move it back
    with session_scope(engine) as s:
        run = s.get(RunRow, "run-a")
        assert (run.last_step, run.last_event_ts) == (41, f.T0 + 100)
        assert len(read.loss_curve(s, "run-a", max_points=None)) == 52  # both copies of step 41 kept


def test_nan_and_inf_losses_survive_on_every_database(engine):
    with session_scope(engine) as s:
        ingest_events(
            s,
            [
                f.step(1, 2.0),
                f.step(2, math.nan, grad_norm=math.nan),
                f.step(3, math.inf),
                f.step(4, -math.inf),
            ],
        )
    with session_scope(engine) as s:
        kinds = s.execute(select(StepMetricRow.step, StepMetricRow.nonfinite).order_by(StepMetricRow.step)).all()
        assert kinds == [(1, None), (2, "nan"), (3, "inf"), (4, "-inf")]
        curve = read.loss_curve(s, "run-a", max_points=None)
    assert curve[0]["loss"] == 2.0
    assert math.isnan(curve[1]["loss"]) and curve[1]["nonfinite"] == "nan"
    assert curve[2]["loss"] == math.inf and curve[3]["loss"] == -math.inf


def test_nonfinite_values_in_json_columns_are_stored_as_strings_and_read_back_as_floats(engine):
    hist = f.event(
        EventType.GRAD_HIST,
        5,
        {
            "edges": [0.0, 1.0],
            "layers": {
                "h.0": {
                    "counts": [1],
                    "zeros": 0,
                    "nonfinite": 3,
                    "p50": math.nan,
                    "p99": math.inf,
                    "max": math.inf,
                    "norm": math.nan,
                    "underflow": 0.0,
                }
            },
        },
    )
    with session_scope(engine) as s:
        ingest_events(
            s,
            [
                f.run_started(lr_schedule={"warmup_lr": math.inf}),
                f.step(5, 2.0, layer_grad_norms={"h.0": math.nan, "h.1": 0.5}),
                hist,
            ],
        )
    with session_scope(engine) as s:
        assert s.get(RunRow, "run-a").config["lr_schedule"] == {"warmup_lr": "Infinity"}
        assert s.scalars(select(StepMetricRow.layer_grad_norms)).one() == {"h.0": "NaN", "h.1": 0.5}
        layer = read.grad_hists(s, "run-a")[0]["layers"]["h.0"]
        norms = read.latest_rank_steps(s, "run-a")[0]["layer_grad_norms"]
    assert math.isnan(layer["p50"]) and layer["p99"] == math.inf and layer["nonfinite"] == 3
    assert math.isnan(norms["h.0"]) and norms["h.1"] == 0.5


def test_nan_validation_loss_survives(engine):
    with session_scope(engine) as s:
        ingest_event(s, f.event(EventType.VALIDATION, 3, {"val_loss": math.nan, "batches": 4}))
    with session_scope(engine) as s:
        [val] = read.validations(s, "run-a")
    assert math.isnan(val["val_loss"]) and val["nonfinite"] == "nan" and val["cmd"] is None


def test_heartbeat_keeps_the_newest_per_rank(engine):
    with session_scope(engine) as s:
        assert ingest_event(s, f.event(EventType.HEARTBEAT, 10, {"state": "running"}, ts=f.T0 + 10))
        assert ingest_event(s, f.event(EventType.HEARTBEAT, 12, {"state": "paused"}, ts=f.T0 + 12))
        assert not ingest_event(s, f.event(EventType.HEARTBEAT, 11, {"state": "running"}, ts=f.T0 + 11))
        assert ingest_event(s, f.event(EventType.HEARTBEAT, 11, {"state": "running"}, rank=1, ts=f.T0 + 11))
    with session_scope(engine) as s:
        beats = read.heartbeats(s, "run-a")
    assert [(b["rank"], b["step"], b["state"]) for b in beats] == [(0, 12, "paused"), (1, 11, "running")]


def test_checkpoint_updates_with_newer_events_and_keeps_the_controllers_stable_flag(engine):
    with session_scope(engine) as s:
        ingest_event(s, f.checkpoint(100, verified=False, ts=f.T0 + 100))
    with session_scope(engine) as s:
        row = s.scalars(select(CheckpointRow)).one()
        row.stable, row.stable_reason = True, "healthy window"
    with session_scope(engine) as s:
        assert ingest_event(s, f.checkpoint(100, verified=True, ts=f.T0 + 101, detail="verified by loading"))
        assert not ingest_event(s, f.checkpoint(100, verified=False, ts=f.T0 + 100))  # late older copy
        assert ingest_event(s, f.checkpoint(100, kind="memory", ts=f.T0 + 100))  # another kind: its own row
    with session_scope(engine) as s:
        rows = read.checkpoints(s, "run-a", kind="full")
    assert len(rows) == 1
    assert (rows[0]["verified"], rows[0]["stable"], rows[0]["detail"]) == (True, True, "verified by loading")


def test_ack_sets_status_once_and_duplicate_acks_never_overwrite_it(engine):
    with session_scope(engine) as s:
        cmd_id = _command(s)
    with session_scope(engine) as s:
        assert ingest_event(s, f.ack(cmd_id, "applied", ts=f.T0 + 10, detail="done"))
        assert not ingest_event(s, f.ack(cmd_id, "duplicate", ts=f.T0 + 20, detail="seen before"))
        assert not ingest_event(s, f.ack(cmd_id, "failed", ts=f.T0 + 5))  # older than the recorded ack
    with session_scope(engine) as s:
        cmd = s.get(CommandRow, cmd_id)
        assert (cmd.status, cmd.ack_detail, cmd.acked_at) == ("applied", "done", f.T0 + 10)


def test_an_ack_from_another_run_changes_nothing(engine, caplog):
    with session_scope(engine) as s:
        cmd_id = _command(s)  # run-a's command
    with session_scope(engine) as s:
        assert not ingest_event(s, f.ack(cmd_id, "applied", run="run-b", ts=f.T0 + 10))
    with session_scope(engine) as s:
        cmd = s.get(CommandRow, cmd_id)
        assert (cmd.status, cmd.acked_at) == ("sent", None)
    assert "ignored" in caplog.text


def test_late_ack_replaces_a_controller_timeout(engine):
    with session_scope(engine) as s:
        cmd_id = _command(s, status="timeout")
    with session_scope(engine) as s:
        assert ingest_event(s, f.ack(cmd_id, "rejected", detail="expired signature"))
        assert s.get(CommandRow, cmd_id).status == "rejected"


def test_ack_for_an_unknown_command_is_ignored(engine, caplog):
    with session_scope(engine) as s:
        assert not ingest_event(s, f.ack(new_id(), "applied"))
    assert "unknown command" in caplog.text


def test_run_lifecycle_restart_and_late_copies(engine):
    with session_scope(engine) as s:
        ingest_event(s, f.run_started(ts=f.T0))
        ingest_event(s, f.event(EventType.RUN_FAILED, 50, {"error": "OOM"}, ts=f.T0 + 50))
    with session_scope(engine) as s:
        run = s.get(RunRow, "run-a")
        assert (run.status, run.error, run.ended_at) == ("failed", "OOM", f.T0 + 50)
        # a late copy of the first start must not revive the failed run
        assert not ingest_event(s, f.run_started(ts=f.T0))
        assert s.get(RunRow, "run-a").status == "failed"
    with session_scope(engine) as s:
        assert ingest_event(s, f.run_started(ts=f.T0 + 60, world=4))  # a real restart
        run = s.get(RunRow, "run-a")
        assert (run.status, run.error, run.ended_at, run.world_size) == ("running", None, None, 4)
        # a late copy of the old failure must not end the restarted run
        assert not ingest_event(s, f.event(EventType.RUN_FAILED, 50, {"error": "OOM"}, ts=f.T0 + 50))
        assert ingest_event(s, f.event(EventType.RUN_FINISHED, 90, {}, ts=f.T0 + 90))
    with session_scope(engine) as s:
        assert s.get(RunRow, "run-a").status == "finished"


def test_step_events_below_the_downsampled_range_are_ignored(engine):
    with session_scope(engine) as s:
        ingest_event(s, f.step(0))
        s.get(RunRow, "run-a").downsampled_below = 100
    with session_scope(engine) as s:
        assert not ingest_event(s, f.step(99))
        assert ingest_event(s, f.step(100))
        assert sorted(s.scalars(select(StepMetricRow.step))) == [0, 100]


def test_a_failed_transaction_records_nothing(engine):
    try:
        with session_scope(engine) as s:
            ingest_events(s, [f.step(1), f.step(2)])
            raise RuntimeError("controller crashed before commit")
    except RuntimeError:
        pass
    with session_scope(engine) as s:
        assert s.scalars(select(StepMetricRow)).all() == []
        assert ingest_events(s, [f.step(1), f.step(2)]) == 2  # the re-read batch goes in


def test_nonfinite_kind():
    assert [nonfinite_kind(v) for v in (None, 1.0, math.nan, math.inf, -math.inf)] == [
        None,
        None,
        "nan",
        "inf",
        "-inf",
    ]


def test_values_too_big_for_their_columns_are_clipped_not_fatal(engine, caplog):
    """PostgreSQL would reject the whole batch (and the controller re-read it forever)."""
    events = [
        f.step(MAX_STEP, tokens=2**40, clipped_layers=-(2**40)),  # larger steps never decode
        f.event(
            EventType.CHECKPOINT,
            4,
            {
                "kind": "full",
                "path": "/p\x00",
                "bytes": 2**70,
                "sha256": "a" * 200,
                "seconds": 1.0,
                "verified": True,
            },
        ),
        f.event(EventType.DATA_FLAG, 6, {"sample_ids": [1], "rule": "r" * 100, "score": 1.0}),
        f.event(EventType.VALIDATION, 7, {"cmd": "c" * 100, "val_loss": 1.0, "batches": 2**40}),
        f.event(EventType.RUN_FAILED, 8, {"error": "boom\x00" + "x" * 10}),
    ]
    with session_scope(engine) as s:
        assert ingest_events(s, events) == len(events)
    with session_scope(engine) as s:
        st = s.scalars(select(StepMetricRow)).one()
        assert (st.step, st.tokens, st.clipped_layers) == (2**31 - 1, 2**31 - 1, -(2**31))
        ck = s.scalars(select(CheckpointRow).where(CheckpointRow.step == 4)).one()
        assert (ck.sha256, ck.path, ck.bytes) == ("a" * 64, "/p", 2**63 - 1)
        assert s.scalars(select(DataFlagRow.rule)).one() == "r" * 64
        val = s.scalars(select(ValidationRow)).one()
        assert (val.cmd, val.batches) == ("c" * 32, 2**31 - 1)
        assert s.get(RunRow, "run-a").error == "boom" + "x" * 10
    assert "value clipped" in caplog.text


def test_step_rows_carry_the_rule_points_in_one_insert_and_stay_idempotent(engine):
    """``ingest_steps`` (COPY through a temporary table on PostgreSQL): the rule's figures land
    with the row, JSON and non-finite values survive, and a second delivery adds nothing."""
    events = [f.step(1), f.step(2, loss=math.nan, layer_grad_norms={"w": math.inf}), f.step(3)]
    points = {events[0].id: {"median": 2.0, "sigma": 0.1, "level": "ok"}}
    with session_scope(engine) as s:
        assert ingest_events(s, events, steps=False) == 0
        assert ingest_steps(s, events, points) == 3
        assert ingest_steps(s, events, points) == 0  # the same batch again, same transaction
    with session_scope(engine) as s:
        assert ingest_steps(s, [*events, f.step(4)]) == 1
        rows = s.execute(select(StepMetricRow.step, StepMetricRow.rule_median, StepMetricRow.rule_level,
                                StepMetricRow.nonfinite, StepMetricRow.layer_grad_norms)
                         .order_by(StepMetricRow.step)).all()
    assert [(r.step, r.rule_median, r.rule_level) for r in rows] == [
        (1, 2.0, "ok"), (2, None, None), (3, None, None), (4, None, None)]
    assert rows[1].nonfinite == "nan" and rows[1].layer_grad_norms == {"w": "Infinity"}


def _ranks(step: int, world: int = 4, **kw):
    n = world
    data = {"first_rank": 0, "steps": 10, "step_time_s": [0.5] * n, "data_wait_s": [0.1] * n,
            "comm_exposed_s": [0.1] * n, "mfu": [0.4] * n, "tokens_per_s": [1e3] * n,
            "mem_allocated": [1 << 30] * n, "mem_reserved": [2 << 30] * n, "loss_local": [2.0 + r for r in range(n)]}
    return f.event(EventType.RANKS, step, data, world=world, **kw)


def test_a_ranks_event_is_one_row_read_per_rank_and_a_node_heartbeat_one_row(engine):
    beat = {"state": "running", "ranks": [0, 1, 2, 3], "steps": [10, 10, 9, 10], "ages_s": [0.0, 1.0, 40.0, 0.5],
            "collectives": ["", "", "all_reduce", ""]}
    events = [f.step(10, 2.5, rank=0, world=4), _ranks(10), f.event(EventType.HEARTBEAT, 10, beat, world=4)]
    with session_scope(engine) as s:
        assert ingest_events(s, events) == 1 + 1 + 1
    with session_scope(engine) as s:
        assert [(m.step, m.rank, m.loss_local) for m in s.scalars(select(StepMetricRow))] == [(10, 0, 2.5)]
        assert s.scalar(select(func.count()).select_from(RankArrayRow)) == 1  # one row for the event
        ranks = read.rank_metrics(s, "run-a", columns=("loss_local", "compute_s", "mem_reserved"))
        assert [(m["step"], m["rank"], m["loss_local"]) for m in ranks] == [(10, 0, 2.5), (10, 1, 3.0), (10, 2, 4.0),
                                                                            (10, 3, 5.0)]
        assert ranks[1]["compute_s"] == pytest.approx(0.3) and ranks[1]["mem_reserved"] == 2 << 30
        latest = read.latest_rank_steps(s, "run-a")
        assert [r["rank"] for r in latest] == [0, 1, 2, 3] and latest[0]["loss"] == 2.5
        assert latest[2]["loss_local"] == 4.0 and latest[2]["loss"] is None and set(latest[2]) == set(latest[0])
        assert s.scalar(select(func.count()).select_from(HeartbeatRow)) == 1  # one row for the node
        beats = read.heartbeats(s, "run-a")
        assert [(b["rank"], b["step"], b["ts"]) for b in beats] == [(0, 10, f.T0 + 10), (1, 10, f.T0 + 9),
                                                                    (2, 9, f.T0 - 30), (3, 10, f.T0 + 9.5)]
    before = snapshot(engine)
    with session_scope(engine) as s:
        assert ingest_events(s, events) == 0
    assert snapshot(engine) == before


def test_rank_detail_reads_full_per_rank_rows_not_the_array_rows(engine):
    detail = [f.step(s, 2.5, rank=r, world=4, detail=True) for s in (11, 12) for r in (1, 2)]
    with session_scope(engine) as s:
        ingest_events(s, [f.step(10, 2.5, rank=0, world=4), _ranks(10), *detail])
    with session_scope(engine) as s:
        assert [r["step"] for r in read.rank_detail(s, "run-a", steps=1)] == [12, 12]
        rows = read.rank_detail(s, "run-a", steps=5)
        assert [(r["step"], r["rank"]) for r in rows] == [(10, 0), (11, 1), (11, 2), (12, 1), (12, 2)]  # not (10, 1..3)
        assert read.rank_detail(s, "other") == []

def test_run_started_stores_the_declared_capabilities_and_a_restart_without_them_clears_them(engine):
    with session_scope(engine) as s:
        ingest_event(s, f.run_started(ts=f.T0, capabilities=["validate", "pause"]))
        assert s.get(RunRow, "run-a").capabilities == ["pause", "validate"]  # in the enum's order
    with session_scope(engine) as s:
        ingest_event(s, f.run_started(ts=f.T0 + 10))  # an older agent: every command
        assert s.get(RunRow, "run-a").capabilities is None


def test_the_applied_lr_scale_follows_rank_0_steps_and_applied_rollback_acks_never_going_back(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.step(1, ts=f.T0 + 1), f.step(1, rank=1, lr_scale=0.1, ts=f.T0 + 2)])
        run = s.get(RunRow, "run-a")
        assert (run.lr_scale_applied, run.lr_scale_applied_at) == (1.0, f.T0 + 1)  # rank 1 does not speak for the run
        cmd_id = new_id()
        s.add(CommandRow(id=cmd_id, run_id="run-a", type="rollback", args={"to_step": 0, "lr_scale": 0.5},
                         issued_at=f.T0, expires_at=f.T0 + 60, status="sent"))
        refused = _command(s)  # a pause: its ack says nothing about the LR
    with session_scope(engine) as s:
        ingest_event(s, f.ack(cmd_id, "failed", ts=f.T0 + 3))
        assert s.get(RunRow, "run-a").lr_scale_applied == 1.0  # asked, never applied
    with session_scope(engine) as s:
        s.get(CommandRow, cmd_id).acked_at = None
        s.get(CommandRow, cmd_id).status = "sent"
    with session_scope(engine) as s:
        ingest_event(s, f.ack(cmd_id, "applied", ts=f.T0 + 4))
        ingest_event(s, f.ack(refused, "applied", ts=f.T0 + 5))
        assert s.get(RunRow, "run-a").lr_scale_applied == 0.5
        ingest_event(s, f.step(0, ts=f.T0 + 2))  # a late copy of an older step
        assert s.get(RunRow, "run-a").lr_scale_applied == 0.5
        ingest_event(s, f.step(1, lr_scale=0.5, ts=f.T0 + 6))
        assert (s.get(RunRow, "run-a").lr_scale_applied, s.get(RunRow, "run-a").lr_scale_applied_at) == (0.5, f.T0 + 6)
