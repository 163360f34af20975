import pytest
import torch

from cliffguard.trainer.faults import FaultInjector, FaultSpec


def test_parse_every_kind():
    assert FaultSpec.parse("lr_blowup@300x50:20") == FaultSpec(kind="lr_blowup", step=300, factor=50.0, steps=20)
    assert FaultSpec.parse("corrupt@200") == FaultSpec(kind="corrupt", step=200)
    assert FaultSpec.parse("nan@250:1") == FaultSpec(kind="nan", step=250, rank=1)
    slow = FaultSpec.parse("slow_rank@1:0.05")
    assert (slow.rank, slow.seconds, slow.step) == (1, 0.05, 0)
    assert FaultSpec.parse("kill_rank@1:400") == FaultSpec(kind="kill_rank", rank=1, step=400)
    assert FaultSpec.parse("broker_outage@100:10") == FaultSpec(kind="broker_outage", step=100, steps=10)
    assert FaultSpec.parse("data_shift@150:1") == FaultSpec(kind="data_shift", step=150, steps=1 << 62, rank=1)
    assert FaultSpec.parse("dup_burst@150:20") == FaultSpec(kind="dup_burst", step=150, steps=20)
    assert FaultSpec.parse("garble@150:10:0") == FaultSpec(kind="garble", step=150, steps=10, rank=0)


def test_a_data_shift_stays_after_a_rollback_and_the_other_data_faults_do_not_recur():
    f = FaultInjector(["data_shift@5", "garble@3:2", "dup_burst@4:1"])
    kinds = {s: [spec.kind for spec in f.data_faults(s)] for s in range(2, 7)}
    assert kinds == {2: [], 3: ["garble"], 4: ["dup_burst", "garble"], 5: ["data_shift"], 6: ["data_shift"]}
    assert [spec.kind for s in (3, 4, 5) for spec in f.data_faults(s)] == ["data_shift"]  # rolled back to 3


@pytest.mark.parametrize("bad", ["lr_blowup@300", "explode@3", "nan@x", "lr_blowup@10x0:5", "broker_outage@5:0"])
def test_bad_specs_are_rejected_with_a_reason(bad):
    with pytest.raises(ValueError, match="^fault:"):
        FaultSpec.parse(bad)


def test_lr_blowup_window_and_one_shot_after_rollback():
    f = FaultInjector(["lr_blowup@10x50:3"])
    assert [f.lr_factor(s) for s in range(8, 15)] == [1, 1, 50, 50, 50, 1, 1]
    # rolled back to step 9: the glitch does not recur
    assert [f.lr_factor(s) for s in range(9, 14)] == [1] * 5


def test_rollback_from_inside_the_window_spends_it():
    f = FaultInjector(["lr_blowup@10x4:10"])
    assert [f.lr_factor(s) for s in (10, 11, 12)] == [4, 4, 4]
    assert f.lr_factor(5) == 1 and f.lr_factor(11) == 1


def test_corrupt_batch_only_at_its_step_and_deterministic():
    x = torch.full((2, 16), ord("a"), dtype=torch.long)
    f = FaultInjector(["corrupt@7"], seed=3)
    assert torch.equal(f.corrupt_batch(6, x), x)
    bad = f.corrupt_batch(7, x)
    assert bad.shape == x.shape and bad.dtype == x.dtype and not torch.equal(bad, x)
    assert int(bad.min()) >= 0 and int(bad.max()) <= 255
    again = FaultInjector(["corrupt@7"], seed=3).corrupt_batch(7, x)
    assert torch.equal(bad, again)
    assert torch.equal(f.corrupt_batch(8, x), x)
    assert f.fired == [("corrupt", 7)]


def test_nan_and_rank_filter():
    r0 = FaultInjector(["nan@5:1"], rank=0)
    r1 = FaultInjector(["nan@5:1"], rank=1)
    assert [r0.nan_loss(s) for s in range(4, 7)] == [False, False, False]
    assert [r1.nan_loss(s) for s in range(4, 7)] == [False, True, False]


def test_slow_rank_sleeps_on_that_rank_every_step_from_start():
    slept: list[float] = []
    f1 = FaultInjector(["slow_rank@1:0.05:3"], rank=1, sleep=slept.append)
    f0 = FaultInjector(["slow_rank@1:0.05:3"], rank=0, sleep=slept.append)
    assert [f1.delay(s) for s in range(5)] == [0, 0, 0, 0.05, 0.05]
    assert f0.delay(4) == 0
    assert slept == [0.05, 0.05]
    assert f1.delay(2) == 0 and f1.delay(3) == 0.05  # still slow after a rollback


def test_kill_rank_fires_once_at_its_step_on_its_rank():
    killed: list[int] = []
    f = FaultInjector(["kill_rank@1:4"], rank=1, kill=lambda: killed.append(1))
    other = FaultInjector(["kill_rank@1:4"], rank=0, kill=lambda: killed.append(0))
    for s in range(6):
        f.maybe_kill(s)
        other.maybe_kill(s)
    assert killed == [1]


def test_broker_outage_window():
    f = FaultInjector(["broker_outage@100:10"])
    down = [s for s in range(95, 115) if f.broker_down(s)]
    assert down == list(range(100, 110))


