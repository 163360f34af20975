"""An eviction end to end under torchrun (issue 22): a bad rank found by the kit's re-runs is left out.

Two ``cliffguard train --nnodes 1:2 --nproc 1`` launches (nodes ``a`` and ``b``, one rendezvous
hosted by the test as in test_train_shrink.py, so either node may leave) train one run at world 2,
monitored by the real stack (embedded broker, SQLite store, ``cliffguard controller``:
cliffguard/demo_stack.py). ``--fault bad_rank@1:FAULT_AT`` makes rank 1's node compute wrong numbers
at every step from FAULT_AT on (trainer/faults.py; the fault follows the node). Everything is judged
from the outside: the store (the incident, its transitions, the suspect-node record, the triage
evidence), the trainers' elastic events and progress mark, and the launchers' exit codes:

- the kit classifies the step ``bad_rank`` naming rank 1 and its node, the update not applied;
- the controller opens a ``bad_rank`` incident and restarts the worker group without that node
  (``running --evict--> restarting``); the incident closes ``restarted``;
- the excluded node's launcher reads the restart plan and exits 3 (cliffguard/plan_watch.py), the
  other goes on at world 1 with the declared batch policy (``proportional``: half the batch);
- the node is in ``suspect_nodes`` with cause ``bad_rank``, and the run finishes, its loss finite
  and below the guard's median loss at the fault.

The second test is a persistent SDC (``bitflip@17:1:2``: the flip comes back when a rollback replays
its step): rolled back once, then its *device* evicted (docs/triage.md): node ``a`` runs 2 processes,
so only rank 1's device leaves and node ``a`` stays with 1 process (world 3 -> 2), where the first
test's one-process node leaves whole. Which node gets rank 1 is the rendezvous's choice in the first
test, so it reads the bad node from the store and the fault's marker; in the second rank 1 is on node
``a`` whichever node the rendezvous puts first (a runs 2 of the 3 ranks: 0-1 or 1-2).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cliffguard.controller.broker import free_port
from cliffguard.demo_elastic import _paths

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(400)]

RUN = "evict"
STEPS = 60
FAULT_AT = 24
"""Late enough that the guard has a noise estimate (its spike detector's min_history) to skip by."""
EXCLUDED_EXIT = 3  # cliffguard/plan_watch.py's EXCLUDED_EXIT


def _launch(tmp_path: Path, node: str, rdzv: str, stack, *, nproc: int = 1, steps: int = STEPS, batch: int = 8,
            fault: str = f"bad_rank@1:{FAULT_AT}", extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "cliffguard", "train", "--nnodes", "1:2", "--nproc", str(nproc), "--run", RUN,
            "--out-dir", str(tmp_path / "runs"), "--bootstrap", stack.bootstrap, "--rdzv-endpoint", rdzv,
            "--rdzv-client", "--node-id", node, "--rdzv-last-call-s", "3", "--rdzv-timeout-s", "300",
            "--max-restarts", "3", "--steps", str(steps), "--global-batch", str(batch), "--warmup-steps", "5",
            "--ckpt-every", "5", "--full-every", "0", "--snapshot-every", "5", "--val-every", "0",
            "--progress-every", "5", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--max-bytes", "200000",
            "--batch-policy", "proportional", "--fault", fault, *extra]
    log = (tmp_path / f"{node}.log").open("ab")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**stack.trainer_env, "PYTHONUNBUFFERED": "1"})


def _tail(tmp_path: Path) -> str:
    return "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                   for p in (tmp_path / "a.log", tmp_path / "b.log", tmp_path / "monitor" / "controller.log")
                   if p.exists())


