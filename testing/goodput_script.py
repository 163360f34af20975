"""A scripted run with a known schedule of faults, as the events a trainer sends and the seconds
each goodput bucket must hold: checkpoints every N steps, one pause (validation normal), one
rollback (validation abnormal), one elastic scale-down and one scale-up, one restart.

``Script`` keeps its own clock (``t``) and writes each event with the ``ts`` it happened at, so
the expected buckets are exact arithmetic; ``events()`` is the stream, ``expected`` the truth.
The broker tests publish the same stream to the real controller, answering its commands.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.events import Event, make_event
from cliffguard.core.rank_arrays import summarize_losses
from testing.controller_stack import step_data

T0 = 1_900_000_000.0  # a fixed epoch: the same stream every run


@dataclass
class Script:
    run: str = "goodput-script"
    step_s: float = 1.0
    wait_s: float = 0.1
    world: int = 4
    t: float = T0
    step: int = 0
    out: list[Event] = field(default_factory=list)
    expected: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    expected_gpu: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    kept: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    """step -> (productive, data wait, world) of the steps of the kept timeline."""
    steps_lost: int = 0
    on_emit: Callable[[Event], None] | None = None
    """Called with each event as it is written (the broker test publishes it then)."""
    t0: float = field(init=False)

    def __post_init__(self) -> None:
        self.t0 = self.t

    def emit(self, type: str, data: dict[str, Any], step: int | None = None, **kw: Any) -> Event:
        ev = make_event(type, self.run, self.step if step is None else step, data, world=self.world, ts=self.t,
                        **kw)
        self.out.append(ev)
        if self.on_emit is not None:
            self.on_emit(ev)
        return ev

    def spend(self, seconds: float, bucket: str) -> None:
        self.t += seconds
        self.expected[bucket] += seconds
        self.expected_gpu[bucket] += seconds * self.world

    # ------------------------------------------------------------------ what a trainer does
    def start(self, config: dict[str, Any] | None = None) -> None:
        self.emit("run.started", {"n_params": 1000, "n_layers": 2, "n_heads": 2, "head_dim": 8, "seq_len": 16,
                                  "global_batch": 8 * self.world, "peak_flops": 1e12, "peak_source": "config",
                                  "lr_schedule": {}, "world_size": self.world, **({"config": config} if config else {})})

    def steps(self, n: int, loss: Callable[[int], float] | None = None, guard: str = "ok") -> None:
        for _ in range(n):
            self.t += self.step_s
            skipped = guard in ("skip", "hold")
            if skipped:
                self.expected["skipped"] += self.step_s
                self.expected_gpu["skipped"] += self.step_s * self.world
            else:
                self.expected["data_wait"] += self.wait_s
                self.expected["productive"] += self.step_s - self.wait_s
                self.expected_gpu["data_wait"] += self.wait_s * self.world
                self.expected_gpu["productive"] += (self.step_s - self.wait_s) * self.world
                self.kept[self.step] = (self.step_s - self.wait_s, self.wait_s, self.world)
            value = 2.0 if loss is None else loss(self.step)
            data = {**step_data(value, self.step), "step_time_s": self.step_s, "data_wait_s": self.wait_s,
                    "compute_s": self.step_s - self.wait_s, "guard": guard, "skipped": skipped,
                    "rank_losses": summarize_losses([value] * self.world)}
            self.emit("step", data)
            self.step += 1

    def snapshot(self, stall_s: float, bucket: str = "checkpoint_save") -> None:
        """A memory snapshot before the next step (the training thread's copy); the first one,
        right after the start, is part of the initialization."""
        self.spend(stall_s, bucket)
        self.emit("checkpoint", {"kind": "memory", "path": "", "bytes": 10, "sha256": "", "seconds": stall_s,
                                 "verified": True})

    def disk_written(self, step: int, kind: str = "incremental", seconds: float = 0.3) -> None:
        """The background writer's event (no stall: the training thread went on)."""
        self.emit("checkpoint", {"kind": kind, "path": f"/ckpt/{step}", "bytes": 10, "sha256": "0" * 64,
                                 "seconds": seconds, "verified": True}, step=step)

    def ack(self, cmd_id: str, cmd_type: str, seconds: float, bucket: str, status: str = "applied") -> None:
        self.spend(seconds, bucket)
        self.emit("command.ack", {"cmd": cmd_id, "cmd_type": cmd_type, "status": status, "detail": ""})

    def validation(self, cmd_id: str | None, seconds: float, val_loss: float) -> None:
        self.spend(seconds, "pause_validation")
        self.emit("validation", {"val_loss": val_loss, "batches": 4, **({"cmd": cmd_id} if cmd_id else {})})

    def rewind(self, to_step: int) -> None:
        """The kept steps from ``to_step`` on are lost: their time moves to rolled_back."""
        for s in [s for s in self.kept if s >= to_step]:
            prod, wait, world = self.kept.pop(s)
            for bucket, sec in (("productive", prod), ("data_wait", wait)):
                self.expected[bucket] -= sec
                self.expected["rolled_back"] += sec
                self.expected_gpu[bucket] -= sec * world
                self.expected_gpu["rolled_back"] += sec * world
        self.steps_lost += self.step - to_step
        self.step = to_step

    def events(self) -> list[Event]:
        return list(self.out)

    @property
    def wall_s(self) -> float:
        return self.t - self.t0


@dataclass(frozen=True)
class Answer:
    """A command the script answers: its id and arguments (a rollback's ``to_step``)."""

    id: str
    args: dict[str, Any] = field(default_factory=dict)


def made_up(script: Script, kind: str) -> Answer:
    """A command id of the script's own (no controller), and a rollback to the snapshot at 30."""
    return Answer(f"{kind:0<32}"[:32].replace("_", "0"), {"to_step": 30} if kind == "rollback" else {})


def schedule(answer: Callable[[Script, str], Answer] = made_up, *, ckpt_every: int = 10,
             script: Script | None = None) -> Script:
    """The whole schedule, answering commands with ``answer(script, command_type)`` (the broker
    test's waits for the controller's command of that type and returns it)."""
    s = script or Script()
    asked: dict[str, Answer] = {}

    def cmd(_s: Script, kind: str, fresh: bool = True) -> str:
        if fresh or kind not in asked:
            asked[kind] = answer(s, kind)
        return asked[kind].id

    s.start()
    s.spend(2.0, "initialization")
    for block in range(3):  # steps 0..29, a snapshot every ckpt_every steps (and a disk copy of it)
        s.snapshot(0.5, "initialization" if block == 0 else "checkpoint_save")
        at = s.step
        s.steps(ckpt_every)
        s.disk_written(at)
        if block == 0:
            s.validation(None, 0.5, 2.0)  # the periodic validation: the controller's healthy baseline
    # one pause: the loss jumps once, the controller pauses, validates (normal) and resumes
    s.snapshot(0.5)
    s.steps(1, loss=lambda _: 20.0, guard="skip")
    s.ack(cmd(s, "pause"), "pause", 0.2, "pause_validation")
    s.validation(cmd(s, "validate"), 3.0, 2.0)
    s.ack(cmd(s, "validate", fresh=False), "validate", 0.01, "pause_validation")
    s.ack(cmd(s, "resume"), "resume", 1.0, "pause_validation")
    s.steps(9)
    # one rollback: the loss climbs, validation abnormal, rollback to the snapshot at 30, LR halved
    s.snapshot(0.5)
    s.steps(5, loss=lambda _: 30.0, guard="skip")
    s.ack(cmd(s, "pause"), "pause", 0.2, "pause_validation")
    s.validation(cmd(s, "validate"), 3.0, 9.0)
    s.ack(cmd(s, "validate", fresh=False), "validate", 0.01, "pause_validation")
    s.ack(cmd(s, "rollback"), "rollback", 2.0, "checkpoint_restore")
    s.rewind(int(asked["rollback"].args["to_step"]))  # the snapshot at 30 (or the controller's target)
    s.steps(50 - s.step)  # to 49
    # elastic scale-down: a node is lost after step 49, the group restarts at world 2 from step 40
    s.spend(5.0, "restart")
    s.world = 2
    s.start()
    s.spend(3.0, "checkpoint_restore")
    s.rewind(40)
    s.emit("elastic.scaled_down", {"from_world": 4, "to_world": 2, "from_global_batch": 32, "global_batch": 16,
                                   "grad_accum": 1, "lr": 1e-3, "lr_factor": 0.707, "steps_lost": 10,
                                   "seconds_lost": 8.0, "backoff_s": 0.0, "policy": "proportional",
                                   "lr_rule": "sqrt"}, step=40)
    s.steps(20)  # 40..59 at world 2
    s.snapshot(0.5)
    s.steps(10)  # 60..69
    # and back up: world 4 again, from the snapshot at 60
    s.spend(4.0, "restart")
    s.world = 4
    s.start()
    s.spend(2.0, "checkpoint_restore")
    s.rewind(60)
    s.emit("elastic.scaled_up", {"from_world": 2, "to_world": 4, "from_global_batch": 16, "global_batch": 32,
                                 "grad_accum": 1, "lr": 1e-3, "lr_factor": 1.0, "steps_lost": 10,
                                 "seconds_lost": 6.0, "backoff_s": 0.0, "policy": "proportional",
                                 "lr_rule": "sqrt"}, step=60)
    s.steps(20)  # 60..79
    # one restart: the process fails, is relaunched and resumes from the snapshot at 70
    s.emit("run.failed", {"error": "injected: worker killed"})
    s.spend(6.0, "restart")
    s.start()
    s.spend(1.5, "checkpoint_restore")
    s.rewind(70)
    s.steps(30)  # 70..99
    s.emit("run.finished", {"steps": s.step})
    return s


def book_through_controller(engine: Any, events: list[Event], goodput: Any = None, *, reload_at: int | None = None,
                            batch: int = 25) -> None:
    """``events`` through the controller's ``BatchProcessor`` (its rules, recovery machine and
    ledgers) into a migrated store, ``batch`` events per transaction; at ``reload_at`` the run
    table is dropped, as when the run's partition moves: the next batch reloads it from the store."""
    from cliffguard.controller.alerts import AlertsConfig
    from cliffguard.controller.batch import BatchContext, BatchProcessor
    from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
    from cliffguard.controller.goodput.config import GoodputConfig
    from cliffguard.controller.recovery_types import RecoveryConfig
    from cliffguard.controller.runstate import RunTable, default_detector_factory
    from cliffguard.controller.store.db import session_scope
    from cliffguard.core.signing import Secret

    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig(), goodput=goodput or GoodputConfig())
    runs = RunTable(default_detector_factory())
    proc = BatchProcessor(ctx, runs)
    offset = 0
    for i in range(0, len(events), batch):
        if reload_at is not None and i >= reload_at and runs.slots:
            runs.clear()
            reload_at = None
        chunk = events[i:i + batch]
        recs = [EdgeRecord("events", 0, offset + j, ev) for j, ev in enumerate(chunk)]
        offset += len(chunk)
        with session_scope(engine) as s:
            proc.process(s, EdgeBatch(records=recs, next_offsets={("events", 0): offset}), now=chunk[-1].ts)
