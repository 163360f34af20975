"""The Lightning callback on a real tiny LightningModule (CPU, one process), with the in-memory sink:
guard enforced, lr_scale applied, rollback from the ring, pause held through validation, run.failed."""

from __future__ import annotations

import logging
import math

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.integrations.lightning import CliffguardLightningCallback
from cliffguard.agent.recovery import KitConfig
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.events import make_command
from cliffguard.core.spike import SpikeConfig

pytestmark = pytest.mark.timeout(120)
logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)


class Tiny(pl.LightningModule):
    def __init__(self, nan_at: int | None = None, raise_at: int | None = None, lr: float = 0.05) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.nan_at, self.raise_at, self.lr = nan_at, raise_at, lr
        self.calls = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        if self.calls == self.raise_at:
            raise RuntimeError("boom in training_step")
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        self.calls += 1
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                                                   "interval": "step"}}


class Commands:
    """A command source the test fills: ``at[step]`` is a list of polls' deliveries, handed out one
    per poll while the agent is at that step. A command polled during step s is applied at the
    boundary after it (the agent's flag rides the step's all-reduce), so before step s + 1."""

    def __init__(self, agent_step) -> None:
        self.at: dict[int, list[list]] = {}
        self.step = agent_step

    def poll(self):
        polls = self.at.get(self.step())
        return polls.pop(0) if polls else []

    def close(self) -> None:
        pass


def _data(n: int = 64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) * 0.5)


def _fit(module, *, steps: int, commands: dict[int, list[list]] | None = None, val: bool = False, **cb_kwargs):
    sink = InMemorySink()
    holder: dict = {}
    source = Commands(lambda: holder["cb"].agent.step)
    source.at = dict(commands or {})
    cfg = AgentConfig(run="lit", heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                      guard=GuardConfig(spike=SpikeConfig(window=16, min_history=4)),
                      recovery=KitConfig(snapshot_every=2, ring_size=8))
    cb = CliffguardLightningCallback(cfg, sink=sink, command_source=source, **cb_kwargs)
    holder["cb"] = cb
    trainer = pl.Trainer(max_steps=steps, callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         accelerator="cpu", devices=1)
    loaders = [DataLoader(_data(), batch_size=8, shuffle=False)]
    if val:
        loaders.append(DataLoader(_data(16), batch_size=8))
    try:
        trainer.fit(module, *loaders)
    except RuntimeError:
        pass  # the test looks at what the callback sent
    return cb, sink, trainer


def _of(sink, t):
    return [e for e in sink.events if e.type is t]


def test_run_started_declares_every_command_the_kit_applies_and_steps_are_reported():
    cb, sink, _ = _fit(Tiny(), steps=5)
    started = _of(sink, EventType.RUN_STARTED)[0].data
    assert set(started["capabilities"]) == {str(c) for c in CommandType}
    assert started["global_batch"] == 8  # the train loader's batch size x accumulation x world
    steps = _of(sink, EventType.STEP)
    assert [e.step for e in steps] == [0, 1, 2, 3, 4]
    assert all(e.data["tokens"] == 32 and math.isfinite(e.data["loss"]) for e in steps)
    assert _of(sink, EventType.RUN_FINISHED) and sink.closed
    assert any(e.data["kind"] == "memory" for e in _of(sink, EventType.CHECKPOINT))