def _wait_for(cond, timeout_s: float, what: str, tmp_path: Path) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}{_tail(tmp_path)}")
        time.sleep(0.3)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _events(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _store_facts(store) -> dict:
    from cliffguard.controller.store import read
    from cliffguard.controller.store.read.suspects import suspect_nodes

    try:
        with store.session() as s:
            incs = read.incidents(s, RUN, limit=None)[::-1]
            return {"incidents": incs,
                    "transitions": {i["id"]: read.transitions(s, RUN, incident_id=i["id"], limit=None) for i in incs},
                    "suspects": suspect_nodes(s),
                    "triaged": read.evidence(s, RUN, kind="step.triaged", limit=None),
                    "run": read.get_run(s, RUN)}
    except Exception:  # noqa: BLE001 - a busy SQLite moment: ask again next poll
        return {}



def _evicted(stack, rule: str, tmp_path: Path) -> tuple[dict, dict]:
    """Waits for a ``rule`` incident and its suspect record in the store: (the store's facts, the incident)."""
    facts: dict = {}

    def seen() -> bool:
        nonlocal facts
        facts = _store_facts(stack.store)
        return bool(facts.get("suspects")) and any(i["rule"] == rule for i in facts.get("incidents", []))

    _wait_for(seen, 240, f"a {rule} incident and its suspect record", tmp_path)
    return facts, next(i for i in facts["incidents"] if i["rule"] == rule)


def test_a_bad_rank_is_evicted_the_other_node_trains_on_and_the_node_is_recorded_suspect(tmp_path):
    import torch.distributed as dist

    from cliffguard.demo_stack import start_monitoring
    from cliffguard.procs import ProcessSet

    t0 = time.monotonic()
    procs = ProcessSet()
    (tmp_path / "monitor").mkdir()
    stack = start_monitoring(tmp_path / "monitor", procs, broker_port=0, say=lambda _m: None)
    port = free_port()
    rdzv_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                               timeout=timedelta(seconds=600))
    mark_path, events_path = _paths(type("C", (), {"out_dir": str(tmp_path / "runs"), "run": RUN})())
    launches = {n: _launch(tmp_path, n, f"127.0.0.1:{port}", stack) for n in ("a", "b")}
    try:
        facts, inc = _evicted(stack, "bad_rank", tmp_path)
        bad = inc["evidence"]["node"]
        good = "b" if bad == "a" else "a"
        assert bad in ("a", "b") and inc["evidence"]["rank"] == 1 and inc["evidence"]["class"] == "bad_rank"
        assert (tmp_path / "runs" / RUN / "faults" / f"bad_rank-r1-s{FAULT_AT}.node").read_text() == f"{bad} 0"

        assert launches[bad].wait(timeout=120) == EXCLUDED_EXIT, _tail(tmp_path)
        assert f"left node {bad} out of the restarted group" in (tmp_path / f"{bad}.log").read_text()
        _wait_for(lambda: _json(mark_path).get("world") == 1 and _json(mark_path).get("step", 0) > FAULT_AT + 5,
                  180, "training at world 1 past the fault", tmp_path)
        assert launches[good].wait(timeout=180) == 0, _tail(tmp_path)
        _wait_for(lambda: (f := _store_facts(stack.store)) and not any(i["closed_at"] is None for i in f["incidents"])
                  and f["run"] and f["run"]["last_step"] >= STEPS - 1, 60, "the store to read the run's end", tmp_path)
        facts = _store_facts(stack.store)
    finally:
        for p in launches.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
        procs.stop_all()
        stack.close()
        del rdzv_store
    took = time.monotonic() - t0

    (inc,) = [i for i in facts["incidents"] if i["rule"] == "bad_rank"]
    assert inc["outcome"] == "restarted", inc
    moves = [(t["from_state"], t["reason"].split(":")[0], t["to_state"]) for t in facts["transitions"][inc["id"]]]
    assert moves[0] == ("running", "evict", "restarting") and moves[-1] == ("rejoining", "training_again", "running"), moves
    (suspect,) = facts["suspects"]
    assert (suspect["node"], suspect["cause"], suspect["run_id"], suspect["incident_id"]) == (bad, "bad_rank", RUN,
                                                                                              inc["id"])
    verdicts = [t["data"] for t in facts["triaged"] if t["data"]["class"] == "bad_rank"]
    assert verdicts and all(v["rank"] == 1 and v["node"] == bad and not v["update_applied"] for v in verdicts)
    assert min(t["step"] for t in facts["triaged"] if t["data"]["class"] == "bad_rank") == FAULT_AT  # at once

    (down,) = _events(events_path)
    assert (down["from_world"], down["to_world"], down["global_batch"]) == (2, 1, 4)
    mark = _json(mark_path)
    assert mark["step"] == STEPS and mark["world"] == 1
    # no bad update applied: the world-1 run learned on from where the fault found it (the guard's
    # median loss then), its last steps' mean loss finite and below it
    median_at_fault = verdicts[0]["evidence"]["median"]
    assert math.isfinite(mark["loss_mean"]) and mark["loss_mean"] < median_at_fault, (mark, median_at_fault)
    print(f"evicted node {bad} at step {inc['spike_step']}, final loss {mark['loss']:.3f}, {took:.1f} s")


SDC_STEPS = 45
FLIP_AT = 17
CHECK_EVERY = 5


