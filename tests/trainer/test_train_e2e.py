"""End to end through the real parts: ``cliffguard train`` → torchrun (2 processes, gloo) → the real
broker; this test plays the controller (reads the metrics topic, sends signed commands).

One module-scoped run serves every assertion (they share 2 CPU cores with everyone): it trains a
tiny GPT with a NaN at step 12 and a corrupted batch at step 40, is paused, validated, rolled back
from the memory ring and from disk, fed forged/expired/replayed commands, and stopped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from bench.fleet_ranks import EventLog as RunEventLog
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import Event, encode_command, make_command
from cliffguard.core.signing import Secret, sign_command
from cliffguard.trainer.model import GPT, GPTConfig
from cliffguard.trainer.schedule import WarmupCosine

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(240)]

SECRET = "e2e-test-secret-0123456789abcdef"
RUN = f"e2e-{uuid.uuid4().hex[:8]}"
NAN_STEP, CORRUPT_STEP = 12, 40
LR, MIN_LR, WARMUP, STEPS = 5e-3, 5e-3, 5, 5000
MODEL = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)

TOML = f"""
[train]
lr = {LR}
min_lr = {MIN_LR}
warmup_steps = {WARMUP}
val_every = 10
val_batches = 2
val_batch_size = 4
progress_every = 0
debug_digests = true

[data]
max_bytes = 300000
block_bytes = 4096

[checkpoint]
snapshot_every = 5
memory_ring = 3
ckpt_every = 10
full_every = 0
keep_incremental = 8

[agent]
hist_every = 10
detail_steps = 100000
ranks_every = 5
heartbeat_s = 0.3
calibration_s = 0.1
command_tick_s = 0.05

[agent.guard]
hold_after = 3

[spike]
window = 32
min_history = 16
"""


class EventLog(RunEventLog):
    """Every event of this file's run on the metrics topic, read on a thread (bench/fleet_ranks.py)."""

    def __init__(self, kafka) -> None:
        super().__init__(kafka, RUN)

    def of(self, type: EventType, **data) -> list[Event]:
        return [e for e in list(self.events) if e.type is type and all(e.data.get(k) == v for k, v in data.items())]


class Controller:
    def __init__(self, kafka, log: EventLog) -> None:
        from kafka import KafkaProducer

        self.kafka, self.log = kafka, log
        self.producer = KafkaProducer(**kafka.client_kwargs())

    def send_raw(self, cmd) -> None:
        self.producer.send(self.kafka.commands_topic, key=RUN.encode(), value=encode_command(cmd)).get(10)

    def send(self, type: CommandType, args: dict | None = None, *, secret: str = SECRET, ttl_s: float = 60.0):
        cmd = sign_command(make_command(type, RUN, args or {}, ttl_s=ttl_s), Secret(secret))
        self.send_raw(cmd)
        return cmd

    def ack(self, cmd, timeout: float = 60.0) -> Event:
        return self.log.wait(lambda: next(iter(self.log.of(EventType.COMMAND_ACK, cmd=cmd.id)), None),
                             timeout, f"ack of {cmd.type}")


def steps_of(log: EventLog, rank: int) -> list[Event]:
    return [e for e in log.of(EventType.STEP) if e.rank == rank]


