"""The soak's pure parts (bench/soak/): the seed's schedule, the ledger arithmetic, the witness's
bookkeeping and every invariant on a synthetic seed: a clean one holds them all, and each kind of
damage breaks exactly the check that names it."""

from __future__ import annotations

import copy
import json

import pytest

from bench.soak.__main__ import markdown, table, totals
from bench.soak.invariants import CHECKS, GAP_BOUND_S, STUCK_BOUND_S, Observed, check_all
from bench.soak.ledger import executed_steps, longest_stall, overlap_s, ranges
from bench.soak.schedule import KINDS, STEP, WALL, Schedule, ScheduleConfig, make_schedule
from bench.soak.witness import Seen

T0 = 1_000_000.0
FAULTS = ["corrupt@5", "corrupt@6", "corrupt@7", "lr_blowup@40x100:3"]
STEPS = 60


# -- the schedule ----------------------------------------------------------------------------


def test_a_seed_is_one_schedule_within_the_declared_ranges():
    a, b = make_schedule(7, 600), make_schedule(7, 600)
    assert a == b and make_schedule(8, 600) != a
    for seed in range(1, 40):
        s = make_schedule(seed, 600)
        assert 6 <= len(s.events) <= 10
        for e in s.events:
            kind = KINDS[e.kind]
            assert kind.low_s <= e.duration_s <= kind.high_s
            assert (e.rank in (0, 1)) == (kind.target == "rank")
            if e.key == STEP:
                assert 30 <= e.at <= 540
            else:
                assert e.key == WALL and 30 * 0.15 <= e.at <= 540 * 0.15
        etas = [e.eta_s(0.15) for e in s.events]
        assert etas == sorted(etas)
    kinds = {e.kind for seed in range(1, 40) for e in make_schedule(seed, 600).events}
    assert kinds == set(KINDS)


def test_a_schedule_round_trips_through_its_json_and_says_what_it_does():
    s = make_schedule(3, 200)
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    text = s.describe()
    assert text.startswith(f"seed 3: {len(s.events)} events over 200 steps") and s.events[0].kind in text


def test_with_two_controllers_each_controller_fault_names_one_and_holds_only_that_one():
    one = make_schedule(5, 600)
    two = make_schedule(5, 600, ScheduleConfig(controllers=2))
    assert all(e.which is None for e in one.events) and "controllers" not in one.to_dict()
    picked = {e.which for seed in range(1, 30) for e in make_schedule(seed, 600, ScheduleConfig(controllers=2)).events
              if KINDS[e.kind].target == "controller"}
    assert picked == {0, 1}
    for e in two.events:
        assert (e.which is not None) == (KINDS[e.kind].target == "controller")
        if e.which is not None:
            assert e.target == f"controller-{e.which}" and f"controller {e.which}" in e.describe()
    assert Schedule.from_dict(json.loads(json.dumps(two.to_dict()))) == two and two.controllers == 2
    assert "2 controllers in one group" in two.describe()


def test_schedule_config_refuses_what_cannot_be_drawn():
    with pytest.raises(ValueError, match="events_min"):
        ScheduleConfig(events_min=5, events_max=3)
    with pytest.raises(ValueError, match="first: must be"):
        ScheduleConfig(first=-0.1)
    with pytest.raises(ValueError, match="kinds"):
        ScheduleConfig(kinds=("meteor",))
    only = make_schedule(1, 300, ScheduleConfig(kinds=("broker_kill",), events_min=2, events_max=2))
    assert [e.kind for e in only.events] == ["broker_kill", "broker_kill"]


# -- the ledger ------------------------------------------------------------------------------


