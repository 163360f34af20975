"""Device-level eviction (controller/recovery_hang.py ``_decide``, ``recovery_table.device_only``): a
bad rank, a rank over its transient budget or a persistent SDC on a node that runs more than one rank
leaves out that rank's device alone; the node stays (its launcher starts torchrun again with one
process fewer: cliffguard/plan_watch.py). A one-rank node, an unknown device, and the hangs' culprits
are left out whole, as before. Pure: the machine's inputs and actions, the plan and the edge's map."""

from __future__ import annotations

import pytest

from cliffguard.controller.rank_nodes import RankNodes
from cliffguard.controller.recovery_hang_types import RecordSuspect
from cliffguard.controller.recovery_table import can_exclude, device_only
from cliffguard.controller.recovery_types import (
    Alert,
    CloseIncident,
    OpenIncident,
    Phase,
    RecordTransition,
    SendCommand,
    StartedIn,
    TriagedIn,
)
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_event
from cliffguard.core.restart_plan import RestartPlan, device_slot, device_slots
from tests.controller.test_recovery import Driver, healthy_run, recovering_after_a_rollback
from tests.controller.test_recovery_sdc import _healthy_40, _sdc

LEFT = "device 1 of node node-b left out (the node keeps 1)"


def _torchrun(d: Driver, *, life: int = 0, nodes: int = 2, restarts_left: int = 3, min_nodes: int = 1) -> None:
    d.feed(StartedIn(capabilities=tuple(CommandType), now=d.now, life=life, max_restarts=3, restarts_left=restarts_left,
                     nodes=nodes, min_nodes=min_nodes))


def _bad(d: Driver, step: int, *, device: int | None = 1, node_devices: int = 2, cls: str = "bad_rank",
         counts: dict[str, int] | None = None):
    return d.feed(TriagedIn(step=step, now=d.now, cls=cls, remedy="evict", rank=3, reason="rank 3 stays wrong",
                            reruns=2, rerun_s=0.05, sample_ids=(), update_applied=False, ts=5000.0 + step,
                            node="node-b", device=device, node_devices=node_devices,
                            transient_counts=counts or {}))


def _beat(node: str, ranks: tuple[int, ...], life: int = 0, slots: list[int] | None = None):
    n = len(ranks)
    data = {"state": "running", "ranks": list(ranks), "steps": [5] * n, "ages_s": [0.1] * n, "collectives": [""] * n,
            "node": node, "life": life}
    if slots is not None:
        data["slots"] = slots
    return make_event(EventType.HEARTBEAT, "run-1", 5, data, rank=ranks[0], world=8)


def test_a_bad_rank_on_a_node_with_several_ranks_leaves_out_its_device_only():
    d = Driver()
    _torchrun(d, nodes=2, min_nodes=2)  # no node may leave: a device may
    healthy_run(d, 30)
    acts = _bad(d, 31)
    (opened,) = [a for a in acts if isinstance(a, OpenIncident)]
    assert opened.rule == "bad_rank" and opened.evidence["scope"] == "device" and opened.evidence["device"] == 1
    assert opened.evidence["left_out"] == LEFT
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["mode"] == "exclude" and "exclude_nodes" not in cmd.args
    assert cmd.args["exclude_devices"] == [{"node": "node-b", "slot": 1}] and cmd.args["ranks"] == [3]
    (move,) = [a for a in acts if isinstance(a, RecordTransition)]
    assert (move.from_state, move.to_state, move.trigger) == (Phase.RUNNING, Phase.RESTARTING, "evict_device")
    assert LEFT in move.reason
    (alert,) = [a for a in acts if isinstance(a, Alert)]
    assert LEFT in alert.title and alert.level == "critical"
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert (rec.node, rec.device, rec.cause) == ("node-b", 1, "bad_rank")
    assert d.s.hang.restart is not None and d.s.hang.restart.exclude == ()  # every node stays
    _torchrun(d, life=1, nodes=2, min_nodes=2)
    d.steps(31, 31)
    assert d.s.phase is Phase.RUNNING
    assert [(c.id, c.outcome) for c in d.actions if isinstance(c, CloseIncident)] == [(opened.id, "restarted")]


@pytest.mark.parametrize("device, node_devices", [(0, 1), (None, 0), (None, 4)])
def test_a_one_rank_node_or_an_unknown_device_leaves_the_whole_node_out(device, node_devices):
    d = Driver()
    _torchrun(d)
    healthy_run(d, 30)
    acts = _bad(d, 31, device=device, node_devices=node_devices)
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["exclude_nodes"] == ["node-b"] and "exclude_devices" not in cmd.args
    assert d.triggers() == ["evict"]
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert rec.device is None
    assert [a for a in acts if isinstance(a, OpenIncident)][0].evidence["scope"] == "node"


def test_a_rank_over_its_transient_budget_on_a_shared_node_leaves_out_its_device():
    d = Driver()  # transient_budget 3
    _torchrun(d)
    healthy_run(d, 40)
    acts = _bad(d, 39, cls="transient", counts={"3": 3})
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["exclude_devices"] == [{"node": "node-b", "slot": 1}] and d.triggers() == ["evict_device"]
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert (rec.device, rec.cause) == (1, "transient")


def test_no_restart_left_halts_a_device_eviction_as_a_nodes():
    d = Driver()
    _torchrun(d, restarts_left=0)
    healthy_run(d, 30)
    _bad(d, 31)
    assert d.s.phase is Phase.HALTED and d.triggers()[-1] == "restart_unavailable"


