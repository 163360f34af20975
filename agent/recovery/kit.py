"""The recovery kit: the whole command loop for any training loop, one implementation for all.

A plain loop::

    agent = Agent(None, model, optimizer, AgentConfig(run="my-run"), kafka=KafkaConfig.from_env())
    kit = RecoveryKit(agent, model, optimizer, scheduler, loss_fn=lambda b: model(*b)[1])
    kit.start()                                        # run.started with the kit's capabilities
    while agent.step < total and (b := kit.at_boundary()):  # commands, holds, timeouts, snapshots
        step = b.step                                  # the step to run (back after a rollback)
        x, y = next(batches); kit.remember((x, y))     # a held-back slice to validate on
        loss = model(x, y)[1]; agent.after_forward(loss); loss.backward(); agent.after_backward()
        if kit.before_optimizer_step(): optimizer.step()  # the guard: False = skipped on every rank
        optimizer.zero_grad(); scheduler.step(); agent.after_step()
    agent.close()

What it does for the loop (``CommandTarget``, agent/command_target.py, applied through the
dispatch table of agent/dispatch.py):

- **guard enforced**: ``before_optimizer_step`` runs the agent's one all-reduce and the guard; a
  skip is the same on every rank. With ``wrap_optimizer`` (the default) the optimizer's own
  ``step`` also obeys it, so a loop that calls ``optimizer.step()`` unconditionally (the Hugging
  Face Trainer) still skips the bad update, and the LR scale is applied inside that call (the
  scheduler's LR times ``lr_scale`` for the step, then put back, so no scheduler compounds it);
- **boundary** (``at_boundary``): commands dispatched in order, the wait while ``paused``/``held``
  with heartbeats going on, the hold and controller-silence timeouts (agent/recovery/timeouts.py,
  each reported to the controller), then a memory snapshot when due; it returns a ``Boundary``
  (agent/recovery/boundary.py): truthy while the run goes on, and ``.step``, the step the loop
  runs next, which a loop with its own counter must take (a rollback moves it back);
- **rollback** from the ``StateStore`` (default: the kit's ``MemoryRing``), all ranks or none,
  then the command's ``lr_scale``, then ``skip_data`` (the loop's ``skip_data`` callable; a
  loader that cannot rewind has skipped the window by going on, PaLM-style, and the ack says so);
- **validate** with the loop's ``validate_fn(batches) -> float`` or, without one, ``loss_fn`` on
  the last ``val_keep`` training batches it was shown (``remember``); never a crash: no data is
  a ``failed`` ack. Every validation runs with the global RNGs put back afterwards, and the
  periodic ones only while they cost at most ``val_max_share`` of training (agent/recovery/cadence.py);
- **triage** (with a ``rerun_fn``, agent/recovery/triage_run.py): a step the guard skips is
  re-run (same shards, shards rotated, a control batch) and classified (core/triage.py): a data
  batch stays skipped and joins the bad-batch list, a transient fault is retried and applied,
  the rest keep the guard's decision; rank 0 reports ``step.triaged``;
- **preemption** (``[agent.preemption]``, agent/recovery/preemption.py): ``start`` installs the
  warning-signal handlers (they only note the signal); the boundary after any rank was warned
  saves the whole state (the store's ``save_now``: memory, then disk, waited for until the
  deadline), rank 0 emits ``run.preempted``, and the boundary is falsy with ``stop_reason``
  ``"preempted"``: the loop exits with ``preemption.config.exit_code`` to be requeued.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.dispatch import dispatch
from cliffguard.agent.hang.part import RestartRequested
from cliffguard.agent.hang.restart import preflight, refuse_if_halted, restart_outcome
from cliffguard.agent.hooks import Agent
from cliffguard.agent.modes import HELD, STOPPING, WAITING
from cliffguard.agent.recovery import preempt_boundary, preempt_leave, validation
from cliffguard.agent.recovery.boundary import Boundary
from cliffguard.agent.recovery.cadence import ValidationCadence
from cliffguard.agent.recovery.config import KitConfig
from cliffguard.agent.recovery.preemption import PreemptionWatch
from cliffguard.agent.recovery.restored import describe_restored
from cliffguard.agent.recovery.ring import MemoryRing, cpu_copy
from cliffguard.agent.recovery.state import DataPosition, LoopState, Stateful
from cliffguard.agent.recovery.store import RingStore, StateStore
from cliffguard.agent.recovery.timeouts import Timeout, apply_timeout, timed_out
from cliffguard.agent.recovery.triage_run import RerunFn, SampleIdsFn, StepTriage
from cliffguard.core.enums import CheckpointKind, CommandType, EventType, GuardDecision
from cliffguard.core.events import Command
from cliffguard.core.triage import TriageClass, TriageConfig

log = logging.getLogger(__name__)

ValidateFn = Callable[[int | None], "float | tuple[float, int]"]
"""``validate_fn(batches)``: forward-only loss on frozen weights (optionally with the batch count)."""


class RollbackUnavailable(RuntimeError):
    """The requested step is not available on every rank; ``available``: the steps every rank has."""

    def __init__(self, message: str, available: list[int] | None = None) -> None:
        super().__init__(message)
        self.available = available


class Snapshotter(Protocol):
    """Captures and loads the loop's whole state (``LoopState`` by default)."""

    def capture(self, step: int) -> dict[str, Any]: ...

    def load(self, state: dict[str, Any]) -> int: ...


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


