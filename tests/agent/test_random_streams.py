"""Attaching the agent leaves the training's random streams alone: the same seed gives bit-identical
losses with the agent attached (over the real broker, with a command key, periodic validations and
memory snapshots) and without it, for a plain loop, the Hugging Face Trainer and Lightning, when no
fault is injected.

Each run draws from every global stream a real one does: torch (dropout, a shuffling loader, data),
Python's ``random`` (augmentation) and NumPy; the agent's validations iterate a ``DataLoader``
(which draws its base seed from the global generator), and its Kafka clients connect while the
loop is seeded (kafka-python draws from ``random`` when it picks a bootstrap broker)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.recovery import KitConfig
from testing.controller_service import SECRET

pytestmark = pytest.mark.broker

RECOVERY = KitConfig(val_every=5, val_max_share=0.0, snapshot_every=5)
"""Validations and snapshots on a short run; any cost share (the point is the streams)."""


def _seed(seed: int = 0) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _val_loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(99)
    x = torch.randn(16, 8, generator=g)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8
    )


def _plain(kafka_cfg, tmp_path, *, attached: bool, steps: int = 30) -> list[float]:
    from cliffguard.agent.integrations import guarded_loop

    _seed()
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))

    def batches():
        for _ in range(steps):  # data and augmentation from every global stream
            x = torch.randn(8, 8) * (1 + random.random())
            yield x, x.sum(1, keepdim=True) + float(np.random.randn()) * 0.01

    def loss_fn(batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    @torch.no_grad()
    def validate(n):
        model.eval()
        try:
            losses = [float(loss_fn(b)) for b in _val_loader()]
        finally:
            model.train()
        return sum(losses) / len(losses), len(losses)

    losses: list[float] = []
    if not attached:
        for batch in batches():
            loss = loss_fn(batch)
            losses.append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        return losses
    config = AgentConfig(
        run="streams-plain",
        hist_every=0,
        calibration_s=0.05,
        recovery=RECOVERY,
        spill_dir=str(tmp_path / "spill"),
    )
    loop = guarded_loop(
        model,
        optimizer,
        scheduler,
        run=config.run,
        config=config,
        kafka=kafka_cfg,
        secret=SECRET,
        loss_fn=loss_fn,
        validate_fn=validate,
    )
    for batch in loop.batches(batches()):
        loss = loss_fn(batch)
        losses.append(loss.item())
        loop.backward(loss, tokens=8)
        loop.step()
    loop.close()
    assert loop.kit.cadence.periodic.count == (steps - 1) // 5  # the validations did run
    return losses


def test_a_plain_loop_trains_bit_identically_with_the_agent_attached(kafka_cfg, tmp_path):
    assert _plain(kafka_cfg, tmp_path, attached=True) == _plain(kafka_cfg, tmp_path, attached=False)


def _hf(kafka_cfg, tmp_path, *, attached: bool, steps: int = 20) -> list[float]:
    transformers = pytest.importorskip("transformers")
    from cliffguard.agent.integrations import CliffguardHFCallback

    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=32, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    )  # dropout 0.1 everywhere
    ids = [(torch.arange(16) + i) % 8 for i in range(64)]
    train = [{"input_ids": x, "labels": x.clone()} for x in ids]

    def collate(items):  # a random crop: Python's random stream
        start = random.randint(0, 4)
        x = torch.stack([it["input_ids"] for it in items])[:, start:]
        return {"input_ids": x, "labels": x.clone()}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    callbacks = []
    if attached:
        config = AgentConfig(
            run="streams-hf",
            hist_every=0,
            calibration_s=0.05,
            recovery=RECOVERY,
            spill_dir=str(tmp_path / "spill"),
        )
        callbacks = [cb := CliffguardHFCallback(config, kafka=kafka_cfg, secret=SECRET)]
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=train[:16],
        data_collator=collate,
        callbacks=callbacks,
    )
    if attached:
        cb.train(trainer)  # bound: the periodic validation is a whole evaluate()
        assert (
            cb.kit is not None and cb.kit.cadence.periodic.count == steps // 5
        )  # (a boundary at each step's end)
    else:
        trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_a_hugging_face_trainer_trains_bit_identically_with_the_agent_attached(kafka_cfg, tmp_path):
    with_agent = _hf(kafka_cfg, tmp_path, attached=True)
    assert len(with_agent) == 20 and with_agent == _hf(kafka_cfg, tmp_path, attached=False)


def _lightning(kafka_cfg, tmp_path, *, attached: bool, steps: int = 20) -> list[float]:
    pl = pytest.importorskip("pytorch_lightning")
    from cliffguard.agent.integrations.lightning import CliffguardLightningCallback

    class Noisy(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 1)
            )
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x * (1 + random.random())), y)
            if self.training:  # the callback validates with training_step too, in eval mode
                self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    pl.seed_everything(0, verbose=False)
    module = Noisy()
    x = torch.randn(256, 8)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True
    )
    callbacks = []
    if attached:
        config = AgentConfig(
            run="streams-lightning",
            hist_every=0,
            calibration_s=0.05,
            recovery=RECOVERY,
            spill_dir=str(tmp_path / "spill"),
        )
        callbacks = [
            cb := CliffguardLightningCallback(
                config, kafka=kafka_cfg, secret=SECRET, val_batches=_val_loader()
            )
        ]
    trainer = pl.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)
    if attached:
        assert cb.kit is not None and cb.kit.cadence.periodic.count == (steps - 1) // 5
    return module.losses


def test_a_lightning_module_trains_bit_identically_with_the_agent_attached(kafka_cfg, tmp_path):
    with_agent = _lightning(kafka_cfg, tmp_path, attached=True)
    assert len(with_agent) == 20 and with_agent == _lightning(kafka_cfg, tmp_path, attached=False)
