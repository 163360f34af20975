"""The controller's judgement in-process, as rank 0's command source (bench.triage).

The service (controller/service.py) reads events from Kafka, judges them with ``RunDetector`` and
walks the recovery machine (``transition``), storing the result and sending signed commands. Here
the same pure parts read rank 0's events straight from its ``InMemorySink`` and hand the machine's
commands back through ``CommandSource.poll``: the rules and the recovery table are the service's,
without the broker, the store and the signing (bench.stretch and the demo run those end to end).
Only rank 0's events reach it, as only rank 0 speaks for a run whose ranks all-reduce.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from cliffguard.agent.sinks import InMemorySink
from cliffguard.controller.batch_inputs import inputs_for
from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.recovery import new_state, transition
from cliffguard.controller.recovery_types import RecordTransition, RecoveryConfig, SendCommand
from cliffguard.core.events import Command, command_from_dict


class InProcessController:
    def __init__(self, sink: InMemorySink, run: str, recovery: RecoveryConfig, rules: RulesConfig | None = None) -> None:
        self.sink, self.run, self.cfg = sink, run, recovery
        self.detector = RunDetector(rules or RulesConfig())
        self.state = new_state(run, "bench")
        self.read = 0  # events of the sink judged so far
        self.transitions: list[RecordTransition] = []
        self.sent: list[SendCommand] = []

    def poll(self) -> Iterable[Command]:
        out: list[Command] = []
        now = time.time()
        events = self.sink.events
        while self.read < len(events):
            event = events[self.read]
            self.read += 1
            for inp in inputs_for(event, self.detector.on_event(event), now):
                self.state, actions = transition(self.cfg, self.state, inp)
                for a in actions:
                    if isinstance(a, RecordTransition):
                        self.transitions.append(a)
                    elif isinstance(a, SendCommand):
                        self.sent.append(a)
                        out.append(self._command(a, now))
        return out

    def _command(self, a: SendCommand, now: float) -> Command:
        # the machine's id, so the trainer's ack answers the command the machine waits on
        cmd = Command(type=a.type, run=self.run, args=dict(a.args), issued_at=now, expires_at=now + a.ttl_s, id=a.id)
        return command_from_dict(cmd.to_dict())

    def close(self) -> None:
        return None

    def story(self) -> list[dict[str, Any]]:
        """The transitions, as the store would keep them (from, to, trigger, step, reason)."""
        return [{"from": str(t.from_state), "to": str(t.to_state), "trigger": str(t.trigger), "step": t.step,
                 "reason": t.reason} for t in self.transitions]
