"""Two loop shapes users bring, through the real broker and a real controller, with the demo's
faults: a nanoGPT-style plain loop with its own step counter and a Hugging Face ``Trainer``.
What tests/agent/test_held_runs.py asserts and ``python -m bench.stretch`` measures.

Both train a small GPT on the bundled corpus (the standard library's sources as bytes:
trainer/demo_trainers/common.py ``DemoData``) with the bundled trainer's LR schedule. Faults are
trainer/faults.py's specs: ``stretch(first, n)`` corrupts n batches in a row, ``blowup(at)``
multiplies the LR for a few steps; windows are one-shot, so a rollback replays them clean.

- nanoGPT-style (``nanogpt``): ``iter_num`` drives the LR schedule and the end, batches are drawn
  at random offsets from the global RNG (the kit restores it on a rollback, so the same batches
  come again), the LR is written into the param groups each iteration, and the only cliffguard
  lines are the kit's: ``iter_num = kit.at_boundary().step`` is what keeps the counter right
  after a rollback.
- Hugging Face (``hf``): the demo's HF trainer (trainer/demo_trainers/hf_run.py) with a smaller
  GPT-2 and ``CliffguardHFCallback`` wired to the broker.

``Outcome`` reads what happened off the events the run emitted (a copy of every one, with the
wall clock of its emit).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.drafts import EventDraft
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.publisher import Publisher, PublisherConfig
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.service import ControllerService
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.trainer.demo_trainers.common import (
    LR,
    MIN_LR,
    SEQ_LEN,
    WARMUP,
    DemoArgs,
    DemoData,
    lr_multiplier,
)
from cliffguard.trainer.faults import FaultInjector
from cliffguard.trainer.model import GPT, GPTConfig
from cliffguard.trainer.schedule import WarmupCosine
from testing.controller_service import FAST_GROUP, SECRET, store_engine

MODEL = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=SEQ_LEN)
"""Small enough for a few hundred steps in seconds on a loaded CPU, large enough to learn bytes."""
BATCH = 16
VAL_BATCHES = 4
RECOVERY = RecoveryConfig(stable_window=20, recover_window=20, rollback_budget=3, validate_timeout_s=60,
                          command_timeout_s=30)
"""The controller's recovery for these runs: a checkpoint is a rollback target after 20 healthy steps."""
KIT = KitConfig(ring_size=12, snapshot_every=10, val_every=20, pause_timeout_s=60)
"""120 steps of memory snapshots; a validation every 20 steps for the controller's baseline."""
HOLD_TIMEOUT_S = 30.0
"""The guard's hold timeout here: a hold nobody answers shows as a trainer.timeout event and a
30 s stall (the default, 120 s, would only make a failing run slower)."""


def stretch(first: int, n: int) -> list[str]:
    """``n`` corrupted batches in a row from step ``first``."""
    return [f"corrupt@{s}" for s in range(first, first + n)]


def blowup(at: int, factor: float = 100.0, n: int = 3) -> str:
    """The LR times ``factor`` for ``n`` steps from ``at``."""
    return f"lr_blowup@{at}x{factor:g}:{n}"


@dataclass(kw_only=True, slots=True)
class Scenario:
    trainer: str = "nanogpt"
    """``nanogpt`` or ``hf``."""
    steps: int = 200
    faults: list[str] = field(default_factory=list)
    seed: int = 1234