def test_a_persistent_sdc_is_rolled_back_once_then_its_device_alone_is_evicted(tmp_path):
    """``bitflip@17:1:2``: rank 1's device flips a bit of its weights before step 17, and again when the
    rollback replays step 17 (a persistent SDC). Three ranks (node ``a`` 2 processes, node ``b`` 1:
    two replicas cannot say which one diverged), the SDC watch every 5 steps. The first check that
    names rank 1 rolls back (``running --sdc--> rolling_back``); the second, after the rollback, evicts
    its device (``--sdc_again_device--> restarting``): node ``a``'s launcher starts torchrun again with
    1 process, the bad slot left out, the device is recorded suspect with cause ``sdc`` (node + slot),
    and the group trains on at world 2 to the end, both launchers exiting 0."""
    import torch.distributed as dist

    from cliffguard.demo_stack import start_monitoring
    from cliffguard.procs import ProcessSet

    t0 = time.monotonic()
    procs = ProcessSet()
    (tmp_path / "monitor").mkdir()
    (tmp_path / "cfg.toml").write_text(f"[agent]\nparam_check = \"on\"\nparam_check_every = {CHECK_EVERY}\n")
    stack = start_monitoring(tmp_path / "monitor", procs, broker_port=0, say=lambda _m: None, controller_env={
        "CLIFFGUARD_RECOVERY__STABLE_WINDOW": "5", "CLIFFGUARD_RECOVERY__RECOVER_WINDOW": "20"})
    port = free_port()
    rdzv_store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                               timeout=timedelta(seconds=600))
    mark_path, events_path = _paths(type("C", (), {"out_dir": str(tmp_path / "runs"), "run": RUN})())
    # the restarted round waits for node a's new torchrun agent (seconds to start) within its last call
    launches = {n: _launch(tmp_path, n, f"127.0.0.1:{port}", stack, nproc=k, steps=SDC_STEPS, batch=12,
                           fault=f"bitflip@{FLIP_AT}:1:2",
                           extra=("--config", str(tmp_path / "cfg.toml"), "--rdzv-last-call-s", "15"))
                for n, k in (("a", 2), ("b", 1))}
    try:
        facts, inc = _evicted(stack, "sdc", tmp_path)
        node, slot = (tmp_path / "runs" / RUN / "faults" / f"bitflip-r1-s{FLIP_AT}.node").read_text().split()
        assert node == "a" == facts["suspects"][0]["node"] and slot in ("0", "1"), (node, slot)
        for n in ("a", "b"):  # node a stays (1 process), node b goes on: both finish
            assert launches[n].wait(timeout=240) == 0, _tail(tmp_path)
        a_log = (tmp_path / "a.log").read_text()
        assert f"left device {slot} of node a out of the restarted group (the node keeps 1)" in a_log, _tail(tmp_path)
        assert f"starting torchrun again with 1 process(es) on device slot(s) {1 - int(slot)}" in a_log
        _wait_for(lambda: (f := _store_facts(stack.store)) and not any(i["closed_at"] is None for i in f["incidents"])
                  and f["run"] and f["run"]["last_step"] >= SDC_STEPS - 1, 60, "the store to read the run's end",
                  tmp_path)
        facts = _store_facts(stack.store)
    finally:
        for p in launches.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
        procs.stop_all()
        stack.close()
        del rdzv_store
    took = time.monotonic() - t0

    (inc,) = [i for i in facts["incidents"] if i["rule"] == "sdc"]  # one incident: rolled back, then evicted
    assert inc["outcome"] == "restarted", inc
    moves = [(t["from_state"], t["reason"].split(":")[0], t["to_state"]) for t in facts["transitions"][inc["id"]]]
    assert moves[0] == ("running", "sdc", "rolling_back"), moves
    assert ("recovering", "sdc_again_device", "restarting") in moves and moves[-1][1:] == ("training_again",
                                                                                          "running"), moves
    assert inc["evidence"]["rank"] == 1
    evict = next(t for t in facts["transitions"][inc["id"]] if t["reason"].split(":")[0] == "sdc_again_device")
    assert f"device {slot} of node a left out (the node keeps 1)" in evict["reason"], evict
    (suspect,) = facts["suspects"]
    assert (suspect["node"], suspect["device"], suspect["cause"], suspect["incident_id"]) == ("a", int(slot), "sdc",
                                                                                              inc["id"])
    assert "persistent silent data corruption" in suspect["reason"]
    (down,) = _events(events_path)
    assert (down["from_world"], down["to_world"]) == (3, 2), down  # one device left, not node a's two
    assert down["global_batch"] < down["from_global_batch"] and down["policy"] == "proportional", down
    mark = _json(mark_path)
    assert mark["step"] == SDC_STEPS and mark["world"] == 2 and math.isfinite(mark["loss_mean"]), mark
    print(f"evicted device {slot} of node a after the second divergence, {took:.1f} s")
