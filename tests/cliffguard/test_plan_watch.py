"""The launcher's side of a restart plan (cliffguard/plan_watch.py) on a real child process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from cliffguard import plan_watch
from cliffguard.core.restart_plan import RestartPlan, read_plan, write_plan

FOREVER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def test_a_plan_leaving_this_node_out_stops_its_agent_and_says_why(tmp_path):
    proc = subprocess.Popen(FOREVER)
    since = time.time()
    plan = RestartPlan(mode="exclude", life=1, exclude_nodes=("b",), incident="inc-3", reason="rank 3 hung again")

    def write_later() -> None:  # while the launcher waits
        write_plan(tmp_path, RestartPlan(mode="in_place", life=0))  # torchrun's to act on: not this node's stop
        write_plan(tmp_path, plan)

    threading.Thread(target=write_later).start()
    out = plan_watch.wait(proc, tmp_path, "b", since=since, poll_s=0.02)
    assert out.code == plan_watch.EXCLUDED_EXIT and out.plan == plan and proc.poll() is not None
    assert "left node b out" in out.message("b") and "inc-3" in out.message("b")


def test_an_older_plan_or_another_nodes_leaves_the_agent_running_to_its_end(tmp_path):
    write_plan(tmp_path, RestartPlan(mode="halt", life=0))  # before this launch
    since = time.time() + 1
    write_plan(tmp_path, RestartPlan(mode="exclude", life=0, exclude_nodes=("a",)))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    out = plan_watch.wait(proc, tmp_path, "b", since=since - 1, poll_s=0.02)
    assert out == plan_watch.Outcome(0) and out.message("b") == ""
    assert not plan_watch.stops(RestartPlan(mode="halt", life=0, written_at=since - 5), "b", since)


def test_a_fresh_launch_clears_an_old_plan(tmp_path):
    write_plan(tmp_path, RestartPlan(mode="halt", life=3, incident="old"))
    assert plan_watch.start_fresh(tmp_path).incident == "old" and read_plan(tmp_path) is None
    assert plan_watch.start_fresh(tmp_path) is None


def test_a_plan_leaving_one_of_this_nodes_devices_out_stops_its_agent_to_start_it_smaller(tmp_path):
    proc = subprocess.Popen(FOREVER)
    since = time.time()
    write_plan(tmp_path, RestartPlan(mode="exclude", life=1, exclude_devices=(("a", 1),), incident="inc-4"))
    assert not plan_watch.stops(read_plan(tmp_path), "b", since)  # another node's device: b's agent goes on
    out = plan_watch.wait(proc, tmp_path, "a", since=since, poll_s=0.02)
    assert out.code == plan_watch.EXCLUDED_EXIT and out.devices == (1,) and proc.poll() is not None
    assert "left device 1 of node a out of the restarted group (the node keeps 3)" in out.message("a", keeps=3)


def test_the_launchers_device_list_after_a_device_left():
    from cliffguard.commands.train import slot_env

    assert slot_env((0, 2), {}) == {"CLIFFGUARD_DEVICE_SLOTS": "0,2", "CUDA_VISIBLE_DEVICES": "0,2"}
    assert slot_env((0, 2), {"CUDA_VISIBLE_DEVICES": "4,5,6"})["CUDA_VISIBLE_DEVICES"] == "4,6"
