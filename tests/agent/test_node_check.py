"""The pre-flight node check (agent/hang/node_check.py): pairs, re-pairing, the judgement; and a
real 4-process gloo run that finds the slow rank (slow tier)."""

from __future__ import annotations

import os

import pytest
import torch.multiprocessing as mp

from cliffguard.agent.hang.node_check import RankResult, groups_for, judge


def test_pairs_and_their_shift_cover_every_rank_and_a_leftover_joins_the_last_pair():
    assert groups_for(4, 0) == [[0, 1], [2, 3]] and groups_for(4, 1) == [[1, 2], [0, 3]]
    assert groups_for(5, 0) == [[0, 1], [2, 3, 4]] and groups_for(5, 1) == [[1, 2], [0, 3, 4]]
    assert groups_for(1, 0) == [[0]] and groups_for(2, 1) == [[0, 1]]


def _results(world: int, slow: int | None = None, extra: float = 0.5, base: float = 0.01) -> list[RankResult]:
    out = []
    for r in range(world):
        rounds = []
        for k in range(2):
            group = next(g for g in groups_for(world, k) if r in g)
            rounds.append(base + (extra if slow in group else 0.0))
        out.append(RankResult(r, "a" if r < world // 2 else "b", base + (extra if r == slow else 0.0), tuple(rounds)))
    return out


def test_the_rank_slow_in_both_pairings_is_named_with_its_node():
    res = judge(_results(4, slow=3), 4, factor=3.0, min_s=0.002, seconds=1.5, life=2)
    assert not res.ok and res.slow == [3] and res.slow_nodes == ["b"]
    assert res.rounds[0]["slow"] == [1] and res.rounds[1]["slow"] == [1]  # (2,3) then (0,3)
    assert "slow in every pair: ranks [3]" in res.detail and "matmul rank 3" in res.detail
    data = res.event_data()
    assert data["life"] == 2 and data["seconds"] == 1.5 and data["nodes"] == ["a", "a", "b", "b"]


def test_a_slow_pair_alone_names_no_rank_and_healthy_ranks_pass():
    pairs_only = [RankResult(r.rank, r.node, 0.01, r.group_s) for r in _results(4, slow=3)]
    res = judge(pairs_only, 4, factor=3.0, min_s=0.002)
    assert res.slow == [3]  # both pairings agree: the pairs alone isolate it
    one_round = [RankResult(r, "a", 0.01, (0.5 if r in (2, 3) else 0.01, 0.01)) for r in range(4)]
    assert judge(one_round, 4, factor=3.0, min_s=0.002).ok
    assert judge(_results(4), 4, factor=3.0, min_s=0.002).ok


def test_on_two_ranks_only_the_matmul_can_tell_and_noise_below_min_s_is_not_slow():
    res = judge(_results(2, slow=1), 2, factor=3.0, min_s=0.002)
    assert res.slow == [1] and "matmul" in res.detail
    tiny = [RankResult(0, "a", 0.0001, (0.001, 0.001)), RankResult(1, "a", 0.0005, (0.001, 0.001))]
    assert judge(tiny, 2, factor=3.0, min_s=0.002).ok  # 5x, but 0.4 ms


def test_a_rank_that_sent_nothing_or_failed_its_pair_is_slow():
    res = judge(_results(4)[:3], 4, factor=3.0, min_s=0.002)
    assert res.slow == [3] and "no result from ranks [3]" in res.detail
    failed = _results(4)
    failed[2] = RankResult(2, "b", 0.01, (float("inf"), float("inf")))
    assert judge(failed, 4, factor=3.0, min_s=0.002).slow == [2]



def _ranks(target, world: int, *args) -> list:
    """``target(rank, world, port, *args, out)`` in ``world`` spawned processes; what each put, by rank."""
    from cliffguard.controller.broker import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    return got

def _worker(rank: int, world: int, port: int, slow: int, out) -> None:
    import torch
    import torch.distributed as dist

    from cliffguard.agent.hang.config import HangConfig
    from cliffguard.agent.hang.node_check import run_check

    torch.set_num_threads(1)  # as the trainer's workers run on CPUs (one thread each)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import time

        def hook(k: int) -> None:
            if rank == slow:
                time.sleep(0.02)

        res = run_check(HangConfig(check_size=128, check_iters=10), rank, world, f"node{rank // 2}", life=1, before_round=hook)
        out.put((rank, res.ok, res.slow, res.slow_nodes, res.detail, res.rounds))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_real_four_rank_check_finds_the_slow_rank_on_every_rank():
    got = _ranks(_worker, 4, 2)
    assert [g[:4] for g in got] == [(r, False, [2], ["node1"]) for r in range(4)], got[0][4:]


def _late_worker(rank: int, world: int, port: int, late_s: float, out) -> None:
    import time

    import torch
    import torch.distributed as dist

    from cliffguard.agent.hang.config import HangConfig
    from cliffguard.agent.hang.node_check import run_check

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if rank == 1:
            time.sleep(late_s)  # a restarted rank whose start (imports, a slow disk) lags its peer's
        try:
            res = run_check(HangConfig(check_size=64, check_iters=4, check_timeout_s=1.5), rank, world, "node0", life=1)
            out.put((rank, "result", res.ok))
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            out.put((rank, "raised", f"{type(exc).__name__}: {exc}"[:200]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_pair_whose_group_cannot_form_in_time_is_a_failed_pair_not_a_crashed_check():
    """A peer later than ``check_timeout_s`` made ``new_group`` raise out of the check (the restarted
    life then died in its pre-flight); now that round fails the pair and the check still answers."""
    got = _ranks(_late_worker, 2, 4.0)
    assert got[0] == (0, "result", False), got  # rank 0 waited for its pair in vain: a failed pair
    assert got[1][:2] == (1, "result"), got  # the late rank is answered too, whatever it judged


def _counting_worker(rank: int, world: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    from cliffguard.agent.hang.config import HangConfig
    from cliffguard.agent.hang.node_check import run_check

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    made = []
    real = dist.new_group

    def counting(*args, **kwargs):
        made.append(args[0] if args else kwargs.get("ranks"))
        return real(*args, **kwargs)

    dist.new_group = counting
    try:
        res = run_check(HangConfig(check_size=64, check_iters=4, check_timeout_s=3.0), rank, world, "node0", life=1)
        out.put((rank, made, res.rounds))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_world_of_two_makes_its_one_pair_once_and_times_both_rounds_on_it():
    """World 2 pairs (0, 1) in every round. A second new_group of the same ranks, after the first was
    destroyed, gets the same hashed name, and its gloo connect can read the first one's stale
    addresses from the store (a restarted life in CI: round 1 timed out on both ranks). The pair is
    made once and every round has a time."""
    got = _ranks(_counting_worker, 2)
    for _rank, made, rounds in got:
        assert made == [[0, 1]], made
        assert all(s >= 0 for rnd in rounds for s in rnd["seconds"]), rounds
