"""Naming a hang's culprit from every rank's Flight Recorder sequence numbers (controller/hang_culprit.py)."""

from __future__ import annotations

from cliffguard.controller.hang_culprit import name_culprit, node_of


def waits(seq: int, node: str = "a", collective: str = "all_reduce", **kw) -> dict:
    """A rank inside collective ``seq`` (enqueued, not completed)."""
    return {"reason": "stalled", "node": node, "local_world": 2, "collective": collective,
            "pg_status": {"0": {"enqueued": seq, "started": -1, "completed": seq - 1}},
            "in_flight": [{"pg": "0", "seq": seq, "op": "gloo:all_reduce"}], "frame": "step_probe.py:181 in f", **kw}


def outside(seq: int, frame: str, node: str = "b") -> dict:
    """A rank that finished ``seq`` and entered nothing since."""
    return {"reason": "stalled", "node": node, "local_world": 2, "collective": "",
            "pg_status": {"0": {"enqueued": seq, "started": -1, "completed": seq}}, "in_flight": [], "frame": frame}


def test_a_rank_outside_any_collective_while_the_others_wait_is_the_culprit_with_its_frame():
    reports = {0: waits(60), 1: waits(60), 2: waits(60, node="b"), 3: outside(59, "data.py:12 in fetch")}
    c = name_culprit(reports, world=4)
    assert (c.ranks, c.kind, c.seq, c.frame, c.nodes) == ((3,), "outside_collective", 60, "data.py:12 in fetch", ("b",))
    assert c.op == "gloo:all_reduce (all_reduce)"
    assert [row["verdict"] for row in c.table] == ["waits", "waits", "waits", "culprit"]
    assert c.table[3]["enqueued"] == 59 and c.table[0]["in_flight"] == "#60 gloo:all_reduce"
    assert "rank 3 never entered collective #60" in c.message and "data.py:12 in fetch" in c.message


def test_a_rank_its_node_saw_dead_is_the_culprit_even_when_a_survivor_also_sent_nothing():
    failed = {"reason": "collective_error", "error": "Connection closed by peer"}
    reports = {0: waits(60, **failed), 2: waits(60, node="b", **failed, gone=[3])}
    c = name_culprit(reports, world=4)
    assert (c.ranks, c.kind, c.nodes) == ((3,), "died", ("b",))  # rank 1 was stopped before it reported
    assert [row["verdict"] for row in c.table] == ["waits", "no evidence", "waits", "culprit"]


def test_without_a_death_seen_the_ranks_that_sent_nothing_are_named():
    c = name_culprit({0: waits(60), 1: waits(60), 2: waits(60, node="b")}, world=4)
    assert (c.ranks, c.kind, c.frame) == ((3,), "no_evidence", "")
    assert c.nodes == ("b",)  # rank 3's node: ranks of a node are contiguous (local_world 2)
    assert "sent no evidence" in c.message


def test_with_every_rank_reporting_a_rank_behind_the_others_is_named():
    c = name_culprit({0: waits(61), 1: waits(61), 2: waits(60, node="b"), 3: waits(61, node="b")}, world=4)
    assert (c.ranks, c.kind, c.seq) == ((2,), "behind", 61)


def test_every_rank_inside_the_same_collective_names_no_culprit():
    c = name_culprit({r: waits(60, node="a" if r < 2 else "b") for r in range(4)}, world=4)
    assert not c.named and c.kind == "none" and c.ranks == ()
    assert "no culprit" in c.message and "the network" in c.message


def test_the_group_with_the_spread_is_the_one_compared():
    def two(seq0: int, seq1: int, done1: int) -> dict:
        return {"reason": "stalled", "node": "a", "collective": "",
                "pg_status": {"0": {"enqueued": seq0, "completed": seq0}, "1": {"enqueued": seq1, "completed": done1}},
                "in_flight": [{"pg": "1", "seq": seq1, "op": "gloo:allgather"}] if done1 < seq1 else [], "frame": "ck.py:1 in w"}

    c = name_culprit({0: two(50, 9, 8), 1: two(50, 8, 8)}, world=2)
    assert (c.pg, c.ranks, c.op) == ("1", (1,), "gloo:allgather")


def test_node_of_a_silent_rank_comes_from_its_node_neighbours():
    reports = {0: waits(5, node="a"), 2: waits(5, node="b")}
    assert [node_of(r, reports) for r in range(4)] == ["a", "a", "b", "b"]
    assert node_of(1, {0: {**waits(5), "local_world": 0}}) == ""