def _record(rollback: tuple[int, int] | None = (42, 30), end: int | None = STEPS) -> list[dict]:
    lines = [{"kind": "start", "step": 0, "steps": STEPS, "lr_scale": 1.0}]
    cmds = [
        ("p1", "pause", 8, 8, 1.0),
        ("v1", "validate", 8, 8, 1.0),
        ("r1", "resume", 8, 8, 1.0),
        ("p2", "pause", 42, 42, 1.0),
        ("v2", "validate", 42, 42, 1.0),
    ]
    if rollback:
        cmds.append(("b2", "rollback", rollback[0], rollback[1], 0.5))
    before = 1.0
    for cid, kind, s0, s1, lr in cmds:
        lines.append(
            {
                "kind": "command",
                "id": cid,
                "type": kind,
                "status": "applied",
                "step_before": s0,
                "step_after": s1,
                "lr_scale_before": before,
                "lr_scale": lr,
            }
        )
        before = lr
    if end is not None:
        lines.append({"kind": "end", "step": end, "stop_reason": "", "lr_scale": before})
    return lines


def test_executed_steps_follow_the_record_through_a_rollback():
    done = executed_steps(_record())
    assert sorted(done) == list(range(STEPS)) and [done[s] for s in (29, 30, 41, 42)] == [1, 2, 2, 1]
    assert sum(executed_steps(_record(end=None)).values()) == 42  # the last stretch is unknown without an end


def test_ranges_overlap_and_the_longest_stall():
    assert ranges([30, 31, 32, 40, 42, 43]) == "30-32, 40, 42-43"
    assert ranges(range(0, 40, 2), limit=2) == "0, 2 (+18 more)"
    assert overlap_s(0, 10, [(2, 4), (3, 6), (8, 20)]) == pytest.approx(6)
    trainer = [float(t) for t in range(0, 100)]
    polls = [(float(t), float(min(t, 40) if t < 70 else t)) for t in range(0, 100)]
    stall, began = longest_stall(polls, trainer, since=0.0)
    assert stall == pytest.approx(28) and began == pytest.approx(41)  # behind by more than 1 s from t=42
    assert longest_stall(polls, trainer, since=80.0)[0] == 0
    paused = [float(t) for t in range(0, 41)]  # the trainer stopped at 40: a still store is no stall
    assert longest_stall(polls, paused, since=0.0)[0] == 0


# -- the witness's book ----------------------------------------------------------------------


def test_the_witness_keeps_each_id_once_and_counts_every_sighting():
    seen = Seen()
    ev = {
        "id": "e1",
        "type": "step",
        "run": "r",
        "rank": 0,
        "step": 4,
        "ts": 1.0,
        "data": {"lr_scale": 0.5, "skipped": True, "loss": 2.0},
    }
    seen.add("metrics", json.dumps(ev).encode(), 10.0)
    seen.add("metrics", json.dumps(ev).encode(), 11.0)  # re-read after a topic re-creation
    seen.add("metrics", b"{not json", 12.0)
    seen.add("commands", json.dumps({"id": "c1", "type": "pause", "run": "r"}).encode(), 13.0)
    assert seen.events["e1"] == {
        "id": "e1",
        "type": "step",
        "run": "r",
        "rank": 0,
        "step": 4,
        "ts": 1.0,
        "seen_at": 10.0,
        "lr_scale": 0.5,
        "skipped": True,
        "guard": None,
    }
    assert seen.sightings == {"metrics:e1": 2, "commands:c1": 1} and seen.undecodable == 1
    assert seen.commands["c1"]["type"] == "pause"


# -- the invariants on a synthetic seed -------------------------------------------------------


