"""Holes in what the trainer trusts on disk: sidecars, a reused run directory, rollback arguments.

Each scenario drives the bundled ``Trainer`` (a small GPT on CPU, the agent attached with no
broker) and applies commands the way a trainer does: ``agent.dispatch.dispatch`` on its
``TrainerCommands``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.faults.harness import SECRET, Ctx, Measured
from bench.faults.registry import scenario
from cliffguard.core.enums import AckStatus
from cliffguard.core.events import make_command


def _trainer(tmp: Path, run: str, ckpt_dir: Path, **ckpt: Any):
    import torch
    from accelerate import Accelerator

    from cliffguard.agent.hooks import AgentConfig
    from cliffguard.agent.sinks import NullSink
    from cliffguard.trainer.checkpoint import CheckpointConfig
    from cliffguard.trainer.config import TrainConfig
    from cliffguard.trainer.data import DataConfig
    from cliffguard.trainer.loop import Trainer
    from cliffguard.trainer.model import GPTConfig

    torch.set_num_threads(1)
    cfg = TrainConfig(
        run=run, steps=1000, out_dir=str(tmp / run), val_every=0, progress_every=0, val_batches=1,
        model=GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32), data=DataConfig(max_bytes=300_000, seq_len=32),
        checkpoint=CheckpointConfig(dir=str(ckpt_dir), **{"writer": "thread", "snapshot_every": 5, "memory_ring": 2,
                                                          "ckpt_every": 10, "full_every": 0, "keep_full": 2,
                                                          "keep_incremental": 2, **ckpt}),
        agent=AgentConfig(run=run, hist_every=0, heartbeat_s=30, calibration_s=0.02),
    )
    tr = Trainer(cfg, Accelerator(cpu=True), sink=NullSink())
    tr.agent.start()
    return tr


def _train(tr, until: int) -> None:
    while tr.step < until:
        tr.kit.at_boundary()
        tr.train_step()
    tr.ckpt.wait()


def _close(tr) -> None:
    tr.ckpt.close()
    tr.agent.close()


def _command(tr, m: Measured, ctype: str, **args: Any) -> tuple[AckStatus, str]:
    from cliffguard.agent.dispatch import dispatch

    acks: list[tuple[AckStatus, str]] = []
    cmd = make_command(ctype, tr.cfg.run, args)
    dispatch(cmd, tr.kit, tr.agent.modes, lambda c, status, detail="": acks.append((status, detail)))
    m.commands_sent += 1
    m.commands_obeyed += acks[-1][0] is AckStatus.APPLIED
    m.rollbacks += ctype == "rollback" and acks[-1][0] is AckStatus.APPLIED
    return acks[-1]


def _plant(root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    # DCP checkpoints: one shared directory per checkpoint, committed by ``<name>.json`` beside it
    bad = {"full-000000900.json": "{}", "incremental-000000950.json": '{"step": 950, "kind": "incr',
           "full-000000990.json": '{"step": "990", "kind": "full", "sha256": 7}'}
    for name, text in bad.items():
        (root / name).write_text(text)
    return [root / n for n in bad]


@scenario("h07_malformed_sidecar", "7: one `{}` sidecar broke every checkpoint write, resume and rollback",
          timeout_s=120)
def malformed_sidecar(ctx: Ctx) -> Measured:
    m = Measured()
    ckpt = ctx.tmp / "ckpt"
    bad = _plant(ckpt)
    tr = _trainer(ctx.tmp, "sidecar", ckpt)
    try:
        _train(tr, 25)
        m.check(tr.ckpt.disk_steps() == [10, 20], f"disk checkpoints {tr.ckpt.disk_steps()} (want [10, 20])")
        for to_step, source in ((20, "memory"), (10, "disk")):
            status, detail = _command(tr, m, "rollback", to_step=to_step, lr_scale=0.5)
            m.check(status is AckStatus.APPLIED and source in detail, f"rollback to {to_step}: {status} {detail}")
            _train(tr, to_step + 3)
        status, _ = _command(tr, m, "checkpoint_now", kind="full")
        tr.ckpt.wait()
        m.check(status is AckStatus.APPLIED and 13 in tr.ckpt.disk_steps(), f"checkpoint_now: {status}")
        reported = sorted(tr.ckpt.malformed_sidecars)
        m.check(reported == sorted(map(str, bad)), f"reported malformed: {reported}")
        m.check(all(p.exists() for p in bad), "a malformed sidecar was deleted instead of reported")
        m.check(tr.agent.modes.mode.value == "running", f"trainer left in {tr.agent.modes.mode}")
        m.note(f"{len(bad)} malformed sidecars skipped and reported; 2 rollbacks and a save applied")
    finally:
        _close(tr)
    return m


@scenario("h08_reused_run_dir", "8: a reused run directory's old checkpoints pruned the new run's verified ones",
          timeout_s=120)
def reused_run_dir(ctx: Ctx) -> Measured:
    m = Measured()
    ckpt = ctx.tmp / "ckpt"
    old = _trainer(ctx.tmp, "old-run", ckpt, keep_full=4, ckpt_every=20)
    try:
        _train(old, 81)  # checkpoints at 20..80: higher steps than the new run reaches
    finally:
        _close(old)
    old_files = sorted(p.name for p in ckpt.iterdir())
    new = _trainer(ctx.tmp, "new-run", ckpt)
    try:
        _train(new, 35)
        m.check(new.ckpt.disk_steps() == [20, 30], f"new run's checkpoints {new.ckpt.disk_steps()} (want [20, 30])")
        status, detail = _command(new, m, "rollback", to_step=20, lr_scale=0.5)
        m.check(status is AckStatus.APPLIED, f"rollback to the new run's own step 20: {status} {detail}")
    finally:
        _close(new)
    left = {p.name for p in ckpt.iterdir()}
    m.check(set(old_files) <= left, f"{len(set(old_files) - left)} of the old run's files were removed")
    m.note(f"old run's {len(old_files)} files kept; new run kept its own [20, 30]")
    return m


@scenario("h10_bad_rollback_changes_nothing", "10: a rollback with lr_scale 0 was refused after the state was restored",
          timeout_s=120)
def bad_rollback(ctx: Ctx) -> Measured:
    m = Measured()
    tr = _trainer(ctx.tmp, "badargs", ctx.tmp / "ckpt")
    try:
        _train(tr, 25)
        before = (tr.step, tr.param_digest(), tr.kit.available_steps(), tr.agent.lr_scale.value, tr.ckpt.disk_steps())
        for args in ({"to_step": 10, "lr_scale": 0.0}, {"to_step": 10, "lr_scale": -1.0},
                     {"to_step": 10, "lr_scale": float("nan")}, {"to_step": 999, "lr_scale": 0.5}):
            m.forged_sent += 1
            status, detail = _command(tr, m, "rollback", **args)
            after = (tr.step, tr.param_digest(), tr.kit.available_steps(), tr.agent.lr_scale.value, tr.ckpt.disk_steps())
            changed = after != before
            m.forged_obeyed += changed or status is AckStatus.APPLIED
            m.check(not changed, f"{args} ({status}: {detail}) changed the trainer: {before} -> {after}")
        status, detail = _command(tr, m, "rollback", to_step=10, lr_scale=0.5)
        m.check(status is AckStatus.APPLIED and tr.step == 10, f"a valid rollback afterwards: {status} {detail}")
        m.note(f"4 bad rollbacks refused with state, ring and disk unchanged; the valid one applied ({detail})")
    finally:
        _close(tr)
    return m


@scenario("h15_writer_gets_no_secret", "15: the checkpoint writer process inherited the command secret",
          timeout_s=120)
def writer_secret(ctx: Ctx) -> Measured:
    """Checkpoints are written by a DCP thread of the trainer now: no writer process exists to
    inherit a key. Checked from outside: the checkpoints land, and no child process of the trainer
    holds the secret in its environment."""
    from cliffguard.procs import descendants

    m = Measured()
    os.environ["CLIFFGUARD_COMMAND_SECRET"] = SECRET.reveal().decode()
    tr = _trainer(ctx.tmp, "writer", ctx.tmp / "ckpt")
    try:
        _train(tr, 12)
        tr.ckpt.wait()
        m.check(bool(tr.ckpt.disk_steps()), "no checkpoint was written to disk")
        for pid in descendants(os.getpid()):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            m.forged_sent += 1
            leaked = SECRET.reveal() in env
            m.forged_obeyed += leaked
            m.check(not leaked, f"process {pid} holds the command secret in its environment")
        m.note(f"disk checkpoints {tr.ckpt.disk_steps()}; {m.forged_sent} child process(es), "
               f"{m.forged_obeyed} with the secret")
    finally:
        _close(tr)
    return m
