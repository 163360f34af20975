"""controller/rank_nodes.py: the edge's rank -> node map, written to the store only when a run's
mapping changes (not per beat), and loaded back at a controller's start."""

from __future__ import annotations

from cliffguard.controller.rank_nodes import RankNodes
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event


def _beat(run: str, node: str, ranks: list[int], life: int | None = 0):
    data = {"state": "running", "ranks": ranks, "steps": [5] * len(ranks), "ages_s": [0.1] * len(ranks),
            "collectives": [""] * len(ranks), "node": node}
    if life is not None:
        data["life"] = life
    return make_event(EventType.HEARTBEAT, run, 5, data, rank=ranks[0], world=4)


def test_only_a_changed_mapping_is_handed_to_the_store_and_only_until_its_batch_committed():
    rn = RankNodes()
    rn.seen(_beat("r", "node-a", [0, 1]))
    rn.seen(_beat("r", "node-b", [2, 3]))
    # each rank's node and life, and its device slot on the node and the node's rank count
    assert rn.unsaved() == {"r": {0: ("node-a", 0, 0, 2), 1: ("node-a", 0, 1, 2), 2: ("node-b", 0, 0, 2),
                                  3: ("node-b", 0, 1, 2)}}
    assert rn.unsaved()  # the batch rolled back (no saved()): handed again with the next one
    rn.saved()
    for _ in range(5):  # the same beats again: nothing to write
        rn.seen(_beat("r", "node-a", [0, 1]))
        rn.seen(_beat("r", "node-b", [2, 3]))
    assert rn.unsaved() == {}
    rn.saved()
    rn.seen(_beat("r", "node-b", [2, 3], life=1))  # a restarted group: a new life is a change
    assert rn.unsaved()["r"][2] == ("node-b", 1, 0, 2)
    rn.saved()
    assert rn.unsaved() == {}


def test_a_loaded_map_names_the_node_and_what_the_beats_say_since_wins():
    rn = RankNodes(runs_kept=2)
    rn.seen(_beat("new", "node-x", [0]))
    rn.load({"old1": {0: ("node-a", 3, None, None)}, "old2": {1: ("node-b", None, 1, 2)},
             "new": {0: ("stale", 0, None, None)}})
    assert rn.node_of("new", 0) == ("node-x", 0)  # the beat this edge saw is newer than the store's
    assert rn.node_of("old2", 1) == ("node-b", None) and rn.device_of("old2", 1) == ("node-b", None, 1, 2)
    assert rn.node_of("old1", 0) is None  # past runs_kept: the oldest loaded is forgotten first
    assert rn.unsaved() == {"new": {0: ("node-x", 0, 0, 1)}}  # loaded runs are the store's already


def test_a_rank_that_moves_slot_on_its_node_is_a_change_the_store_gets():
    rn = RankNodes()
    rn.seen(_beat("r", "node-a", [0, 1]))
    rn.unsaved()
    rn.saved()  # the store has slots 0 and 1
    assert rn.unsaved() == {}
    beat = _beat("r", "node-a", [0, 1])
    beat.data["slots"] = [2, 3]  # the same ranks on other devices of the node (CLIFFGUARD_DEVICE_SLOTS)
    rn.seen(beat)
    assert rn.unsaved() == {"r": {0: ("node-a", 0, 2, 2), 1: ("node-a", 0, 3, 2)}}