def _clean() -> Observed:
    """60 steps; corrupt@5-7 paused, validated, resumed (skipped); the blow-up at 40 rolled back to 30."""
    record = _record()
    rows, events, t = [], {}, T0
    timeline = list(range(0, 42)) + list(range(30, STEPS))
    for n, step in enumerate(timeline):
        eid = f"s{n}"
        t += 1.0
        rows.append({"event_id": eid, "step": step, "rank": 0, "resolution": 1})
        events[eid] = {
            "id": eid,
            "type": "step",
            "run": "run",
            "rank": 0,
            "step": step,
            "ts": t,
            "skipped": step in (5, 6, 7),
            "lr_scale": 1.0 if n < 42 else 0.5,
        }
    incidents = [
        {
            "id": "incA" * 4,
            "rule": "loss_spike",
            "level": "critical",
            "spike_step": 5,
            "onset_step": 5,
            "outcome": "resumed",
            "rollback_to": None,
            "lr_scale": 1.0,
            "opened_at": T0 + 6,
            "closed_at": T0 + 9,
        },
        {
            "id": "incB" * 4,
            "rule": "loss_spike",
            "level": "critical",
            "spike_step": 40,
            "onset_step": 40,
            "outcome": "rolled_back",
            "rollback_to": 30,
            "lr_scale": 0.5,
            "opened_at": T0 + 41,
            "closed_at": T0 + 60,
        },
    ]
    commands, outbox = [], {}
    for cid, inc in (
        ("p1", "incA"),
        ("v1", "incA"),
        ("r1", "incA"),
        ("p2", "incB"),
        ("v2", "incB"),
        ("b2", "incB"),
    ):
        kind = {"p": "pause", "v": "validate", "r": "resume", "b": "rollback"}[cid[0]]
        commands.append(
            {
                "id": cid,
                "incident_id": inc * 4,
                "type": kind,
                "attempt": 1,
                "status": "applied",
                "issued_at": T0 + 7,
                "expires_at": T0 + 67,
                "source": "controller",
                "ack_detail": "",
            }
        )
        outbox[cid] = {
            "status": "delivered",
            "created_at": T0 + 7,
            "delivered_at": T0 + 7.5,
            "attempts": 1,
            "last_error": None,
        }
    store = {
        "steps": rows,
        "ids": {"step": {r["event_id"] for r in rows}},
        "incidents": incidents,
        "commands": commands,
        "outbox": outbox,
        "run": {
            "status": "finished",
            "last_step": STEPS - 1,
            "lr_scale": 0.5,
            "lr_scale_applied": 0.5,
            "recovery_state": "running",
            "downsampled_below": 0,
        },
    }
    polls = [(T0 + k + 0.5, T0 + k) for k in range(1, len(timeline) + 5)]
    return Observed(
        run="run",
        steps=STEPS,
        training_faults=list(FAULTS),
        record=record,
        train_rc=0,
        events=events,
        commands_seen={c["id"]: {"id": c["id"], "type": c["type"], "run": "run"} for c in commands},
        store=store,
        logs={"controller.log": "all well\n"},
        controller_exits=[
            {"rc": -9, "asked": True, "how": "SIGKILL"},
            {"rc": 0, "asked": True, "how": "SIGTERM"},
        ],
        fault_windows=[("broker_kill", "broker", T0 + 2, T0 + 4)],
        polls=polls,
        ended_at=T0 + 100,
    )


def _broken(o: Observed) -> dict[str, int]:
    return {name: c.count for name, c in check_all(o).items() if c.count}


def test_a_clean_seed_holds_every_invariant():
    results = check_all(_clean())
    assert set(results) == {inv.name for inv in CHECKS}
    assert {n: c.count for n, c in results.items() if c.count} == {}


def test_lost_and_repeated_steps_are_counted_against_the_trainers_record():
    o = _clean()
    o.store["steps"] = [r for r in o.store["steps"] if r["step"] not in (3, 4)]
    o.store["ids"]["step"] = {r["event_id"] for r in o.store["steps"]}
    assert _broken(o) == {"steps_lost": 2, "witnessed_not_stored": 2}
    assert "3-4" in check_all(o)["steps_lost"].detail[0]
    o = _clean()
    o.store["steps"].append({"event_id": "again", "step": 2, "rank": 0, "resolution": 1})
    assert _broken(o) == {"steps_repeated": 1}
    o = _clean()
    o.store["run"]["downsampled_below"] = 8  # retention folded 0..7: their rows are accounted for
    o.store["steps"] = [r for r in o.store["steps"] if r["step"] >= 8]
    o.store["ids"]["step"] = {r["event_id"] for r in o.store["steps"]}
    assert _broken(o) == {}