def test_a_nonfinite_loss_skips_the_update_on_the_optimizer_step():
    module = Tiny(nan_at=6)
    seen: dict[int, torch.Tensor] = {}

    class Snap(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen[batch_idx] = torch.cat([p.detach().flatten().clone() for p in pl_module.parameters()])

    sink = InMemorySink()
    cfg = AgentConfig(run="lit", heartbeat_s=60, calibration_s=0.05,
                      guard=GuardConfig(spike=SpikeConfig(window=16, min_history=4)))
    trainer = pl.Trainer(max_steps=8, callbacks=[CliffguardLightningCallback(cfg, sink=sink), Snap()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    trainer.fit(module, DataLoader(_data(), batch_size=8))
    step6 = next(e for e in _of(sink, EventType.STEP) if e.step == 6)
    assert step6.data["skipped"] is True
    assert torch.equal(seen[6], seen[7])  # the bad update never reached the weights
    assert not torch.equal(seen[5], seen[6])  # the good ones did
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_set_lr_scale_and_rollback_are_applied_and_acked():
    base = Tiny()
    scale = make_command(CommandType.SET_LR_SCALE, "lit", {"lr_scale": 0.5})
    cb, sink, _ = _fit(base, steps=10, commands={3: [[scale]]})
    steps = {e.step: e.data for e in _of(sink, EventType.STEP)}
    assert steps[3]["lr"] == pytest.approx(0.05) and steps[4]["lr"] == pytest.approx(0.025)
    assert steps[4]["lr_scale"] == 0.5 and cb.kit.lr_scale_applied == 0.5
    acks = _of(sink, EventType.COMMAND_ACK)
    assert [(a.data["cmd"], a.data["status"]) for a in acks] == [(scale.id, "applied")]

    rollback = make_command(CommandType.ROLLBACK, "lit", {"to_step": 4, "lr_scale": 0.25})
    cb, sink, _ = _fit(Tiny(), steps=12, commands={8: [[rollback]]})
    ack = _of(sink, EventType.COMMAND_ACK)[0].data
    assert ack["status"] == "applied" and "restored step 4" in ack["detail"]
    steps = [e.step for e in _of(sink, EventType.STEP)]
    assert steps[:9] == list(range(9)) and steps[9] == 4  # training goes on from the restored step
    assert _of(sink, EventType.STEP)[-1].data["lr_scale"] == 0.25


def test_pause_is_held_through_validation_on_the_val_loader_until_resume():
    pause = make_command(CommandType.PAUSE, "lit")
    validate = make_command(CommandType.VALIDATE, "lit")
    resume = make_command(CommandType.RESUME, "lit")
    # polled during step 3: paused before step 4; then, while paused, validate, three quiet polls, resume
    cb, sink, _ = _fit(Tiny(), steps=8, commands={3: [[pause]], 4: [[validate], [], [], [], [resume]]}, val=True)
    acks = [(a.data["cmd_type"], a.data["status"]) for a in _of(sink, EventType.COMMAND_ACK)]
    assert acks == [("pause", "applied"), ("validate", "applied"), ("resume", "applied")]
    val = _of(sink, EventType.VALIDATION)[0]
    assert val.data["cmd"] == validate.id and val.data["batches"] == 2 and math.isfinite(val.data["val_loss"])
    assert cb.kit.validate_fn is not None  # the val loader's 2 batches, not the 4 held-back training batches
    order = [(e.type, e.step) for e in sink.events if e.type in (EventType.STEP, EventType.VALIDATION)]
    assert order.index((EventType.VALIDATION, 4)) == order.index((EventType.STEP, 3)) + 1  # nothing trained meanwhile
    assert [e.step for e in _of(sink, EventType.STEP)] == list(range(8))


def test_without_a_val_loader_validation_uses_held_back_training_batches():
    validate = make_command(CommandType.VALIDATE, "lit")
    cb, sink, _ = _fit(Tiny(), steps=6, commands={3: [[validate]]})
    assert _of(sink, EventType.COMMAND_ACK)[0].data["status"] == "applied"
    assert _of(sink, EventType.VALIDATION)[0].data["batches"] == 4 and cb.kit.validate_fn is None  # val_keep


def test_an_exception_in_training_sends_run_failed():
    cb, sink, _ = _fit(Tiny(raise_at=3), steps=8)
    failed = _of(sink, EventType.RUN_FAILED)
    assert len(failed) == 1 and "boom" in failed[0].data["error"]
    assert not _of(sink, EventType.RUN_FINISHED)


def test_stop_ends_fitting():
    stop = make_command(CommandType.STOP, "lit", {"reason": "enough"})
    cb, sink, trainer = _fit(Tiny(), steps=50, commands={3: [[stop]]})
    # stopped at the boundary after step 3: Lightning finishes the batch it started, no more
    assert len(_of(sink, EventType.STEP)) <= 5 and trainer.global_step <= 5
    assert _of(sink, EventType.COMMAND_ACK)[0].data["status"] == "applied" and _of(sink, EventType.RUN_FINISHED)


def test_the_kits_periodic_validation_runs_on_the_val_loader_without_a_command_id():
    cb, sink, _ = _fit(Tiny(), steps=9, val=True, kit_config=KitConfig(val_every=4, val_max_share=0))
    vals = _of(sink, EventType.VALIDATION)
    assert [v.step for v in vals] == [4, 8] and all("cmd" not in v.data for v in vals)
    assert all(v.data["batches"] == 2 for v in vals)  # on the val loader
    with pytest.raises(ValueError, match="run: name the run"):
        CliffguardLightningCallback()


class TinyLM(pl.LightningModule):
    """A next-token model on batches of token ids (a mapping with ``input_ids``, as HF-style loaders give)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        logits = self.out(self.emb(ids[:, :-1]))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 16), ids[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_the_data_watch_sees_every_training_batch_of_token_ids():
    """The callback hands each batch's ``input_ids`` to the agent's data watch: the data.stats windows
    count every batch and every token the run trained on."""
    ids = [{"input_ids": (torch.arange(12) * (i % 5 + 1)) % 16} for i in range(64)]
    sink = InMemorySink()
    cfg = AgentConfig(run="lit-lm", heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01)
    trainer = pl.Trainer(max_steps=20, callbacks=[CliffguardLightningCallback(cfg, sink=sink)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1)
    trainer.fit(TinyLM(), DataLoader(ids, batch_size=4))
    stats = [e.data for e in _of(sink, EventType.DATA_STATS)]
    assert sum(s["batches"] for s in stats) == 20 and sum(s["tokens"] for s in stats) == 20 * 4 * 12
    assert sorted(step for s in stats for step in s["steps"]) == list(range(20))


def test_float_batches_turn_the_data_watch_off_without_a_warning(caplog):
    with caplog.at_level(logging.INFO, logger="cliffguard.agent.integrations.lightning"):
        _, sink, _ = _fit(Tiny(), steps=4)
    assert not _of(sink, EventType.DATA_STATS)
    said = [r for r in caplog.records if "data watch is off" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
