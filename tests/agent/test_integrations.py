"""The Accelerate tracker and the duck-typed Hugging Face callback, with the in-memory sink."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from accelerate import Accelerator

from agent.hooks import Agent, AgentConfig
from agent.integrations import AgentTracker, CliffguardCallback
from agent.publisher import InMemorySink
from core.enums import CommandType, EventType
from core.events import make_command
from trainer.model import GPT, GPTConfig


class FakeCommands:
    def __init__(self) -> None:
        self.queue: list = []

    def poll(self):
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        pass


def _model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))


def test_accelerate_tracker_turns_logged_scalars_into_events():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink = InMemorySink()
    agent = Agent(None, model, opt, AgentConfig(run="trk", heartbeat_s=60, calibration_s=0.05), seq_len=8, sink=sink)
    acc = Accelerator(cpu=True, log_with=[AgentTracker(agent)])
    acc.init_trackers("proj", config={"lr": 0.1})
    for step in range(3):
        acc.log({"loss": 2.0 - 0.1 * step, "lr": 0.1, "tokens": 64, "note": "text is ignored"}, step=step)
    acc.log({"val_acc": 0.5}, step=3)  # no loss: not a step
    acc.end_training()
    types = [e.type for e in sink.events]
    assert types[0] is EventType.RUN_STARTED and sink.events[0].data["config"] == {"lr": 0.1}
    steps = [e for e in sink.events if e.type is EventType.STEP]
    assert [e.step for e in steps] == [0, 1, 2]
    assert [e.data["loss"] for e in steps] == [2.0, 1.9, 1.8]
    assert all(e.data["lr"] == 0.1 and e.data["tokens"] == 64 and e.data["mfu"] > 0 for e in steps)
    assert EventType.RUN_FINISHED in types and sink.closed


def _hf_objects(step: int = 0):
    args = SimpleNamespace(world_size=1, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.1)
    state = SimpleNamespace(global_step=step, max_steps=10)
    control = SimpleNamespace(should_training_stop=False, should_evaluate=False, should_save=False)
    return args, state, control


def test_hf_callback_reports_steps_and_maps_commands_onto_trainer_controls():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sink, source = InMemorySink(), FakeCommands()
    cb = CliffguardCallback(AgentConfig(run="hf", heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01),
                            seq_len=8, sink=sink, command_source=source)
    args, state, control = _hf_objects()
    cb.on_train_begin(args, state, control, model=model, optimizer=opt)
    assert sink.events[0].type is EventType.RUN_STARTED and sink.events[0].data["global_batch"] == 8

    state.global_step = 1
    cb.on_log(args, state, control, logs={"loss": 2.5, "learning_rate": 0.1, "grad_norm": 1.5})
    step_ev = [e for e in sink.events if e.type is EventType.STEP][-1]
    assert step_ev.step == 1 and step_ev.data["loss"] == 2.5 and step_ev.data["grad_norm"] == 1.5

    scale = make_command(CommandType.SET_LR_SCALE, "hf", {"lr_scale": 0.5})
    validate = make_command(CommandType.VALIDATE, "hf")
    save = make_command(CommandType.CHECKPOINT_NOW, "hf")
    rollback = make_command(CommandType.ROLLBACK, "hf", {"to_step": 0, "lr_scale": 0.5})
    source.queue += [scale, validate, save, rollback]
    cb.on_step_end(args, state, control)
    assert control.should_evaluate and control.should_save and not control.should_training_stop
    cb.on_step_begin(args, state, control)
    assert opt.param_groups[0]["lr"] == 0.05  # the scheduler's LR, scaled
    cb.on_evaluate(args, state, control, metrics={"eval_loss": 2.25}, eval_dataloader=[1, 2, 3])
    (val,) = [e for e in sink.events if e.type is EventType.VALIDATION]
    assert val.data == {"val_loss": 2.25, "batches": 3, "cmd": validate.id}
    acks = {e.data["cmd"]: e.data["status"] for e in sink.events if e.type is EventType.COMMAND_ACK}
    assert acks == {scale.id: "applied", validate.id: "applied", save.id: "applied", rollback.id: "failed"}

    # pause holds inside the callback until resume; then stop sets the Trainer's flag.
    pause, resume, stop = (make_command(t, "hf") for t in (CommandType.PAUSE, CommandType.RESUME, CommandType.STOP))
    source.queue += [pause]
    polls = {"n": 0}
    original = source.poll

    def poll_then_resume():
        polls["n"] += 1
        if polls["n"] == 3:
            source.queue += [resume, stop]
        return original()

    source.poll = poll_then_resume
    cb.on_step_end(args, state, control)
    assert polls["n"] >= 3 and control.should_training_stop
    assert [e.data["status"] for e in sink.events if e.type is EventType.COMMAND_ACK][-3:] == ["applied"] * 3
    cb.on_train_end(args, state, control)
    assert sink.events[-1].type is EventType.RUN_FINISHED
