"""The launcher's admission check (issue 22, item 4): before ``cliffguard train`` starts torchrun,
and so before its node joins the rendezvous, it reads the suspect-node list the controller
publishes (``controller/admission.py``, topic ``<prefix>.suspects``) to its end and refuses to
start on a node the list holds suspect.

- Refused: one line names the node, the cause, the reason and ``cliffguard nodes clear``; the
  launch exits ``REFUSED_EXIT`` (77) without starting torchrun.
- Admitted: the node is not on the list, or its entry says cleared (cleared, or on probation).
- Unchecked (fail-open): the broker cannot be reached, the read takes longer than
  ``[train.admission] timeout_s`` (5 s), or there is no key to verify the list with. The launch
  goes on and says so loudly (a monitoring outage must not stop training); the controller still
  refuses the node at its first heartbeat (``controller/suspects.py``).
- Entries that are unsigned or badly signed are ignored, and the launch says how many and why
  (``core/admission.py`` ``read_board``): the network is hostile.

The node is the heartbeat's: ``--node-id``, else ``CLIFFGUARD_NODE_ID``, else the host name.
Off with ``--no-admission-check`` or ``[train.admission] enabled = false``; skipped when the
launch started its own embedded broker (no controller can have published to it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cliffguard.core.admission import Board, Verdict, decide, read_board, refusal_line
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.kafka_producers import tcp_reachable
from cliffguard.core.signing import VerifyingKey


class Unavailable(RuntimeError):
    """The list could not be read in time: the launch goes on unchecked."""


def read_records(kafka: KafkaConfig, timeout_s: float) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of the suspects topic, (key, value) in log order, read to the end offsets taken
    at the start; ``Unavailable`` when the broker is not reachable or the read passes ``timeout_s``."""
    from kafka import KafkaConsumer, TopicPartition

    deadline = time.monotonic() + timeout_s
    if not tcp_reachable(kafka, timeout=min(1.0, timeout_s)):
        raise Unavailable(f"no broker of {kafka.bootstrap} accepts connections")
    ms = max(100, int(timeout_s * 1000))
    kw = {**kafka.client_kwargs(), "request_timeout_ms": ms}
    try:
        consumer = KafkaConsumer(**kw, group_id=None, enable_auto_commit=False, client_id="cliffguard-admission",
                                 bootstrap_timeout_ms=ms, consumer_timeout_ms=ms)
    except Exception as exc:  # noqa: BLE001 - any client failure is "could not read"
        raise Unavailable(f"{type(exc).__name__}: {exc}") from None
    try:
        topic = kafka.suspects_topic
        parts = None
        while parts is None:
            parts = consumer.partitions_for_topic(topic)
            if parts is None:
                if time.monotonic() > deadline:
                    raise Unavailable(f"topic {topic} not found within {timeout_s:g} s")
                time.sleep(0.05)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[tuple[bytes | None, bytes | None]] = []
        while any(consumer.position(tp) < end[tp] for tp in tps):
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"read of {topic} not done within {timeout_s:g} s")
            for recs in consumer.poll(timeout_ms=max(1, int(min(left, 0.5) * 1000))).values():
                out.extend((r.key, r.value) for r in recs)
        return out
    except Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"{type(exc).__name__}: {exc}") from None
    finally:
        consumer.close(autocommit=False)


@dataclass(slots=True)
class Check:
    """What the check found: ``verdict`` None when it could not read the list (fail-open)."""

    node: str
    verdict: Verdict | None
    board: Board | None = None
    lines: list[str] = field(default_factory=list)
    """What the launcher prints (to stderr)."""
    seconds: float = 0.0

    @property
    def refused(self) -> bool:
        return self.verdict is not None and not self.verdict.admitted

    def kept_slots(self, slots: tuple[int, ...]) -> tuple[int, ...]:
        """``slots`` less the device slots the list records suspect on this node (all, unchecked)."""
        if self.verdict is None:
            return slots
        out = {d["slot"] for d in self.verdict.devices_out}
        return tuple(x for x in slots if x not in out)


def check(kafka: KafkaConfig, node: str, key: VerifyingKey | None, timeout_s: float) -> Check:
    """Read the list and decide for ``node``; never raises for a broker that is away."""
    t0 = time.monotonic()
    if key is None:
        out = Check(node, None, lines=[
            "cliffguard train: WARNING: admission check skipped: no command key (public key or secret) to verify "
            f"the suspect-node list with; node {node} starts unchecked (the controller still refuses a suspect "
            "node at its first heartbeat)"])
        return out
    try:
        records = read_records(kafka, timeout_s)
    except Unavailable as exc:
        return Check(node, None, seconds=time.monotonic() - t0, lines=[
            f"cliffguard train: WARNING: admission check failed open: could not read the suspect-node list "
            f"({kafka.suspects_topic} on {kafka.bootstrap}): {exc}; node {node} starts UNCHECKED (the controller "
            "still refuses a suspect node at its first heartbeat)"])
    board = read_board(records, key)
    verdict = decide(board, node)
    out = Check(node, verdict, board, seconds=time.monotonic() - t0)
    if board.ignored:
        out.lines.append(f"cliffguard train: WARNING: {board.ignored} of {board.records} entries of the suspect-node "
                         f"list ignored (not signed by the controller's key): " + "; ".join(board.problems))
    if not verdict.admitted:
        out.lines.append(refusal_line(verdict))
    return out