def test_repeated_and_unexplained_incidents_and_commands():
    o = _clean()
    o.store["incidents"].append({**o.store["incidents"][0], "id": "incC" * 4, "spike_step": 6})
    o.store["incidents"].append({**o.store["incidents"][0], "id": "incD" * 4, "spike_step": 25})
    assert _broken(o) == {"incidents_repeated": 1, "incidents_unexplained": 1}
    # a hang incident opened while a rank was stopped (or soon after) is that stop's, not unexplained
    o = _clean()
    hang = {**o.store["incidents"][0], "id": "incH" * 4, "rule": "hang", "spike_step": 25, "outcome": "resumed"}
    o.store["incidents"].append({**hang, "opened_at": T0 + 40})
    o.fault_windows.append(("rank_stop", "rank", T0 + 30, T0 + 39))
    assert _broken(o) == {}
    o.store["incidents"][-1] = {**hang, "opened_at": T0 + 39 + 31}  # long after the rank went on
    assert _broken(o) == {"incidents_unexplained": 1}
    o.store["incidents"][-1] = {**hang, "opened_at": T0 + 40, "rule": "loss_spike"}  # a stop explains a hang only
    assert _broken(o) == {"incidents_unexplained": 1}
    # opened late by a controller that was stopped, but the trainer reported the stall during the stop
    o.store["incidents"][-1] = {**hang, "opened_at": T0 + 39 + 65, "first_report_ts": T0 + 38}
    assert _broken(o) == {}
    o.store["incidents"][-1] = {**hang, "opened_at": T0 + 40, "first_report_ts": T0 + 39 + 31}  # reported later
    assert _broken(o) == {"incidents_unexplained": 1}
    o = _clean()
    o.store["commands"].append({**o.store["commands"][3], "id": "p2bis"})
    o.store["outbox"]["p2bis"] = o.store["outbox"]["p2"]
    o.commands_seen["p2bis"] = {"id": "p2bis", "type": "pause", "run": "run"}
    assert _broken(o) == {"commands_repeated": 1}


def test_a_command_applied_twice_and_an_incident_rolled_back_twice():
    o = _clean()
    o.record.insert(-1, {**o.record[1]})
    assert _broken(o) == {"command_applied_twice": 1}
    o = _clean()
    o.store["commands"].append({**o.store["commands"][5], "id": "b3", "attempt": 2})
    o.store["outbox"]["b3"] = o.store["outbox"]["b2"]
    o.commands_seen["b3"] = {"id": "b3", "type": "rollback", "run": "run"}
    o.record.insert(
        -1, {**o.record[6], "id": "b3", "step_before": 30, "step_after": 30, "lr_scale_before": 0.5}
    )
    assert _broken(o) == {"incident_rolled_back_twice": 1}


def test_an_lr_change_no_incident_explains_is_unexplained():
    o = _clean()  # the trainer's hold timed out and it rolled back alone; the controller never knew
    o.record = _record(rollback=None, end=None)
    o.record.append(
        {
            "kind": "timeout",
            "wait": "hold",
            "policy": "rollback",
            "after_s": 120,
            "step_before": 42,
            "step_after": 31,
            "lr_scale_before": 1.0,
            "lr_scale": 0.5,
        }
    )
    o.record.append({"kind": "end", "step": STEPS, "stop_reason": "", "lr_scale": 0.5})
    o.store["incidents"][1].update(outcome="halted", rollback_to=None, lr_scale=1.0)
    o.store["run"]["lr_scale"] = 1.0
    results = check_all(o)
    assert results["lr_unexplained"].count == 2
    assert (
        "timeout" in results["lr_unexplained"].detail[0]
        and "asked lr_scale 1" in results["lr_unexplained"].detail[1]
    )
    # the halted incident explains the blow-up's other outcome: noted, not counted
    assert results["fault_outcomes"].count == 0 and "halted instead" in results["fault_outcomes"].detail[0]