def _sdc_nodes(d: Driver, *, life: int = 0, b_slots: list[int] | None = None) -> RankNodes:
    """node-a runs rank 0 alone, node-b ranks 1-2 (slots 0-1), as the SDC e2e runs 1 + 2."""
    rn = RankNodes()
    rn.seen(_beat("node-a", (0,), life))
    rn.seen(_beat("node-b", (1, 2), life, b_slots))
    return rn


def test_a_persistent_sdc_on_a_node_with_several_ranks_leaves_out_its_device_only():
    d = Driver()
    _torchrun(d)
    rn = _sdc_nodes(d, b_slots=[0, 1])
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25, nodes=rn)  # rank 2 (node-b, slot 1): rolled back first
    d.ack()
    d.steps(20, 22)
    acts = _sdc(d, 22, last_agreed=20, nodes=rn)  # again: a persistent SDC, its device left out
    (cmd,) = [a for a in acts if isinstance(a, SendCommand)]
    assert cmd.args["exclude_devices"] == [{"node": "node-b", "slot": 1}] and "exclude_nodes" not in cmd.args
    (move,) = [a for a in acts if isinstance(a, RecordTransition)]
    assert (move.from_state, move.to_state, move.trigger) == (Phase.RECOVERING, Phase.RESTARTING, "sdc_again_device")
    assert LEFT in move.reason and "persistent silent data corruption" in move.reason
    (rec,) = [a for a in acts if isinstance(a, RecordSuspect)]
    assert (rec.node, rec.device, rec.cause) == ("node-b", 1, "sdc")


def test_a_persistent_sdc_in_a_later_incident_leaves_out_its_device_too():
    d = Driver()
    _torchrun(d)
    rn = _sdc_nodes(d)
    _healthy_40(d)
    _sdc(d, 40, last_agreed=25, nodes=rn)
    d.ack()
    d.steps(20, 40)
    assert d.s.phase is Phase.RUNNING
    _sdc(d, 40, last_agreed=35, nodes=rn)
    assert d.triggers()[-1] == "sdc_again_device" and d.s.phase is Phase.RESTARTING
    assert [c[1]["exclude_devices"] for c in d.commands() if c[0] == "restart"] == [[{"node": "node-b", "slot": 1}]]


def test_the_edge_names_the_device_slot_the_node_beat_said_after_an_earlier_device_left():
    rn = RankNodes()
    rn.seen(_beat("node-b", (4, 5, 6), 2, slots=[0, 2, 3]))  # slot 1 was evicted earlier in this launch
    inp = TriagedIn(step=1, now=0.0, cls="bad_rank", remedy="evict", rank=5, reason="", reruns=1, rerun_s=0.0,
                    sample_ids=(), update_applied=False, node="node-b")
    out = rn.annotate("run-1", inp)
    assert (out.device, out.node_devices) == (2, 3)
    assert rn.annotate("run-1", TriagedIn(**{**_fields(inp), "node": "node-c"})).device is None  # another node's word


def _fields(inp: TriagedIn) -> dict:
    return {f: getattr(inp, f) for f in inp.__slots__}


def test_the_guards_are_pure_and_the_hangs_stay_at_node_granularity():
    d = Driver()
    _torchrun(d, nodes=2, min_nodes=2)
    inp = TriagedIn(step=1, now=0.0, cls="bad_rank", remedy="evict", rank=1, reason="", reruns=1, rerun_s=0.0,
                    sample_ids=(), update_applied=False, node="b", device=1, node_devices=2)
    assert device_only(d.cfg, d.s, inp, ("b",))
    assert not device_only(d.cfg, d.s, TriagedIn(**{**_fields(inp), "node_devices": 1}), ("b",))
    assert not device_only(d.cfg, d.s, inp, ("b", "c"))
    assert not can_exclude(d.cfg, d.s, ("b",)) and can_exclude(d.cfg, d.s, ("b",), True)
    assert not device_only(d.cfg, d.s, object(), ("b",))  # a hang, a node check, a suspect's beat: node-level


def test_the_plan_says_its_scope_and_round_trips():
    plan = RestartPlan(mode="exclude", life=2, exclude_devices=(("b", 1),), ranks=(3,))
    assert plan.scope == "device" and plan.devices_out("b") == (1,) and plan.devices_out("a") == ()
    assert not plan.excludes("b")  # the node stays
    assert RestartPlan.from_dict(plan.to_dict()) == plan
    whole = RestartPlan(mode="exclude", life=2, exclude_nodes=("b",))
    assert whole.scope == "node" and whole.devices_out("b") == () and whole.excludes("b")
    with pytest.raises(ValueError):
        RestartPlan(mode="exclude", life=2)


def test_device_slots_map_local_ranks_through_the_launchers_list():
    env = {"CLIFFGUARD_DEVICE_SLOTS": "0,2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert device_slots(2, env) == (0, 2) and device_slot(env) == 2
    assert device_slots(3, env) == (0, 1, 2)  # a list of another size is not this launch's: the local ranks
    assert device_slot({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == 1


def take_every_device_eviction_transition() -> None:
    """For the coverage test of every declared transition (tests/controller/test_recovery_held.py)."""
    test_a_bad_rank_on_a_node_with_several_ranks_leaves_out_its_device_only()
    test_a_persistent_sdc_on_a_node_with_several_ranks_leaves_out_its_device_only()
    test_a_persistent_sdc_in_a_later_incident_leaves_out_its_device_too()
    d = Driver()  # evicted while recovering from a rollback
    _torchrun(d)
    recovering_after_a_rollback(d)
    _bad(d, 36)
    assert d.triggers()[-1] == "evict_device"