@pytest.fixture(scope="module")
def scenario(broker, tmp_path_factory):
    """Runs the whole scripted session once; the tests below check what it recorded."""
    from cliffguard.controller.broker import ensure_topics

    kafka = broker.kafka_config(topic_prefix=f"e2e{uuid.uuid4().hex[:8]}", partitions=1)
    ensure_topics(kafka)
    tmp = tmp_path_factory.mktemp("e2e")
    (tmp / "train.toml").write_text(TOML)
    log = EventLog(kafka)
    ctl = Controller(kafka, log)
    env = {**os.environ, "CLIFFGUARD_COMMAND_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "cliffguard.cli", "train", "--nproc", "2", "--run", RUN, "--config",
           str(tmp / "train.toml"), "--out-dir", str(tmp / "runs"), "--bootstrap", kafka.bootstrap,
           "--topic-prefix", kafka.topic_prefix, "--steps", str(STEPS), "--global-batch", "8", "--grad-accum", "2",
           "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq-len", "32",
           "--fault", f"nan@{NAN_STEP}", "--fault", f"corrupt@{CORRUPT_STEP}"]
    out = open(tmp / "train.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    rec: dict = {"log": log}
    try:
        log.wait(lambda: [e for e in log.of(EventType.STEP) if e.step >= CORRUPT_STEP + 8], 150, "training past the faults")

        # Forged (wrong secret), expired and later a replayed command: rejected, no effect.
        rec["forged"] = ctl.ack(ctl.send(CommandType.PAUSE, secret="not-the-secret-0123456789"))
        rec["expired"] = ctl.ack(ctl.send(CommandType.PAUSE, ttl_s=-5))
        time.sleep(0.5)
        rec["running_after_rejects"] = max(e.step for e in log.of(EventType.STEP))

        pause = ctl.send(CommandType.PAUSE)
        rec["pause"] = ctl.ack(pause)
        time.sleep(1.5)  # paused: no steps, heartbeats go on
        rec["steps_at_pause"] = {r: max(e.step for e in steps_of(log, r)) for r in (0, 1)}
        t_mark = time.time()
        time.sleep(1.5)
        rec["steps_after_wait"] = {r: max(e.step for e in steps_of(log, r)) for r in (0, 1)}
        rec["paused_beats"] = [e for e in log.of(EventType.HEARTBEAT, state="paused") if e.ts >= t_mark]
        ctl.send_raw(pause)  # the very same signed command again
        rec["replayed"] = log.wait(lambda: [e for e in log.of(EventType.COMMAND_ACK, cmd=pause.id)
                                            if e.data["status"] != "applied"], 30, "replay ack")[0]

        val = ctl.send(CommandType.VALIDATE)
        rec["validate_ack"] = ctl.ack(val)
        rec["validation"] = log.of(EventType.VALIDATION, cmd=val.id)

        # Rollback from the memory ring (the newest snapshot), with lr x0.5; training continues.
        mem = sorted({e.step for e in log.of(EventType.CHECKPOINT, kind="memory")})
        to_mem = [s for s in mem if s < rec["pause"].step][-1]
        rb1 = ctl.send(CommandType.ROLLBACK, {"to_step": to_mem, "lr_scale": 0.5})
        rec["rb1"], rec["rb1_step"] = ctl.ack(rb1), to_mem
        log.wait(lambda: [e for e in steps_of(log, 0) if e.step >= to_mem + 3 and e.data["lr_scale"] == 0.5],
                 60, "training after rollback 1")

        # Rollback to an older step that only disk still has, with a skip window, lr x0.25 absolute.
        disk = sorted({e.step for e in log.of(EventType.CHECKPOINT, kind="incremental", verified=True)})
        to_disk = [s for s in disk if s < to_mem - 10][-1]
        first = [e for e in steps_of(log, 0) if e.step == to_disk][0].data["sample_range"][0]
        rb2 = ctl.send(CommandType.ROLLBACK, {"to_step": to_disk, "lr_scale": 0.25, "skip_data": [first, first + 8]})
        rec["rb2"], rec["rb2_step"], rec["rb2_skip"] = ctl.ack(rb2), to_disk, [first, first + 8]
        log.wait(lambda: [e for e in steps_of(log, 0) if e.step >= to_disk + 3 and e.data["lr_scale"] == 0.25],
                 60, "training after rollback 2")

        missing = ctl.send(CommandType.ROLLBACK, {"to_step": 1, "lr_scale": 0.5})
        rec["rb_missing"] = ctl.ack(missing)
        rec["stop"] = ctl.ack(ctl.send(CommandType.STOP))
        rec["rc"] = proc.wait(60)
        log.wait(lambda: log.of(EventType.RUN_FINISHED), 20, "run.finished")
        time.sleep(0.5)
        yield rec
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        if os.environ.get("E2E_SHOW_LOG"):
            print((tmp / "train.log").read_text()[-5000:])
            for e in log.of(EventType.STEP):
                print(e.rank, e.step, round(e.data["loss"], 3), e.data["guard"], e.data["lr_scale"])
        log.close()
        ctl.producer.close()


def _first_pass(log: EventLog, rank: int, step: int) -> Event:
    return [e for e in steps_of(log, rank) if e.step == step][0]


def test_every_metric_type_arrives_with_sane_values(scenario):
    log = scenario["log"]
    started = log.of(EventType.RUN_STARTED)[0].data
    assert started["world_size"] == 2 and started["peak_source"] == "calibration" and started["peak_flops"] > 0
    assert set(started["capabilities"]) == set(CommandType)  # the bundled trainer applies every command
    steps = log.of(EventType.STEP)
    assert {e.rank for e in steps} == {0, 1}  # rank 1's only because [agent] detail_steps asks for them
    assert all("rank_losses" in e.data and "detail" not in e.data for e in steps_of(log, 0))
    assert all(e.data["detail"] is True and "rank_losses" not in e.data for e in steps_of(log, 1))
    ranks = log.of(EventType.RANKS)
    assert ranks and all(e.rank == 0 and e.step % 5 == 0 and e.data["first_rank"] == 0 for e in ranks)
    assert all(len(e.data["step_time_s"]) == 2 and min(e.data["step_time_s"]) > 0 for e in ranks)
    for e in steps:
        d = e.data
        assert 0 < d["mfu"] <= 1, d
        assert d["comm_exposed_s"] >= 0 and d["data_wait_s"] >= 0 and d["compute_s"] >= 0
        assert d["step_time_s"] > 0 and d["tokens"] == 4 * 32 and d["tokens_per_s"] > 0
        assert d["mem_allocated"] > 0 and d["lr"] > 0
        assert ("layer_grad_norms" in d) == (e.step % 10 == 0)  # [agent] layer_norms_every
    # The ranks all-reduce their losses into the same global value.
    r0, r1 = _first_pass(log, 0, 5), _first_pass(log, 1, 5)
    assert r0.data["loss"] == r1.data["loss"] == pytest.approx((r0.data["loss_local"] + r1.data["loss_local"]) / 2)
    summary = r0.data["rank_losses"]
    assert {summary["min"], summary["max"]} == {r0.data["loss_local"], r1.data["loss_local"]}
    assert any(e.data["comm_exposed_s"] > 0 for e in steps)  # gloo all-reduces are measured
    n_params = GPT(MODEL).num_params()
    hists = log.of(EventType.GRAD_HIST)
    assert hists and all(e.rank == 0 for e in hists)
    for e in hists:
        layers = e.data["layers"]
        assert sum(sum(v["counts"]) + v["zeros"] + v["nonfinite"] for v in layers.values()) == n_params
    beats = log.of(EventType.HEARTBEAT)
    assert {e.rank for e in beats} == {0}  # one node: its local rank 0 beats for both
    assert all(e.data["ranks"] == [0, 1] for e in beats) and max(e.data["steps"][1] for e in beats) > 0
    periodic = [e for e in log.of(EventType.VALIDATION) if "cmd" not in e.data]
    assert periodic and all(e.data["val_loss"] > 0 and e.data["batches"] == 2 for e in periodic)
    assert log.of(EventType.CHECKPOINT, kind="incremental", verified=True)
    assert log.of(EventType.RUN_FINISHED) and scenario["rc"] == 0


def test_guard_skips_injected_nan_and_spike_with_no_update(scenario):
    log = scenario["log"]
    for fault_step in (NAN_STEP, CORRUPT_STEP):
        for rank in (0, 1):
            hit = _first_pass(log, rank, fault_step)
            before = _first_pass(log, rank, fault_step - 1)
            assert hit.data["guard"] == "skip" and hit.data["skipped"] is True, (fault_step, hit.data)
            assert hit.data["param_digest"] == before.data["param_digest"]  # 0 updates applied
    # ... and the next step trains normally.
    after = _first_pass(log, 0, CORRUPT_STEP + 1)
    assert after.data["guard"] in ("ok", "warn") and after.data["param_digest"] != _first_pass(log, 0, CORRUPT_STEP).data["param_digest"]


def test_forged_expired_and_replayed_commands_are_rejected_without_effect(scenario):
    assert scenario["forged"].data["status"] == "rejected" and "signature" in scenario["forged"].data["detail"]
    assert scenario["expired"].data["status"] == "expired"
    assert scenario["replayed"].data["status"] == "duplicate"
    # Neither the forged nor the expired pause paused the run.
    assert scenario["running_after_rejects"] > scenario["forged"].step


def test_pause_stops_both_ranks_at_the_same_step_and_heartbeats_go_on(scenario):
    ack = scenario["pause"]
    assert ack.data["status"] == "applied"
    at, after = scenario["steps_at_pause"], scenario["steps_after_wait"]
    assert at[0] == at[1] == ack.step - 1  # both ranks' last step is the one before the boundary
    assert after == at
    assert scenario["paused_beats"] and all(e.data["ranks"] == [0, 1] for e in scenario["paused_beats"])


def test_validate_answers_with_frozen_weights(scenario):
    assert scenario["validate_ack"].data["status"] == "applied"
    (val,) = scenario["validation"]
    assert val.data["batches"] == 2 and 0 < val.data["val_loss"] < 10
    assert val.step == scenario["pause"].step  # validated at the paused boundary


def test_rollback_from_memory_restores_exactly_and_keeps_lr_scale(scenario):
    log, ack, s = scenario["log"], scenario["rb1"], scenario["rb1_step"]
    assert ack.data["status"] == "applied" and "from memory" in ack.data["detail"]
    # Parameters equal the snapshot's: the restored digest is the one after step s-1 (rank 0 acks).
    assert f"param_digest={_first_pass(log, 0, s - 1).data['param_digest']}" in ack.data["detail"]
    sched = WarmupCosine(LR, MIN_LR, WARMUP, STEPS)
    for rank in (0, 1):
        passes = [e for e in steps_of(log, rank) if e.step == s]
        first, replay = passes[0], passes[1]
        # Same data position, same RNG, same weights -> the replayed step computes the same loss.
        assert replay.data["sample_range"] == first.data["sample_range"]
        assert replay.data["rng_digest"] == first.data["rng_digest"]
        assert replay.data["loss_local"] == first.data["loss_local"]
        assert replay.data["lr_scale"] == 0.5 and replay.data["lr"] == pytest.approx(sched.lr_at(s) * 0.5)
        later = [e for e in steps_of(log, rank) if e.step == s + 2 and e.data["lr_scale"] == 0.5][0]
        assert later.data["lr"] == pytest.approx(sched.lr_at(s + 2) * 0.5)


def test_rollback_from_disk_applies_lr_scale_after_restore_and_skips_data(scenario):
    log, ack, s = scenario["log"], scenario["rb2"], scenario["rb2_step"]
    assert ack.data["status"] == "applied" and "from disk" in ack.data["detail"], ack.data
    sched = WarmupCosine(LR, MIN_LR, WARMUP, STEPS)
    for rank in (0, 1):
        replay = [e for e in steps_of(log, rank) if e.step == s and e.data["lr_scale"] == 0.25][0]
        first = _first_pass(log, rank, s)
        assert first.data["lr_scale"] == 1.0  # the checkpoint held scale 1.0; the command's 0.25 won
        assert replay.data["lr"] == pytest.approx(sched.lr_at(s) * 0.25)
        assert replay.data["rng_digest"] == first.data["rng_digest"]
        assert replay.data["sample_range"][0] == scenario["rb2_skip"][1]  # the window was skipped
    missing = scenario["rb_missing"]
    assert missing.data["status"] == "failed" and "not available" in missing.data["detail"]


def test_stop_ends_the_run_cleanly(scenario):
    assert scenario["stop"].data["status"] == "applied"
    assert scenario["rc"] == 0