class RecoveryKit:
    """See the module docstring. One per process; every rank builds one."""

    def __init__(self, agent: Agent, model: torch.nn.Module | None = None, optimizer: Any = None,
                 scheduler: Any = None, *, config: KitConfig | None = None, validate_fn: ValidateFn | None = None,
                 loss_fn: Callable[[Any], torch.Tensor] | None = None, data_position: DataPosition | None = None,
                 skip_data: Callable[[int, int], None] | None = None, store: StateStore | None = None,
                 state: Snapshotter | None = None, extra_state: dict[str, Stateful] | None = None,
                 checkpoint_fn: Callable[[int, CheckpointKind], None] | None = None,
                 on_restore: Callable[[int], None] | None = None, wrap_optimizer: bool = True,
                 rerun_fn: RerunFn | None = None, sample_ids_fn: SampleIdsFn | None = None,
                 triage: TriageConfig | None = None, exclude_samples: Callable[[list[int]], None] | None = None) -> None:
        self.agent = agent
        self.config = config if config is not None else agent.config.recovery
        self.model = model if model is not None else agent.model
        self.optimizer = optimizer if optimizer is not None else agent.optimizer
        self.triage: StepTriage | None = None
        """Re-run attribution of critical steps (agent/recovery/triage_run.py), when the loop gave a ``rerun_fn``."""
        extra = dict(extra_state or {})
        if rerun_fn is not None and self.config.triage_max_steps:  # 0: triage declared off
            self.triage = StepTriage(agent, self.model, rerun_fn, sample_ids_fn=sample_ids_fn,
                                     config=triage if triage is not None else self.config.triage,
                                     exclude=exclude_samples, max_steps=self.config.triage_max_steps)
            extra.setdefault("triage", self.triage)  # the bad-batch list rides every checkpoint (never forgets)
            agent.lifecycle.summaries["triage"] = self.triage.summary
        self.state: Snapshotter = state or LoopState(self.model, self.optimizer, scheduler, agent, data_position, extra)
        self.ring: MemoryRing | None = None
        if store is None:
            self.ring = MemoryRing(self.config.ring_size)
            store = RingStore(self.ring, self.config.snapshot_every, self._on_memory_snapshot)
        self.store: StateStore = store
        self.validate_fn = validate_fn
        self.loss_fn = loss_fn
        self.skip_data_fn = skip_data
        self.checkpoint_fn = checkpoint_fn
        self.on_restore = on_restore
        """Called on every rank after a restore, with the step the loop runs next (a loop's own
        counters, such as a progress line's rate, restart there)."""
        self.on_periodic_validation: Callable[[int, float], None] | None = None
        """Called with (step, val_loss) after each ``val_every`` validation of ``at_boundary``;
        unlike a failed validation, what it raises ends the run (an HPO pruner's verdict)."""
        self.on_command: Callable[[Command, Outcome, int], None] | None = None
        """Called on every rank after each dispatched command with its outcome and the step the loop
        was at before it (the bundled trainer keeps its own record of what it applied)."""
        self.on_timeout: Callable[[Timeout, int], None] | None = None
        """Called on every rank after a timeout policy was applied, with the step before it."""
        self.kept: deque[Any] = deque(maxlen=self.config.val_keep or None)
        """The held-back slice: recent training batches of steps the guard passed as ok."""
        self._pending_batches: list[Any] = []
        self.stop_reason = ""
        """Why the run ends early ("failed: ..." when a timeout policy failed it)."""
        self._apply_update = True
        self._hold_pending = False
        self._explained = False  # a triage verdict cured this step's cause (no hold for it)
        self._applied_scale = 1.0
        self._warned_step = False
        self._leaving: Any = None  # the RestartPlan of an applied restart: the loop leaves at this boundary
        self.node_check_hook: Callable[[int], None] | None = None
        """Runs inside each round of the node check's timed window (a fault's slow rank)."""
        self.node_check: Any = None
        """The restarted group's node check (agent/hang/node_check.py ``CheckResult``), if one ran."""
        self.cadence = ValidationCadence(self.config.val_every, self.config.val_max_share)
        """The periodic validations' cadence and what every validation cost (``run.finished``'s ``validation``)."""
        self.restored = ""
        """What the last restore brought back, in words (agent/recovery/restored.py)."""
        agent.lifecycle.summaries["validation"] = self.cadence.summary
        self.restores = 0
        """Rollbacks applied so far (a command's, a timeout policy's or the loop's own)."""
        hang = getattr(agent, "hang", None)
        self.preemption = PreemptionWatch(agent.config.preemption,
                                          stalled=lambda: hang is not None and hang.stall_reported,
                                          on_stalled=hang.leave_on_signal if hang is not None else None)
        """The warning signals' watch (installed by ``start``); its request rides the step's all-reduce."""
        agent.channel.preempt_pending = self._preempt_pending
        self._launcher_word: preempt_leave.LauncherWord | None = None
        """Elastic launches: the node's launcher's word of a scheduler warning (set by ``start``)."""
        self.preempted: dict[str, Any] | None = None
        """The ``run.preempted`` payload once the run saved for a preemption (every rank has it)."""
        self.exit_code: int | None = None
        """What the process exits with after a preemption save (the scheduler's requeue code, or
        torchrun's restart code for a rank that stays in an elastic run); None: the run did not stop for one."""
        self._started_wall = time.time()
        if wrap_optimizer and self.optimizer is not None:
            self._wrap_step(self.optimizer)

    # ------------------------------------------------------------------ what the kit can do
    @property
    def capabilities(self) -> frozenset[CommandType]:
        """The commands this kit applies (declared in ``run.started``; the controller sends no other).
        None on a rank 0 that listens for no command (no secret): that run is report-only."""
        if self.agent.rank == 0 and self.agent.commands is None:
            return frozenset()
        # DETAIL is the agent's own (agent/dispatch.py opens its per-rank window), so every kit has it.
        # RESTART: the kit leaves for torchrun; whether torchrun restarts it, run.started says (life, max_restarts)
        caps = {CommandType.PAUSE, CommandType.RESUME, CommandType.STOP, CommandType.SET_LR_SCALE,
                CommandType.CHECKPOINT_NOW, CommandType.DETAIL, CommandType.RESTART}
        if self.validate_fn is not None or (self.loss_fn is not None and self.config.val_keep):
            caps.add(CommandType.VALIDATE)
        if self.ring is None or self.config.snapshot_every:
            caps.add(CommandType.ROLLBACK)
        return frozenset(caps)

    @property
    def lr_scale_applied(self) -> float:
        """The LR scale the last applied update actually used (the agent's ``lr_scale`` is the target)."""
        return self._applied_scale

    @property
    def step(self) -> int:
        """The step the loop runs next (moves back on a rollback)."""
        return self.agent.step

    def start(self, **start_kwargs: Any) -> None:
        """``Agent.start`` with this kit's capabilities (when the agent can declare them). A job
        halted for a human ends here (SystemExit); a restarted group first checks its ranks
        (agent/hang/restart.py)."""
        hang = getattr(self.agent, "hang", None)
        if hang is not None:
            refuse_if_halted(hang)
        if "capabilities" in inspect.signature(self.agent.start).parameters:
            start_kwargs.setdefault("capabilities", sorted(self.capabilities))
        if self.preemption.install():
            self.agent.lifecycle.closers.append(self.preemption)  # the handlers go back when the run closes
            if hang is not None and preempt_leave.is_elastic():
                self._launcher_word = preempt_leave.LauncherWord(str(hang.plan_dir), hang.life.node)
        self.agent.start(**start_kwargs)
        if hang is not None:
            self.node_check = preflight(hang, self.agent.modes, self.agent.emit, device=self.agent.device,
                                        before_round=self.node_check_hook)

    # ------------------------------------------------------------------ per step
    def remember(self, batch: Any) -> None:
        """Keep a CPU copy of a training batch for validation without a validation set. It joins
        the held-back slice only if the guard passes its step as ``ok``: a corrupted batch must not
        become the yardstick that judges the weights."""
        if self.config.val_keep and self.loss_fn is not None:
            self._pending_batches.append(cpu_copy(batch))

    def before_optimizer_step(self) -> bool:
        """The agent's all-reduce and the guard. True = apply this update (the same on every rank)."""
        ok = self.agent.before_optimizer_step()
        if not ok and self.triage is not None and self.agent.decision in (GuardDecision.SKIP, GuardDecision.HOLD):
            ok = self._triage(self.agent.step)
        if self.agent.decision is GuardDecision.OK:
            self.kept.extend(self._pending_batches)
            if self.triage is not None:
                self.triage.last_ok_step = self.agent.step
        self._pending_batches = []
        self._apply_update = ok
        self._hold_pending = self.agent.decision is GuardDecision.HOLD and not self._explained
        self._explained = False
        return ok

    def _triage(self, step: int) -> bool:
        """Re-run the critical step and apply its class's remedy (agent/recovery/triage_run.py).
        True when the update is to be applied after all (a transient fault, retried)."""
        assert self.triage is not None
        try:
            verdict = self.triage.run(step)
        except Exception:  # noqa: BLE001 - a failed re-run leaves the guard's decision as it was
            log.exception("cliffguard triage: the re-runs of step %d failed; the guard's decision stands", step)
            return False
        if verdict is None:
            return False
        ids: list[int] = []
        applied = False
        if verdict.cls is TriageClass.DATA:
            ids = self.triage.record_data(step, verdict)
            self._explained = True
        elif verdict.cls is TriageClass.TRANSIENT:
            self.triage.retry(step)
            applied = self._explained = True
        if self._explained:
            self.agent.guard.clear_hold()  # the cause is cured: the stretch does not count towards a hold
        self.triage.emit(step, sample_ids=ids, applied=applied)
        self.agent.probe.note("triaged", verdict.cls.value)
        return applied

    def scaled_lr(self, lr: float) -> float:
        """``lr`` times the LR scale, recorded as applied (for loops that set the LR themselves)."""
        self._applied_scale = self.agent.lr_scale.value
        return lr * self._applied_scale

    def _wrap_step(self, optimizer: Any) -> None:
        inner = optimizer.step

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            if not self._apply_update:
                self._apply_update = True  # one verdict per update
                return None
            scale = self.agent.lr_scale.value
            groups = optimizer.param_groups
            lrs = [g["lr"] for g in groups]
            for g in groups:
                g["lr"] = g["lr"] * scale
            try:
                return inner(*args, **kwargs)
            finally:
                for g, lr in zip(groups, lrs, strict=True):
                    g["lr"] = lr
                self._applied_scale = scale

        optimizer.step = step

    # ------------------------------------------------------------------ the boundary
    def at_boundary(self, step: int | None = None) -> Boundary:
        """Between steps: ``handle_commands``, then a memory snapshot and a validation (the
        controller's baseline, every ``val_every``) when due. The ``Boundary`` is falsy when the
        run must stop; its ``step`` is the step the loop runs next, which a loop with its own
        counter must take (a rollback moves it back). ``step`` is checked against the agent's
        (the one counter)."""
        self.cadence.enter(time.monotonic())
        try:
            return self._boundary(step)
        finally:
            self.cadence.leave(time.monotonic())

    def _boundary(self, step: int | None) -> Boundary:
        if step is not None and step != self.agent.step and not self._warned_step:
            self._warned_step = True
            log.warning("at_boundary(%d): the agent is at step %d; the agent's counter wins "
                        "(take the step from the Boundary at_boundary returns)", step, self.agent.step)
        before, restores = self.agent.step, self.restores
        if self.agent.channel.preempt_seen:  # before the commands: the grace time is running
            return self._preempt()
        if not self.handle_commands():
            return Boundary(False, self.agent.step)
        if self.agent.channel.preempt_seen:  # warned while paused or held
            return self._preempt()
        step = self.agent.step
        moved = before if self.restores != restores else None
        self.store.on_step(step, lambda: self.state.capture(step))
        if self.triage is not None:
            self.triage.before_step()
        if self.cadence.due(step) and CommandType.VALIDATE in self.capabilities:
            self._periodic_validation(step)
        return Boundary(True, step, moved)

    def _periodic_validation(self, step: int) -> None:
        validation.periodic(self, step)

    def handle_commands(self) -> bool:
        """Hold if the guard asked to, dispatch the delivered commands in order, wait while
        paused/held (the timeouts applied). False when the run must stop."""
        agent = self.agent
        if self._hold_pending and agent.modes.mode not in (HELD, STOPPING):
            agent.modes.move(HELD)
        self._hold_pending = False
        for cmd in agent.poll_commands():
            self._dispatch(cmd)
        self._leave_if_restarting()
        if agent.modes.mode in WAITING:
            self._wait()
        return agent.modes.mode is not STOPPING

    def _leave_if_restarting(self) -> None:
        """After an applied restart: the acks out (the agent closed), then leave for torchrun."""
        if self._leaving is None:
            return
        error = RestartRequested(self._leaving)
        self.agent.close(error)
        raise error

    def _wait(self) -> None:
        agent = self.agent
        since = time.monotonic()
        while agent.modes.mode in WAITING:
            time.sleep(agent.config.command_tick_s)
            if not self.all_ranks(not self._preempt_pending()):  # no step carries the flag here
                agent.channel.preempt_seen = True
                break
            decision = None
            if agent.rank == 0:  # rank 0's clock decides; the decision rides the same broadcast
                decision = timed_out(agent.modes, agent.guard.config, self.config, time.monotonic() - since)
            cmds, decision = agent.exchange(decision)
            for cmd in cmds:
                self._dispatch(cmd)
                since = time.monotonic()
            self._leave_if_restarting()
            if decision is not None and agent.modes.mode in WAITING and not cmds:
                before = agent.step
                apply_timeout(self, agent.modes, decision)
                if self.on_timeout is not None:
                    self.on_timeout(decision, before)
                since = time.monotonic()
        agent.set_step(agent.step)  # the wait is not part of the next step's time

    def _dispatch(self, cmd: Command) -> None:
        before = self.agent.step
        outcome = dispatch(cmd, self, self.agent.modes, self.agent.ack)
        if self.on_command is not None:
            self.on_command(cmd, outcome, before)

    def _preempt(self) -> Boundary:
        return preempt_boundary.save_and_stop(self)

    def _preempt_pending(self) -> bool:
        return preempt_boundary.pending(self)

    # ------------------------------------------------------------------ TimeoutHost
    def available_steps(self) -> list[int]:
        return sorted(self.store.available_steps())

    def first_bad_step(self) -> int | None:
        return self.agent.guard.first_skip_step

    def current_lr_scale(self) -> float:
        return self.agent.lr_scale.value

    def lr_factor(self) -> float:
        return self.agent.guard.config.policy.lr_factor

    def fail(self, reason: str) -> None:
        self.stop_reason = f"failed: {reason}"
        self.agent.modes.move(STOPPING)

    def report_timeout(self, data: dict[str, Any]) -> None:
        if self.agent.rank == 0:
            self.agent.emit(EventType.TRAINER_TIMEOUT, data)

    # ------------------------------------------------------------------ state
    def all_ranks(self, ok: bool) -> bool:
        """True when ``ok`` holds on every rank (one all-reduce)."""
        if not self.agent.distributed:
            return ok
        t = torch.tensor([1 if ok else 0], dtype=torch.int64, device=self.agent.device)  # NCCL: on device
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def snapshot(self, kind: CheckpointKind = CheckpointKind.MEMORY) -> None:
        """A checkpoint of the state before the next step."""
        self.store.save(self.agent.step, self.state.capture(self.agent.step), kind)

    def _on_memory_snapshot(self, step: int, steps: list[int]) -> None:
        if self.agent.rank != 0 or self.ring is None:
            return
        snap = self.ring.values()[-1] if self.ring.steps()[-1] == step else None
        self.agent.emit(EventType.CHECKPOINT, {
            "kind": CheckpointKind.MEMORY.value, "path": "", "bytes": _nbytes(snap), "sha256": "", "seconds": 0.0,
            "verified": True, "detail": f"memory ring holds steps {steps[0]}..{steps[-1]} ({len(steps)})"}, step=step)

    def restore(self, to_step: int) -> str:
        """Restore the state labelled ``to_step`` on every rank, or on none (RollbackUnavailable).
        Newer states are forgotten only once every rank restored. Returns the source."""
        state: dict[str, Any] | None = None
        source = ""
        try:
            state, source = self.store.restore(to_step, discard_newer=False)
        except Exception as exc:  # noqa: BLE001 - any rank failing means no rank restores
            log.warning("rank %d cannot restore step %d: %s", self.agent.rank, to_step, exc)
        if not self.all_ranks(state is not None):
            have = self.available_steps()
            everywhere = set(have)
            if self.agent.distributed:  # one gather, every rank here: what all of them can restore
                lists: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(lists, have)
                everywhere = set.intersection(*(set(x) for x in lists))
            raise RollbackUnavailable(f"step {to_step} is not available on every rank (have {have})",
                                      sorted(everywhere))
        assert state is not None
        self.store.discard_after(to_step)
        self.restored = describe_restored(state)
        self.agent.set_step(self.state.load(state))
        self.restores += 1
        if self.on_restore is not None:
            self.on_restore(self.agent.step)
        return source

    # ------------------------------------------------------------------ validation
    def run_validation(self, cmd_id: str | None = None, batches: int | None = None) -> float:
        return validation.run(self, cmd_id, batches)

    def validate_held_back(self, batches: int | None = None) -> tuple[float, int]:
        return validation.held_back(self, batches)

    # ------------------------------------------------------------------ CommandTarget
    def pause(self) -> Outcome:
        return Outcome.applied(f"paused at step {self.agent.step}")

    def resume(self) -> Outcome:
        self.agent.guard.answer_hold()  # a stretch that goes on is still skipped; the hold re-arms
        return Outcome.applied(f"resumed at step {self.agent.step}")

    def validate(self, cmd_id: str, batches: int | None) -> Outcome:
        val = self.run_validation(cmd_id, batches)
        return Outcome.applied(f"val_loss={val:.6g} at step {self.agent.step}")

    def rollback(self, to_step: int, lr_scale: float, skip_data: tuple[int, int] | None = None) -> Outcome:
        """The one rollback (a command's, a timeout policy's, or a loop's own): restore ``to_step`` on
        every rank (or raise ``RollbackUnavailable``, nothing changed), then set ``lr_scale``, then
        skip ``[first, stop)``. The outcome's detail says where the state came from."""
        source = self.restore(to_step)
        self.agent.lr_scale.set(lr_scale)
        if skip_data and self.skip_data_fn is not None:
            self.skip_data_fn(int(skip_data[0]), int(skip_data[1]))
        self.agent.guard.clear_hold()
        self._hold_pending = False
        detail = f"restored step {to_step} from {source}: {self.restored}; lr_scale={self.agent.lr_scale.value:g}"
        if skip_data and self.skip_data_fn is not None:
            detail += f"; skipping samples [{skip_data[0]}, {skip_data[1]})"
        elif skip_data:
            detail += f"; samples [{skip_data[0]}, {skip_data[1]}) not skipped (the loop gave the kit no skip_data)"
        return Outcome.applied(detail + self.rollback_detail())

    def rollback_detail(self) -> str:
        """More for a rollback's ack (the bundled trainer adds a parameter digest)."""
        return ""

    def set_lr_scale(self, lr_scale: float) -> Outcome:
        self.agent.lr_scale.set(lr_scale)
        return Outcome.applied(f"lr_scale={self.agent.lr_scale.value:g} from step {self.agent.step}")

    def checkpoint_now(self, kind: CheckpointKind) -> Outcome:
        if self.checkpoint_fn is not None:
            self.checkpoint_fn(self.agent.step, kind)
            return Outcome.applied(f"{kind} checkpoint of step {self.agent.step} queued")
        taken = kind if self.ring is None else CheckpointKind.MEMORY  # the kit's own ring: memory only
        self.snapshot(taken)
        return Outcome.applied(f"{taken} checkpoint of step {self.agent.step} taken")

    def stop(self, reason: str) -> Outcome:
        self.stop_reason = reason
        return Outcome.applied(f"stopping at step {self.agent.step}")

    def restart(self, cmd: Command) -> Outcome:
        outcome, self._leaving = restart_outcome(self.agent.hang, cmd)
        return outcome

