"""Accelerate: a report-only tracker, and the recovery kit for an ``Accelerator`` loop in one line.

**Tracker** (``Accelerator(log_with=[AgentTracker(...)])``): every ``accelerator.log({"loss": ...,
"lr": ...}, step=...)`` becomes a ``step`` event (timing from the interval between logs, MFU when
``tokens`` is logged). Report-only: a tracker never sees the optimizer, so the guard's verdict is
reported, not enforced, and its ``run.started`` declares no command (``core/capabilities.py``): the
controller alerts on such a run and never pauses it. The tracker may be given a factory instead of
an agent, because the Accelerator it is handed to is what the agent is built from::

    accelerator = Accelerator(log_with=[AgentTracker(lambda: Agent(accelerator, model, optimizer, cfg))])

(the lambda runs at ``accelerator.init_trackers``, once ``accelerator`` and the prepared model exist).

**Acting** (``accelerate_kit``): one line after ``accelerator.prepare`` builds the agent and the
recovery kit (agent/recovery/kit.py) on the Accelerator's ranks and device, with Kafka, the command
secret and ``[agent]`` from the settings every process reads (``CLIFFGUARD_CONFIG`` < ``CLIFFGUARD_*`` env)::

    kit = accelerate_kit(accelerator, model, optimizer, scheduler, run="my-run")

then the kit's loop (the README's plain loop, with ``accelerator.backward(loss)``). No tracker is
needed with it: the kit's agent reports every step itself, and enforces the guard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from accelerate.tracking import GeneralTracker

from cliffguard.agent.config import AgentConfig
from cliffguard.agent.hooks import Agent
from cliffguard.core.capabilities import REPORT_ONLY

log = logging.getLogger(__name__)


def _scalar(values: dict[str, Any], *names: str) -> float | None:
    for n in names:
        v = values.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class AgentTracker(GeneralTracker):
    """Accelerate ``GeneralTracker`` that turns logged scalars into agent events (every rank).
    ``agent``: the Agent, or a no-argument factory called on first use."""

    name = "cliffguard"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, agent: Agent | Callable[[], Agent]) -> None:
        super().__init__()
        self._agent = agent
        self._started = False

    @property
    def agent(self) -> Agent:
        if not isinstance(self._agent, Agent):
            self._agent = self._agent()
        return self._agent

    @property
    def tracker(self) -> Agent:
        return self.agent

    def store_init_configuration(self, values: dict) -> None:
        if not self._started:
            self.agent.start(config=dict(values), capabilities=REPORT_ONLY)
            self._started = True

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if not self._started:
            self.store_init_configuration({})
        loss = _scalar(values, "loss", "train_loss")
        if loss is None:
            return
        tokens = _scalar(values, "tokens")
        self.agent.report_step(loss, step=step, lr=_scalar(values, "lr", "learning_rate"),
                               grad_norm=_scalar(values, "grad_norm"), tokens=int(tokens or 0))

    def finish(self) -> None:
        self.agent.close()


def accelerate_kit(accelerator: Any, model: Any, optimizer: Any, scheduler: Any = None, *, run: str | None = None,
                   config: AgentConfig | None = None, config_path: str | None = None, kafka: Any = None,
                   secret: Any = None, seq_len: int | None = None, start: bool = True, global_batch: int = 0,
                   **kit_kwargs: Any) -> Any:
    """The agent and the recovery kit for a prepared Accelerator loop, started (``run.started``
    declares the kit's capabilities and ``global_batch``, the samples per optimizer step over all
    ranks: 0 = not declared). ``run`` or ``config`` names the run; Kafka, the secret and
    ``[agent]`` come from the settings every process reads (agent/integrations/settings.py) unless
    given; ``kit_kwargs`` go to ``RecoveryKit`` (``validate_fn``, ``loss_fn``, ...)."""
    from cliffguard.agent.integrations.settings import agent_wiring
    from cliffguard.agent.recovery import RecoveryKit

    name = run or (config.run if config is not None else None)
    if not name:
        raise ValueError("run: name the run (or pass an AgentConfig)")
    config, agent_kwargs = agent_wiring(name, config, config_path, kafka=kafka, secret=secret)
    agent = Agent(accelerator, model, optimizer, config, seq_len=seq_len, **agent_kwargs)
    kit = RecoveryKit(agent, model, optimizer, scheduler, **kit_kwargs)
    if start:
        kit.start(global_batch=global_batch)
    return kit