def test_a_bitflip_flips_one_bit_of_one_weight_once_on_its_rank_only():
    import torch

    assert FaultSpec.parse("bitflip@250:2") == FaultSpec(kind="bitflip", step=250, rank=2)
    model = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model.parameters()]
    other = FaultInjector(["bitflip@3:1"], rank=0)
    assert not any(other.flip_param(s, model) for s in range(6))
    mine = FaultInjector(["bitflip@3:1"], rank=1)
    assert [mine.flip_param(s, model) for s in range(6)] == [False, False, False, True, False, False]
    after = list(model.parameters())
    assert torch.equal(after[1], before[1]) and int((after[0] != before[0]).sum()) == 1
    changed = (after[0].detach().view(-1).view(torch.int32) ^ before[0].view(-1).view(torch.int32)).tolist()
    assert sorted(changed) == [0] * 5 + [1 << 20]  # one bit, of one element


def test_a_bad_rank_parses_with_or_without_its_step_and_refuses_bad_arguments():
    assert FaultSpec.parse("bad_rank@1") == FaultSpec(kind="bad_rank", rank=1, step=0, steps=1 << 62)
    assert FaultSpec.parse("bad_rank@1:25") == FaultSpec(kind="bad_rank", rank=1, step=25, steps=1 << 62)
    for bad in ("bad_rank@", "bad_rank@1:2:3", "bad_rank@1.5", "bad_rank@x"):
        with pytest.raises(ValueError, match="fault:"):
            FaultSpec.parse(bad)


def test_a_bad_rank_is_wrong_from_its_step_on_at_every_step_and_stays_after_a_rollback():
    from cliffguard.trainer.faults import BAD_RANK_FACTOR

    mine, other = FaultInjector(["bad_rank@1:3"], rank=1), FaultInjector(["bad_rank@1:3"], rank=0)
    steps = [0, 1, 2, 3, 4, 5, 2, 3, 4]  # a rollback to step 2 replays 3 and 4: still bad
    assert [mine.bad_rank_factor(s) for s in steps] == [1.0] * 3 + [BAD_RANK_FACTOR] * 3 + [1.0] + [BAD_RANK_FACTOR] * 2
    assert all(other.bad_rank_factor(s) == 1.0 for s in steps)


def test_a_bad_rank_follows_its_node_across_lives_not_the_rank_number(tmp_path):
    """Life 0: rank 1 runs on node b (local rank 1) and reaches the step first: that device is pinned.
    Life 1 (the ranks renumbered): the rank on node b's local rank 1 is the bad one; node b's other
    rank and node a's are not; a life without node b has no bad rank."""
    spec = ["bad_rank@1:3"]
    life0 = {r: FaultInjector(spec, rank=r, state_dir=tmp_path, node=n, local_rank=lr)
             for r, n, lr in ((0, "b", 0), (1, "b", 1), (2, "a", 0))}
    assert life0[0].bad_rank_factor(3) == 1.0  # rank 0 first: not pinned yet, and not its rank
    assert life0[1].bad_rank_factor(3) > 1.0
    assert life0[0].bad_rank_factor(4) == 1.0 and life0[2].bad_rank_factor(4) == 1.0  # the same node, another GPU
    assert (tmp_path / "bad_rank-r1-s3.node").read_text() == "b 1"
    life1 = {r: FaultInjector(spec, rank=r, state_dir=tmp_path, node=n, local_rank=lr)
             for r, n, lr in ((0, "a", 0), (1, "b", 0), (2, "b", 1))}
    assert [life1[r].bad_rank_factor(3) > 1.0 for r in range(3)] == [False, False, True]
    assert FaultInjector(spec, rank=1, state_dir=tmp_path, node="a", local_rank=1).bad_rank_factor(10) == 1.0


def test_a_repeated_bitflip_flips_again_on_each_pass_over_its_step_on_its_node_only(tmp_path):
    import torch

    assert FaultSpec.parse("bitflip@250:2:2") == FaultSpec(kind="bitflip", step=250, rank=2, times=2)
    for bad in ("bitflip@250", "bitflip@250:2:0", "bitflip@250:2:2:2"):
        with pytest.raises(ValueError, match="fault:"):
            FaultSpec.parse(bad)
    model = torch.nn.Linear(3, 2)
    first = model.weight.detach().clone()
    mine = FaultInjector(["bitflip@3:1:2"], rank=1, state_dir=tmp_path, node="b", local_rank=0)
    steps = [2, 3, 4, 2, 3, 4, 2, 3, 4]  # two rollbacks to step 2: the flip comes back once, not twice
    assert [mine.flip_param(s, model) for s in steps] == [False, True, False, False, True, False, False, False, False]
    assert torch.equal(model.weight.detach(), first)  # flipped twice: the same bit back
    assert (tmp_path / "bitflip-r1-s3.node").read_text() == "b 0"
    # the next life, ranks renumbered: node b's rank 0 is the one that flips, node a's rank 1 is not
    assert FaultInjector(["bitflip@3:1:2"], rank=0, state_dir=tmp_path, node="b", local_rank=0).flip_param(3, model)
    assert not FaultInjector(["bitflip@3:1:2"], rank=1, state_dir=tmp_path, node="a", local_rank=0).flip_param(3, model)
