"""The bundled trainer's own record (trainer/record.py): rank 0's account of the commands it
applied, a timeout it acted on alone and the LR scale before and after each, written beside the
run's config without going through Kafka."""

from __future__ import annotations

import json
import logging

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.guard import GuardConfig
from cliffguard.core.enums import CommandType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig
from cliffguard.trainer.record import RECORD_NAME, TrainerRecord
from testing.trainer import FakeCommands, make_trainer, small_config


def _lines(cfg) -> list[dict]:
    return [json.loads(line) for line in (cfg.run_dir / RECORD_NAME).read_text().splitlines()]


def test_commands_applied_and_the_lr_scale_they_set_are_recorded_with_the_steps(tmp_path):
    cfg = small_config(tmp_path, steps=30)
    tr, _sink, source = make_trainer(cfg)
    pause = make_command(CommandType.PAUSE, "loop")
    scale = make_command(CommandType.SET_LR_SCALE, "loop", {"lr_scale": 0.25})
    resume, stop = make_command(CommandType.RESUME, "loop"), make_command(CommandType.STOP, "loop")
    script = {3: [pause], 6: [scale], 9: [resume], 15: [stop]}

    def feed(src: FakeCommands) -> None:
        src.queue += script.pop(src.polls, [])

    source.on_poll = feed
    assert tr.run() == 0
    lines = _lines(cfg)
    assert [ln["kind"] for ln in lines] == ["start", "command", "command", "command", "command", "end"]
    assert lines[0] == {**lines[0], "step": 0, "steps": 30, "lr_scale": 1.0}
    cmds = {ln["id"]: ln for ln in lines if ln["kind"] == "command"}
    assert [cmds[c.id]["type"] for c in (pause, scale, resume, stop)] == [
        "pause",
        "set_lr_scale",
        "resume",
        "stop",
    ]
    assert all(ln["status"] == "applied" and ln["step_before"] == ln["step_after"] for ln in cmds.values())
    assert (cmds[scale.id]["lr_scale_before"], cmds[scale.id]["lr_scale"]) == (1.0, 0.25)
    assert (cmds[resume.id]["lr_scale_before"], cmds[resume.id]["lr_scale"]) == (0.25, 0.25)
    end = lines[-1]
    assert end["step"] == tr.step < 30 and end["stop_reason"].startswith("stopped by command")
    assert end["lr_scale"] == 0.25


def test_a_local_rollback_after_a_hold_timeout_is_recorded_as_the_trainers_own(tmp_path):
    guard = GuardConfig(
        spike=SpikeConfig(window=16, min_history=8), hold_after=3, hold_timeout_s=0.3, on_timeout="rollback"
    )
    cfg = small_config(tmp_path, guard=guard, faults=["nan@6", "nan@7", "nan@8"])
    tr, _sink, _ = make_trainer(cfg)
    assert tr.run() == 0
    lines = _lines(cfg)
    timeouts = [ln for ln in lines if ln["kind"] == "timeout"]
    assert len(timeouts) == 1 and not any(ln["kind"] == "command" for ln in lines)
    t = timeouts[0]
    assert (t["wait"], t["policy"], t["step_before"]) == ("hold", "rollback", 9)
    assert t["step_after"] <= 6 and (t["lr_scale_before"], t["lr_scale"]) == (1.0, 0.5)
    assert lines[-1]["kind"] == "end" and lines[-1]["step"] == cfg.steps and lines[-1]["lr_scale"] == 0.5


def test_a_record_that_cannot_be_written_says_so_once_and_changes_nothing_else(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = TrainerRecord(blocker / "sub" / RECORD_NAME)  # a directory under a file: never writable
    with caplog.at_level(logging.ERROR, logger="cliffguard.trainer.record"):
        rec.start(0, 10, 1.0)
        rec.command(make_command(CommandType.PAUSE, "r"), Outcome.applied("paused"), 3, 3, 1.0)
        rec.end(10, "", 1.0)
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1
    rec.close()