class Tee:
    """The real publisher, and a copy of every draft (with the wall clock of its emit)."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher, self.events = publisher, []

    def publish(self, draft: EventDraft) -> None:
        self.events.append(draft)
        self.publisher.publish(draft)

    def close(self, timeout: float = 10.0) -> None:
        self.publisher.close(timeout)


@dataclass(slots=True)
class Outcome:
    run: str
    events: list[EventDraft]
    final_val: float
    """The held-out loss after the last step (the same fixed batches for every run)."""
    wall_s: float
    counters: list[tuple[int, int]] = field(default_factory=list)
    """nanogpt: (the loop's own iter_num, the kit's step) of every iteration."""
    rollbacks: list[tuple[int, int]] = field(default_factory=list)
    """nanogpt: (from step, to step) of every boundary that rolled the loop back."""

    def of(self, etype: EventType) -> list[EventDraft]:
        return [e for e in self.events if e.type is etype]

    def steps(self) -> list[EventDraft]:
        return self.of(EventType.STEP)

    def first_pass(self, step: int) -> EventDraft:
        """The first step event of ``step`` (a rollback replays it later)."""
        return next(e for e in self.steps() if e.step == step)

    def max_gap_s(self) -> float:
        """The longest wall-clock gap between two consecutive step events: the longest stall."""
        ts = [e.ts for e in self.steps()]
        return max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=0.0)

    def median_step_s(self) -> float:
        ts = [e.ts for e in self.steps()]
        gaps = sorted(b - a for a, b in zip(ts, ts[1:], strict=False))
        return gaps[len(gaps) // 2] if gaps else 0.0

    def lr_scales(self) -> set[float]:
        return {float(e.data["lr_scale"]) for e in self.steps()}

    def acks(self, *types: CommandType) -> list[EventDraft]:
        return [e for e in self.of(EventType.COMMAND_ACK) if not types or e.data.get("cmd_type") in types]

    def back_to_training_s(self, first_bad: int) -> float | None:
        """From the emit of the stretch's first bad step to the first applied update after the
        last resume or rollback the controller sent: how long the stretch kept the run from
        training. None if the run never trained again."""
        t0 = self.first_pass(first_bad).ts
        answers = [e.ts for e in self.acks(CommandType.RESUME, CommandType.ROLLBACK)
                   if e.ts >= t0 and e.data.get("status") == "applied"]
        since = answers[-1] if answers else t0
        after = [e.ts for e in self.steps() if e.ts > since and not e.data["skipped"]]
        return after[0] - t0 if after else None


@contextlib.contextmanager
def controller(kafka: KafkaConfig, tmp_path: Path, recovery: RecoveryConfig = RECOVERY, group: str = "held"
               ) -> Iterator[tuple[Any, str]]:
    """A controller service on a thread over a fresh SQLite store: yields (engine, url)."""
    with store_engine("sqlite", tmp_path) as (engine, url):
        cfg = ControllerConfig(group_id=group, tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
        svc = ControllerService(cfg, kafka, engine, SECRET, recovery=recovery)
        stop = threading.Event()
        svc.start()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True, name="controller")
        thread.start()
        try:
            yield engine, url
        finally:
            stop.set()
            thread.join(20)


def agent_config(run: str, spill: Path) -> AgentConfig:
    return AgentConfig(run=run, hist_every=0, heartbeat_s=1.0, calibration_s=0.05, spill_dir=str(spill),
                       guard=GuardConfig(hold_timeout_s=HOLD_TIMEOUT_S), recovery=KIT)


def _tee(kafka: KafkaConfig, spill: Path) -> Tee:
    spill.mkdir(parents=True, exist_ok=True)
    return Tee(Publisher(kafka, PublisherConfig(spill_path=str(spill / "publisher.bin"))).start())


def run_scenario(sc: Scenario, run: str, kafka: KafkaConfig, workdir: Path) -> Outcome:
    """One run, on one intra-op thread: the model is small, and on a shared CPU torch's threads
    spin against each other and the controller (150 steps at load 5: 24 s wall with two threads,
    9.7 s with one)."""
    if sc.trainer not in ("nanogpt", "hf"):
        raise ValueError(f"trainer: {sc.trainer!r} is not nanogpt or hf")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return (nanogpt if sc.trainer == "nanogpt" else hf)(sc, run, kafka, workdir)
    finally:
        torch.set_num_threads(threads)


def _data(sc: Scenario, run: str) -> DemoData:
    return DemoData(DemoArgs(run=run, steps=sc.steps, faults=sc.faults, seed=sc.seed))


def nanogpt(sc: Scenario, run: str, kafka: KafkaConfig, workdir: Path) -> Outcome:
    """nanoGPT's train.py loop shape (its own ``iter_num``) with the recovery kit's lines."""
    t0 = time.monotonic()
    data = _data(sc, run)
    faults = FaultInjector(sc.faults, seed=sc.seed)  # by iter_num: a replayed step is clean
    train, val = data.corpus.train, data.val_batches()[:VAL_BATCHES]
    torch.manual_seed(sc.seed)
    model = GPT(MODEL)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = WarmupCosine(LR, MIN_LR, WARMUP, sc.steps)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(train) - SEQ_LEN - 1, (BATCH,))  # the global RNG, as nanoGPT does
        x = torch.stack([train[i:i + SEQ_LEN] for i in ix]).long()
        y = torch.stack([train[i + 1:i + 1 + SEQ_LEN] for i in ix]).long()
        return x, y

    @torch.no_grad()
    def estimate_val(batches: int | None = None) -> tuple[float, int]:
        model.eval()
        try:
            losses = [float(model(x, y)[1]) for x, y in val[:batches or None]]
        finally:
            model.train()
        return sum(losses) / len(losses), len(losses)

    sink = _tee(kafka, workdir / run)
    agent = Agent(None, model, optimizer, agent_config(run, workdir / run), seq_len=SEQ_LEN, sink=sink,
                  kafka=kafka, secret=SECRET)
    kit = RecoveryKit(agent, model, optimizer, None, validate_fn=estimate_val)
    kit.start(config={"integration": "nanogpt-style"})
    out = Outcome(run, sink.events, math.nan, 0.0)
    iter_num = 0
    try:
        while True:
            boundary = kit.at_boundary()  # commands, pause/hold waits, snapshots; falsy: stop
            if not boundary:
                break
            if boundary.rolled_back:
                out.rollbacks.append((iter_num, boundary.step))
            iter_num = boundary.step  # a rollback moves it back: the LR schedule and the end follow
            if iter_num >= sc.steps:
                break
            lr = schedule.lr_at(iter_num) * faults.lr_factor(iter_num)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = faults.corrupt_pair(iter_num, *get_batch())
            _, loss = model(x, y)
            agent.after_forward(loss, tokens=x.numel())
            loss.backward()
            agent.after_backward()
            kit.before_optimizer_step()
            optimizer.step()  # the kit's wrapper: skipped when the guard says so, the LR times lr_scale
            optimizer.zero_grad(set_to_none=True)
            out.counters.append((iter_num, agent.step))
            agent.after_step(lr=lr * kit.lr_scale_applied)
            iter_num += 1
        out.final_val = estimate_val()[0]
    finally:
        agent.close(final_loss=None if math.isnan(out.final_val) else out.final_val)
    out.wall_s = time.monotonic() - t0
    return out


def hf(sc: Scenario, run: str, kafka: KafkaConfig, workdir: Path) -> Outcome:
    """The demo's Hugging Face trainer (a smaller GPT-2), ``CliffguardHFCallback`` on the broker."""
    import transformers

    from cliffguard.agent.integrations.hf import CliffguardHFCallback
    from cliffguard.trainer.demo_trainers.common import StepStream
    from cliffguard.trainer.demo_trainers.hf_run import one_batch

    transformers.logging.set_verbosity_error()
    t0 = time.monotonic()
    data = _data(sc, run)
    torch.manual_seed(sc.seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=MODEL.vocab_size, n_positions=SEQ_LEN, n_embd=MODEL.n_embd, n_layer=MODEL.n_layer,
        n_head=MODEL.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(sc.steps, data.faults))
    sink = _tee(kafka, workdir / run)
    cb = CliffguardHFCallback(agent_config(run, workdir / run), seq_len=SEQ_LEN, sink=sink, kafka=kafka,
                              secret=SECRET)
    val = data.val_batches()[:VAL_BATCHES]
    targs = transformers.TrainingArguments(
        output_dir=str(workdir / run / "hf"), max_steps=sc.steps, per_device_train_batch_size=1,
        per_device_eval_batch_size=1, eval_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=sc.seed, max_grad_norm=0.0,
        remove_unused_columns=False, logging_steps=sc.steps)
    trainer = transformers.Trainer(model=model, args=targs, optimizers=(opt, sched), data_collator=one_batch,
                                   train_dataset=StepStream(data, 2 * sc.steps), eval_dataset=val, callbacks=[cb])
    cb.train(trainer)
    with torch.no_grad():
        model.eval()
        losses = [float(model(**one_batch([b])).loss) for b in val]
    return Outcome(run, sink.events, sum(losses) / len(losses), time.monotonic() - t0)
