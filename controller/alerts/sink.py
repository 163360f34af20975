"""Where an alert goes: the ``AlertSink`` interface the deliverer (deliver.py) sends through.

A sink gets one ``Delivery`` (the stored alert, the outbox row id to send as the message id, the
attempt's time and timeout) and answers a ``SinkResult``: the ``Outcome`` the retry policy acts
on (retry.py: delivered / retry / gone / rejected) and a detail for the row's ``last_error``.
A sink reports transport trouble as ``RETRY`` rather than raising; should one raise anyway, the
deliverer counts that as a retry too, so a bug never loses an alert.

Implementations: ``HttpSink`` (http_sink.py; the generic, Slack and PagerDuty formats over
HTTP), and for tests ``NullSink`` (accepts everything) and ``InMemorySink`` (records what it got;
can be told to fail). sink_factory.py picks a sink for an endpoint from its config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cliffguard.controller.alerts.retry import Outcome
from cliffguard.controller.alerts.spec import AlertMessage


@dataclass(frozen=True, slots=True)
class Delivery:
    message: AlertMessage
    msg_id: str
    """The outbox row id: the message id the receiver de-duplicates by, the same on every retry."""
    now: float
    """This attempt's time (a signed format signs it)."""
    timeout_s: float
    """How long this attempt may take (the deliverer's claim on the row lasts a little longer)."""
    attempt: int = 1
    """1 for the first try of this row."""


@dataclass(frozen=True, slots=True)
class SinkResult:
    outcome: Outcome
    detail: str = ""
    """Why it was not delivered (stored as the row's last_error): never a URL, header or secret."""
    retry_after_s: float | None = None
    """The receiver's own wait before the next try (HTTP Retry-After), if it named one."""

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.DELIVERED


DELIVERED = SinkResult(Outcome.DELIVERED)


class AlertSink(Protocol):
    def send(self, delivery: Delivery) -> SinkResult: ...


class NullSink:
    """Accepts every alert and sends it nowhere."""

    def send(self, delivery: Delivery) -> SinkResult:
        return DELIVERED


@dataclass
class InMemorySink:
    """Records every delivery it is handed and its answer: ``script`` first (one result per
    delivery), then ``default``. ``fail_next(n)`` queues n failures."""

    script: list[SinkResult] = field(default_factory=list)
    default: SinkResult = DELIVERED
    received: list[Delivery] = field(default_factory=list)
    answers: list[SinkResult] = field(default_factory=list)

    def fail_next(self, n: int, result: SinkResult | None = None) -> InMemorySink:
        self.script.extend([result or SinkResult(Outcome.RETRY, "injected failure")] * n)
        return self

    def send(self, delivery: Delivery) -> SinkResult:
        result = self.script.pop(0) if self.script else self.default
        self.received.append(delivery)
        self.answers.append(result)
        return result

    @property
    def delivered(self) -> list[Delivery]:
        """The deliveries answered DELIVERED, in order (a retried alert appears once)."""
        return [d for d, r in zip(self.received, self.answers, strict=True) if r.ok]
