"""The Hugging Face Trainer's own logs after the kit acts (agent/integrations/hf_logs.py): with the
Trainer bound, the logged ``learning_rate`` is the LR the update used (the scheduler's times
``lr_scale``), and after a rollback each logged loss averages only the steps of the timeline that
stands, never a rolled-back one. A real ``transformers.Trainer`` with a tiny GPT-2 on CPU."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from cliffguard.core.enums import CommandType, EventType  # noqa: E402
from cliffguard.core.events import make_command  # noqa: E402
from tests.agent.test_integrations_hf import LR, Script, _acks, _callback, _steps, _trainer  # noqa: E402


@pytest.mark.slow
def test_after_a_rollback_the_logs_show_the_applied_lr_and_average_only_standing_steps(tmp_path):
    script = Script()
    cb, sink = _callback(script)
    rollback = make_command(CommandType.ROLLBACK, "hf", {"to_step": 8, "lr_scale": 0.5})
    script.at_step[12] = [rollback]  # applied at the boundary after step 12: steps 8..12 are abandoned
    trainer = _trainer(tmp_path, cb, steps=18, logging_steps=4)
    cb.train(trainer)
    assert _acks(sink)[rollback.id]["status"] == "applied"
    assert "logged loss" in _acks(sink)[rollback.id]["detail"]  # the running sum came back with the weights
    events = _steps(sink)
    assert [e.step for e in events][12:14] == [12, 8]
    standing = {
        e.step: e.data["loss"] for e in events
    }  # the newest loss of each step: the timeline that stands
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logs] == [4, 8, 12, 12, 16]
    before, after = logs[:3], logs[3:]  # the third was logged before the rollback
    assert [h["learning_rate"] for h in before] == [LR] * 3
    assert [h["learning_rate"] for h in after] == [LR * 0.5] * 2  # what the weights moved with
    # after the rollback: 4..7 (kept) with 8..11 as re-run, then 12..15 of the new timeline
    assert after[0]["loss"] == pytest.approx(sum(standing[s] for s in range(4, 12)) / 8, rel=1e-5)
    assert after[1]["loss"] == pytest.approx(sum(standing[s] for s in range(12, 16)) / 4, rel=1e-5)
    assert all(e.data["lr"] == pytest.approx(LR * 0.5) for e in events[13:])


@pytest.mark.slow
def test_unbound_the_trainer_logs_are_left_alone(tmp_path):
    script = Script()
    cb, sink = _callback(script)
    script.at_step[6] = [make_command(CommandType.SET_LR_SCALE, "hf", {"lr_scale": 0.5})]
    trainer = _trainer(tmp_path, cb, steps=12, logging_steps=4)
    trainer.train()  # not cb.train(trainer): the callback does not know the Trainer
    assert [h["learning_rate"] for h in trainer.state.log_history if "loss" in h] == [LR] * 3
    assert [e.data["lr"] for e in _steps(sink)][-1] == pytest.approx(LR * 0.5)  # the events are right anyway
    assert sink.events[-1].type is EventType.RUN_FINISHED
