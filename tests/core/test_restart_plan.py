"""A restart's plan (core/restart_plan.py): written atomically, read by launchers and the next life."""

from __future__ import annotations

import pytest

from cliffguard.core.restart_plan import (
    MIN_NODES_ENV,
    NODE_ENV,
    RestartPlan,
    WorkerLife,
    clear_plan,
    plan_path,
    read_plan,
    write_plan,
)


def test_a_plan_round_trips_and_says_which_nodes_it_leaves_out(tmp_path):
    plan = RestartPlan(mode="exclude", life=1, job="j", exclude_nodes=("b",), ranks=(3,), reason="hung again",
                       incident="i", cmd="c")
    write_plan(tmp_path / "ckpt", plan)
    back = read_plan(tmp_path / "ckpt")
    assert back == plan and back.excludes("b") and not back.excludes("a")
    assert RestartPlan(mode="halt", life=0).excludes("a")
    assert not RestartPlan(mode="in_place", life=0).excludes("a")
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [plan_path(tmp_path).name]  # no temp file left
    assert clear_plan(tmp_path / "ckpt") == plan and read_plan(tmp_path / "ckpt") is None
    assert clear_plan(tmp_path / "ckpt") is None


def test_bad_plans_are_refused_naming_the_field_or_the_file(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        RestartPlan(mode="reboot", life=0)
    with pytest.raises(ValueError, match="exclude_nodes"):
        RestartPlan(mode="exclude", life=0)
    plan_path(tmp_path).write_text("{not json")
    with pytest.raises(ValueError, match="not a restart plan"):
        read_plan(tmp_path)


def test_worker_life_reads_torchruns_environment():
    env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3",
           "GROUP_WORLD_SIZE": "2", NODE_ENV: "node-b", MIN_NODES_ENV: "1"}
    life = WorkerLife.from_env(env)
    assert (life.job, life.life, life.max_restarts, life.node, life.nodes, life.min_nodes) == ("job", 2, 3, "node-b", 2, 1)
    assert life.restarts_left == 1 and life.can_leave_out_a_node
    alone = WorkerLife.from_env({"TORCHELASTIC_RESTART_COUNT": "x"})
    assert (alone.life, alone.max_restarts, alone.nodes, alone.min_nodes) == (0, 0, 1, 1)
    assert not alone.can_leave_out_a_node and alone.node  # the host name
