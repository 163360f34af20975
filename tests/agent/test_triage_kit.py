"""Re-run attribution in the recovery kit (agent/recovery/triage_run.py) on a plain loop (world 1,
CPU, in-memory sink): a poisoned batch is classified data, skipped and put on the bad-batch list
(a stretch of them never holds the run); a one-off corruption is transient, retried and applied."""

from __future__ import annotations

import torch

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hooks import Agent
from cliffguard.agent.modes import TrainerMode
from cliffguard.agent.recovery import KitConfig, RecoveryKit
from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.core.spike import SpikeConfig


class NoCommands:
    def poll(self):
        return []

    def close(self) -> None:
        pass


class Loop:
    """A plain loop whose batch is a function of the step; ``poisoned`` steps are bad every time
    they run (data), ``flipped`` steps only the first time (a transient fault)."""

    def __init__(self, poisoned=(), flipped=()) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        cfg = AgentConfig(run="triage", hist_every=0, heartbeat_s=60, calibration_s=0.05, command_tick_s=0.01,
                          guard=GuardConfig(spike=SpikeConfig(window=16, min_history=6), hold_timeout_s=0.5,
                                            on_timeout="resume"),
                          recovery=KitConfig(snapshot_every=2, ring_size=4, pause_timeout_s=0))
        self.sink = InMemorySink()
        self.agent = Agent(None, self.model, self.opt, cfg, sink=self.sink, command_source=NoCommands())
        self.poisoned, self.flipped = set(poisoned), set(flipped)
        self.excluded: list[int] = []
        self.kit = RecoveryKit(self.agent, self.model, self.opt, rerun_fn=self.rerun,
                               sample_ids_fn=lambda step, rank: [step], exclude_samples=self.excluded.extend)
        self.applied: dict[int, bool] = {}

    def batch(self, step: int, first_run: bool):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(8, 4, generator=g)
        y = x.sum(dim=1, keepdim=True)
        bad = step in self.poisoned or (first_run and step in self.flipped)
        return x, y * 1000 if bad else y

    def forward_backward(self, step: int, first_run: bool) -> torch.Tensor:
        x, y = self.batch(step, first_run)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        return loss

    def rerun(self, step: int, shard: int, sync: bool):
        loss = self.forward_backward(step, first_run=False)
        norm = float(torch.cat([p.grad.flatten() for p in self.model.parameters()]).norm())
        return loss, norm

    def run(self, until: int) -> None:
        kit, agent = self.kit, self.agent
        kit.start()
        while agent.step < until and (b := kit.at_boundary()):
            step = b.step
            x, y = self.batch(step, first_run=True)
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            agent.after_forward(loss)
            loss.backward()
            agent.after_backward()
            before = self.model.weight.detach().clone()
            kit.before_optimizer_step()
            self.opt.step()  # unconditionally: the kit's wrapper obeys the verdict
            self.applied[step] = not torch.equal(before, self.model.weight)
            self.opt.zero_grad()
            agent.after_step()
        agent.close()

    def triaged(self) -> list:
        return [e for e in self.sink.events if e.type is EventType.STEP_TRIAGED]


def test_a_poisoned_stretch_is_data_skipped_listed_and_never_holds() -> None:
    loop = Loop(poisoned={20, 21, 22, 23, 24})  # longer than the guard's hold_after (3)
    loop.run(30)
    events = loop.triaged()
    assert [e.step for e in events] == [20, 21, 22, 23, 24]
    assert all(e.data["class"] == "data" and e.data["remedy"] == "skip_batch" for e in events)
    assert [e.data["sample_ids"] for e in events] == [[20], [21], [22], [23], [24]]
    assert not any(loop.applied[s] for s in range(20, 25)), "a bad update reached the weights"
    assert all(loop.applied[s] for s in range(25, 30))
    assert loop.excluded == [20, 21, 22, 23, 24] and len(loop.kit.triage.bad) == 5
    steps = {e.step: e.data for e in loop.sink.events if e.type is EventType.STEP}
    assert [s for s, d in sorted(steps.items()) if "triaged" in d] == [20, 21, 22, 23, 24]
    assert steps[20]["triaged"] == "data" and steps[20]["skipped"]
    assert all(e.data["reruns"] == 2 for e in events)  # the same batch, then the control
    held = [e for e in loop.sink.events if e.type is EventType.HEARTBEAT and e.data.get("mode") == TrainerMode.HELD]
    assert not held and loop.agent.modes.mode is not TrainerMode.HELD


def test_a_one_off_corruption_is_transient_retried_and_applied() -> None:
    loop = Loop(flipped={20})
    loop.run(26)
    (event,) = loop.triaged()
    assert (event.step, event.data["class"], event.data["remedy"]) == (20, "transient", "retry_step")
    assert event.data["update_applied"] and loop.applied[20]
    assert event.data["sample_ids"] == [] and len(loop.kit.triage.bad) == 0


def test_the_bad_batch_list_survives_a_rollback_of_the_kit() -> None:
    loop = Loop(poisoned={20})
    loop.run(26)
    loop.kit.restore(loop.kit.available_steps()[0])  # a state saved before step 20
    assert loop.kit.triage.bad.sample_ids == {20}
    finished = [e for e in loop.sink.events if e.type is EventType.RUN_FINISHED]
    assert finished and finished[-1].data["triage"]["verdicts"] == {"data": 1}