def test_training_faults_without_their_outcome():
    o = _clean()
    o.store["incidents"] = o.store["incidents"][1:]
    o.store["commands"] = [c for c in o.store["commands"] if c["incident_id"] != "incA" * 4]
    o.commands_seen = {
        k: v for k, v in o.commands_seen.items() if k in {c["id"] for c in o.store["commands"]}
    }
    results = check_all(o)
    assert results["fault_outcomes"].count == 1 and "no incident" in results["fault_outcomes"].detail[0]
    o = _clean()
    next(e for e in o.events.values() if e["step"] == 6)["skipped"] = False
    assert _broken(o) == {"fault_outcomes": 1}
    o = _clean()
    o.store["incidents"][1]["lr_scale"] = 0.25
    o.store["run"]["lr_scale"] = 0.5
    assert _broken(o)["fault_outcomes"] == 1


def test_commands_stuck_outside_fault_time_and_commands_the_store_never_knew():
    o = _clean()
    o.store["outbox"]["b2"] = {
        **o.store["outbox"]["b2"],
        "status": "pending",
        "delivered_at": None,
        "attempts": 6,
    }
    o.store["commands"][5]["expires_at"] = T0 + 7 + STUCK_BOUND_S + 40
    o.ended_at = T0 + 200
    assert _broken(o) == {"commands_stuck": 1}
    o.fault_windows.append(("controller_stop", "controller", T0 + 7, T0 + 7 + 40))
    assert _broken(o) == {}  # 40 s of its wait were a stopped controller's
    o = _clean()
    o.commands_seen["ghost"] = {"id": "ghost", "type": "pause", "run": "run"}
    assert _broken(o) == {"commands_unknown": 1}


def test_a_store_standing_still_after_the_faults_is_a_gap():
    o = _clean()
    stuck_until = T0 + 10 + GAP_BOUND_S + 5  # the store holds at T0+10 while the trainer goes on
    o.polls = [(t, v if t < T0 + 10 else (T0 + 10 if t < stuck_until else v)) for t, v in o.polls]
    assert _broken(o) == {"gap_after_faults": 1}
    o.fault_windows.append(("controller_stop", "controller", T0 + 5, stuck_until - 2))
    assert _broken(o) == {}  # a store held back by a fault, catching up within the bound once it ended


KAFKA_RESET = """2026-12-02 01:52:10,954 ERROR r14549 kafka.net.transport: <KafkaTCPTransport>: Error receiving
Traceback (most recent call last):
  File "/usr/lib/python3.11/site-packages/kafka/net/transport.py", line 88, in _read_from_sock
    data = self._sock.recv(self._bufsize)
ConnectionResetError: [Errno 104] Connection reset by peer
2026-12-02 01:52:10,955 ERROR r14549 kafka.net.transport: socket disconnected
"""
OURS_CHAINED = """2026-12-02 01:00:00,000 ERROR kafka.net.selector: Unhandled exception in task
Traceback (most recent call last):
  File "/usr/lib/python3.11/selectors.py", line 225, in _fileobj_lookup
KeyError: 'fd -1 is not registered'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/repo/controller/outbox.py", line 120, in publish_due
    producer.send(row)
ValueError: Invalid file descriptor: -1
"""


def test_tracebacks_are_told_apart_by_who_logged_them_and_whose_frames_they_hold():
    from bench.soak.tracebacks import find

    (lib,) = find(KAFKA_RESET)
    assert (lib.logger, lib.ours, lib.exception) == (
        "kafka.net.transport",
        False,
        "ConnectionResetError: [Errno 104] Connection reset by peer",
    )
    (chained,) = find(OURS_CHAINED)  # one record: the chain is one logged exception
    assert (
        chained.ours
        and chained.exception == "ValueError: Invalid file descriptor: -1"
        and len(chained.frames) == 2
    )
    (uncaught,) = find(
        'boom\nTraceback (most recent call last):\n  File "/x/site-packages/torch/a.py", '
        "line 1\nRuntimeError: x\n"
    )
    assert uncaught.logger is None and uncaught.ours
    o = _clean()
    o.logs.update({"train.log": KAFKA_RESET, "controller.log": OURS_CHAINED})
    results = check_all(o)
    assert _broken(o) == {"tracebacks": 1, "library_tracebacks": 1}
    assert "kafka" in results["library_tracebacks"].detail[0]


