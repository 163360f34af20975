"""The bundled loop under a real warning signal, in process (world 1): it saves at the next step
boundary within the deadline, reports ``run.preempted``, exits with the requeue code, and a
restart with ``resume`` continues exactly: the same sample ids, losses and parameters as an
uninterrupted run (multi-process under ``cliffguard train``: tests/cliffguard/test_train_preempt.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

from cliffguard.agent.recovery.preemption import PreemptionConfig
from cliffguard.core.enums import EventType
from cliffguard.trainer.checkpoint import CheckpointConfig
from cliffguard.trainer.record import SAMPLES_NAME
from testing.trainer import make_trainer, small_config

STEPS, SIGNAL_IN = 14, 6


def _config(tmp_path, run: str, **kw):
    cfg = small_config(tmp_path, run=run, steps=STEPS, sample_log=True, debug_digests=True, **kw)
    cfg.checkpoint = CheckpointConfig(dir=str(tmp_path / run / "ckpt"), snapshot_every=2, memory_ring=4,
                                      ckpt_every=0, full_every=0)
    cfg.agent = dataclasses.replace(cfg.agent, preemption=PreemptionConfig(signals=["SIGUSR1"], deadline_s=20.0))
    return cfg


def _samples(cfg) -> list[dict]:
    rows = [json.loads(line) for line in (cfg.run_dir / SAMPLES_NAME).read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def test_a_signal_mid_step_saves_at_the_next_boundary_and_the_restart_resumes_exactly(tmp_path):
    previous = signal.getsignal(signal.SIGUSR1)
    base_cfg = _config(tmp_path, "base")
    base, _, _ = make_trainer(base_cfg)
    assert base.run() == 0

    cfg = _config(tmp_path, "pre")
    tr, sink, _ = make_trainer(cfg)
    step = tr.train_step

    def step_and_maybe_signal():
        if tr.step == SIGNAL_IN:
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives inside the step, like the scheduler's
        return step()

    tr.train_step = step_and_maybe_signal
    assert tr.run() == 75
    preempted = [e for e in sink.events if e.type is EventType.RUN_PREEMPTED]
    assert len(preempted) == 1
    ev = preempted[0]
    assert ev.step == SIGNAL_IN + 1  # the step in flight finished; the boundary after it saved
    assert ev.data["signal"] == "SIGUSR1" and ev.data["verified"]
    assert 0 < ev.data["save_s"] < ev.data["deadline_s"] == 20.0
    assert not [e for e in sink.events if e.type is EventType.RUN_FINISHED]  # it will be requeued
    assert tr.ckpt.disk_steps() == [SIGNAL_IN + 1]
    assert signal.getsignal(signal.SIGUSR1) != previous  # a warned run keeps ignoring a second warning
    signal.signal(signal.SIGUSR1, previous)

    again, sink2, _ = make_trainer(dataclasses.replace(cfg, resume=True))
    assert again.run() == 0
    assert [e.step for e in sink2.events if e.type is EventType.STEP][0] == SIGNAL_IN + 1
    done, want = _samples(cfg), _samples(base_cfg)
    assert [r["step"] for r in done] == list(range(STEPS))  # no step repeated or skipped
    assert [r["ids"] for r in done] == [r["ids"] for r in want]
    assert [r["loss"] for r in done] == [r["loss"] for r in want]
    assert done[-1]["param_digest"] == want[-1]["param_digest"]
    assert signal.getsignal(signal.SIGUSR1) == previous  # an unwarned run puts the handler back