def test_a_kept_seed_is_judged_again_from_its_observed_json(tmp_path):
    from bench.soak.__main__ import main
    from bench.soak.observed import Observed

    o = _clean()
    again = Observed.from_json(json.loads(json.dumps(o.to_json())))
    assert again == o
    o.store["ids"]["data.flag"] = {None, "f1"}  # a flag the controller wrote itself has no event id
    assert Observed.from_json(json.loads(json.dumps(o.to_json()))).store["ids"]["data.flag"] == {"f1"}
    o.logs["train.log"] = KAFKA_RESET
    (tmp_path / "seed-1").mkdir()
    (tmp_path / "seed-1" / "observed.json").write_text(json.dumps(o.to_json()))
    row = {
        "seed": 1,
        "ok": True,
        "dir": str(tmp_path / "seed-1"),
        "wall_s": 1.0,
        "fired": [],
        "checks": {"tracebacks": {"count": 0, "detail": []}},
    }
    (tmp_path / "earlier.json").write_text(json.dumps({"store": "sqlite", "steps": 60, "seeds": [row]}))
    assert main(["--recheck", str(tmp_path / "earlier.json"), "--json", str(tmp_path / "judged.json")]) == 1
    judged = json.loads((tmp_path / "judged.json").read_text())["seeds"][0]
    assert judged["ok"] is False and judged["checks"]["library_tracebacks"]["count"] == 1


def test_tracebacks_and_unasked_controller_exits():
    o = _clean()
    o.logs["train.log"] = 'ok\nTraceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    o.controller_exits.insert(0, {"rc": 1, "asked": False, "how": "unasked"})
    results = check_all(o)
    assert _broken(o) == {"tracebacks": 1, "controller_exits": 1}
    assert results["tracebacks"].detail == ["train.log: ValueError: boom"]
    o = _clean()
    o.train_rc = 1
    o.record[-1]["step"] = 17
    o.store["run"]["status"] = "failed"
    assert check_all(o)["run_finished"].count == 3


def test_the_table_prints_a_row_per_seed_and_the_totals():
    good = {
        "seed": 1,
        "ok": True,
        "wall_s": 120.0,
        "fired": [{"fired": True}] * 7,
        "checks": {inv.name: {"count": 0, "detail": []} for inv in CHECKS},
    }
    bad = copy.deepcopy(good)
    bad.update(seed=2, ok=False)
    bad["checks"]["steps_lost"]["count"] = 32
    t = totals([good, bad])
    assert t["seeds_ok"] == 1 and t["checks"]["steps_lost"] == 32 and t["events_fired"] == 14
    text = table([good, bad])
    lines = text.splitlines()
    assert lines[2].split()[0] == "1" and lines[3].split()[-1] == "NO" and "1/2" in lines[5]
    assert all(inv.name in text for inv in CHECKS)
    good["fired"] = [{"fired": True, "kind": "broker_kill"}] * 2 + [{"fired": False, "kind": "rank_stop"}]
    bad["fired"] = [{"fired": True, "kind": "store_lock"}]
    md = markdown([good, bad]).splitlines()
    assert (
        md[2] == "| 1 | 2: broker_kill x2 | 120 | none |"
        and md[3] == "| 2 | 1: store_lock | 120 | `steps_lost` 32 |"
    )
    assert "| `steps_lost` | 32 |" in md and "| invariant | total over 2 seeds |" in md


def test_the_fault_injection_page_lists_every_fault_kind_and_invariant():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "fault-injection.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in page.splitlines() if line.startswith("| `")}
    assert set(KINDS) <= rows and {inv.name for inv in CHECKS} <= rows
    for kind in KINDS.values():
        assert f"| `{kind.name}` | {kind.target} | {kind.low_s:g}–{kind.high_s:g} s |" in page
