"""One polled batch -> one SQL transaction: derived rows, run state, outbox rows, offsets.

``BatchProcessor.process`` is called inside the caller's transaction and does, in order:

1. fence: the stored offset of every partition in the batch must equal where the batch starts,
   otherwise another instance already processed it (a partition moved under us) -> ``StaleBatch``;
2. dead letters -> ``dlq_counts`` and ``dlq_runs`` (per run, by the message key);
3. events -> derived rows (``store.ingest``), idempotent by event id; step rows wait for step 4;
4. per event not judged before (``controller/replays.py``: a re-read is recognised by id and
   skipped), booked on its run's goodput ledger in the log's order, then judged, node heartbeats
   and ``ranks`` arrays after the batch's other events (``batch_order.py``): the run's detector ->
   verdicts -> recovery inputs -> ``recovery.transition``; then the node heartbeats' rows;
5. actions -> incidents, transitions, signed command + outbox rows, alert + outbox rows, stable
   checkpoints, timed-out command rows;
6. the step rows, in one INSERT carrying what the loss-spike rule knew at each judged step
   (median, σ, level), which the dashboard draws as the loss bands, and the rule's settings on
   the run (once per loaded run: ``RunSlot.spike_rule``);
7. run states (``runs.controller_state``), the goodput ledgers (every event was booked on its
   run's ledger before step 4 saw it: ``controller/goodput/book.py``) and the consumer offsets.

Commands and alerts leave through the outbox after commit; a command may also be sent the moment
it is queued, through ``on_command`` (``CommandOutbox.send_early``: the verdict's latency path).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from cliffguard.controller.alerts import AlertsConfig, AlertSpec, enqueue_alert
from cliffguard.controller.batch_inputs import inputs_for
from cliffguard.controller.batch_order import BULK, judge_later
from cliffguard.controller.edge_classify import EdgeBatch
from cliffguard.controller.goodput.book import GoodputBook
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.operator import enqueue_command
from cliffguard.controller.rank_nodes import RankNodes
from cliffguard.controller.recovery import transition
from cliffguard.controller.recovery_budgets import limits_doc
from cliffguard.controller.recovery_types import (
    AckIn,
    ActionT,
    Alert,
    ClearSuspect,
    CloseIncident,
    FlagSamples,
    Input,
    MarkCommand,
    MarkStable,
    OpenIncident,
    RecordSuspect,
    RecordTransition,
    RecoveryConfig,
    SendCommand,
    TickIn,
    VerdictIn,
)
from cliffguard.controller.replays import JUDGED_ONCE, Replays
from cliffguard.controller.rules.loss import LossRules
from cliffguard.controller.runstate import Detector, RunSlot, RunTable, save_slots
from cliffguard.controller.store.dlq import count_dead_letters
from cliffguard.controller.store.heartbeats import upsert_heartbeats
from cliffguard.controller.store.ingest import acked_command, ingest_events, ingest_steps, record_rule_stats
from cliffguard.controller.store.models import (
    CheckpointRow,
    CommandRow,
    ConsumerOffsetRow,
    DataFlagRow,
    IncidentRow,
    RunRow,
    TransitionRow,
)
from cliffguard.controller.store.offsets import save_offsets
from cliffguard.controller.store.rank_nodes import save_rank_nodes
from cliffguard.controller.store.retention import RetentionConfig, downsample_due, run_watermarks
from cliffguard.controller.suspects import SuspectIndex
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event
from cliffguard.core.floats import to_json
from cliffguard.core.signing import SigningKey

log = logging.getLogger(__name__)

_LEVEL_TEXT = {level: str(level) for level in Level}
_OK = Level.OK  # an enum member read through its class costs ~10x a module global
_STEP = EventType.STEP
MAX_FLAGGED_SAMPLES = 100_000


_STORED_OFFSETS = (select(ConsumerOffsetRow.topic, ConsumerOffsetRow.partition, ConsumerOffsetRow.offset)
                   .where(ConsumerOffsetRow.group_id == bindparam("group"),
                          ConsumerOffsetRow.topic.in_(bindparam("topics", expanding=True)))
                   .with_for_update())
"""The fence's read of a batch's stored offsets, locked (built once: it runs with every batch)."""


_HEARTBEAT = EventType.HEARTBEAT


class StaleBatch(RuntimeError):
    """The store is ahead of this batch for a partition: another instance processed it."""

    def __init__(self, topic: str, partition: int, stored: int, start: int) -> None:
        super().__init__(f"{topic}[{partition}]: store is at offset {stored}, batch starts at {start}")
        self.topic = topic
        self.partition = partition
        self.stored = stored


@dataclass(slots=True)
class BatchContext:
    group_id: str
    commands_topic: str
    secret: SigningKey
    recovery: RecoveryConfig
    alerts: AlertsConfig
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """Step-metric downsampling, applied to each touched run inside the batch's transaction."""
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """The goodput ledgers (``controller/goodput``), fed every event and saved with the batch."""


@dataclass(slots=True)
class BatchResult:
    events: int = 0
    dead: int = 0
    commands: int = 0
    alerts: int = 0
    transitions: list[tuple[str, str, str]] = field(default_factory=list)
    replays: int = 0
    """Events of the batch judged before (re-read): stored once, not judged again."""


def _loss_rules(detector: Detector) -> LossRules | None:
    rules = getattr(detector, "loss", None)  # RunDetector's; a test's stand-in detector may have none
    return rules if isinstance(rules, LossRules) else None


class BatchProcessor:
    def __init__(self, ctx: BatchContext, runs: RunTable) -> None:
        self.ctx = ctx
        self.runs = runs
        self.goodput = GoodputBook(ctx.goodput, ctx.alerts)
        self.suspects = SuspectIndex()
        """The suspect-node store as the edge checks beats against it (controller/suspects.py)."""
        self._limits = limits_doc(ctx.recovery)
        """The recovery rungs' limits, stored with each run's state (what status and the dashboard show)."""
        self.rank_nodes = RankNodes()
        """Each run's ranks' nodes by its node heartbeats, for a persistent SDC (controller/rank_nodes.py)."""
        self.on_command: Callable[[Session, str], object] | None = None
        """Called with (session, command id) as soon as a command is queued, inside the batch's
        transaction: the service sends it then (``CommandOutbox.send_early``), not after commit."""

    # -- the batch ----------------------------------------------------------------------------

    def process(self, session: Session, batch: EdgeBatch, now: float) -> BatchResult:
        res = BatchResult(events=len(batch.records), dead=len(batch.dead))
        self._fence(session, batch)
        count_dead_letters(session, batch.dead, now)  # per topic and per run, by reason
        self.suspects.refresh(session, now)  # the nodes not admitted (a read every REFRESH_S at most)
        events = [r.event for r in batch.records]
        replays = self._replays(session, batch)  # before anything of this batch is written
        # the step rows go in below, with the rule's figures; the node heartbeats' rows after the verdicts
        ingest_events(session, events, steps=False, node_beats=False)
        newest: dict[str, int] = {}
        points: dict[str, dict[str, Any]] = {}  # step event id -> what the spike rule knew there
        exact: set[str] = set()  # step events judged or in an incident: their rows stay one per step
        # run id -> (its slot, its loss rules, the partition it was seen on): looked up once per run
        runs: dict[str, tuple[RunSlot, LossRules | None, int]] = {}
        later = judge_later(batch.records)
        deferred: list[tuple[Event, RunSlot, LossRules | None]] = []
        for rec in batch.records:
            ev = rec.event
            run = ev.run
            known = runs.get(run)
            if known is None or known[2] != rec.partition:
                slot = self.runs.get(session, run, rec.partition)
                known = runs[run] = (slot, _loss_rules(slot.detector), rec.partition)
                slot.dirty = True
            if ev.type is _HEARTBEAT:
                self.rank_nodes.seen(ev)  # before any verdict of the batch (a beat may be judged later)
            if ev.step > newest.get(run, 0):
                newest[run] = ev.step
            elif run not in newest:
                newest[run] = 0
            slot, loss, _ = known
            if ev.type in JUDGED_ONCE:
                if replays.seen(ev):
                    continue  # judged before: its effects happened then (the row is there, or folded)
                replays.judged(ev)
                if ev.ts > slot.judged_ts:
                    slot.judged_ts = ev.ts
            # booked in the log's order (a heartbeat between two steps is a sign of life in their gap)
            res.alerts += self.goodput.on_event(session, slot, ev, now)  # before recovery: the incident open until now
            if later and ev.type in BULK:
                deferred.append((ev, slot, loss))  # judged after the batch's urgent events
                continue
            self._judge(session, slot, loss, ev, now, points, exact, res)
        for ev, slot, loss in deferred:
            self._judge(session, slot, loss, ev, now, points, exact, res)
        upsert_heartbeats(session, [ev for ev in events if ev.type is _HEARTBEAT and ev.data.get("ranks") is not None])
        touched = [known[0] for known in runs.values()]
        marks = run_watermarks(session, newest)  # one read, for the step rows and for retention
        ingest_steps(session, events, points, watermarks=marks, write_bucket=self.ctx.retention.write_bucket,
                     exact=exact)
        rules: dict[str, Any] = {}  # run id -> the spike rule's settings it judged with, where not stored yet
        for slot, loss, _ in runs.values():
            if loss is not None and loss.last_point is not None and slot.spike_rule is not loss.spike_config:
                rules[slot.run_id] = asdict(loss.spike_config)
                slot.spike_rule = loss.spike_config
        record_rule_stats(session, [], rules)
        save_slots(session, [s for s in touched if s.dirty], known=marks.keys(), budget_limits=self._limits)
        self._save_rank_nodes(session, now)  # only runs whose ranks' nodes changed (controller/rank_nodes.py)
        self.goodput.save(session, touched, now)
        # folds old steps into buckets for the runs where enough have aged
        downsample_due(session, newest, self.ctx.retention, watermarks=marks)
        save_offsets(session, self.ctx.group_id, batch.next_offsets, now=now)
        res.replays = replays.count
        if replays.count:
            log.info("%d events of this batch were judged before (re-read); stored once, not judged again",
                     replays.count)
        return res

    def _judge(self, session: Session, slot: RunSlot, loss: LossRules | None, ev: Event, now: float,
               points: dict[str, dict[str, Any]], exact: set[str], res: BatchResult) -> None:
        """One event through the run's detector and its verdicts into the recovery machine."""
        before = loss.last_point if loss is not None else None
        try:
            verdicts = slot.detector.on_event(ev)
        except Exception:  # noqa: BLE001 - a rule bug must not stop the other runs
            log.exception("detector failed on %s event of run %s step %d", ev.type, ev.run, ev.step)
            verdicts = []
        level = None
        if loss is not None:
            p = loss.last_point
            if p is not None and p is not before:
                points[ev.id] = {"median": p.median, "sigma": p.sigma, "level": _LEVEL_TEXT[p.level]}
                level = p.level
        for inp in inputs_for(ev, verdicts, now, level):
            if type(inp) is AckIn:
                row = acked_command(session, ev)
                if row is None:
                    continue  # an unknown command, or another run's: it must not move this run
                inp = replace(inp, args=dict(row.args or {}))  # an operator's lr_scale, for the machine
            self._feed(session, slot, self.rank_nodes.annotate(slot.run_id, self.suspects.annotate(inp)), res)
        if ev.type is _HEARTBEAT:  # a suspect node's beat: it is not admitted (controller/suspects.py)
            for inp in self.suspects.inputs(ev, now):
                self._feed(session, slot, inp, res)
        if verdicts or (level is not None and level is not _OK) or slot.recovery.incident is not None:
            exact.add(ev.id)  # a step row that write_bucket must not fold away

    def _save_rank_nodes(self, session: Session, now: float) -> None:
        changed = self.rank_nodes.unsaved()
        if not changed:
            return
        stored = set(session.scalars(select(RunRow.id).where(RunRow.id.in_(list(changed)))))
        for run, ranks in changed.items():
            if run in stored:  # a run whose row a skipped event never wrote keeps its map in memory
                save_rank_nodes(session, run, ranks, now)

    def _replays(self, session: Session, batch: EdgeBatch) -> Replays:
        slots: dict[str, float] = {}

        def judged_ts(run: str, partition: int) -> float:
            ts = slots.get(run)
            if ts is None:
                ts = slots[run] = self.runs.get(session, run, partition).judged_ts
            return ts

        return Replays(session, ((r.event, r.partition) for r in batch.records), judged_ts)

    def tick(self, session: Session, now: float) -> BatchResult:
        """Time passes for every owned run: heartbeat-loss verdicts and command timeouts."""
        res = BatchResult()
        for slot in list(self.runs.slots.values()):
            try:
                verdicts = slot.detector.tick(now)
            except Exception:  # noqa: BLE001
                log.exception("detector tick failed for run %s", slot.run_id)
                verdicts = []
            before = (slot.recovery.phase, slot.recovery.seq)
            for inp in [*(VerdictIn(verdict=v, now=now) for v in verdicts), TickIn(now=now)]:
                self._feed(session, slot, inp, res)
            if verdicts or (slot.recovery.phase, slot.recovery.seq) != before:
                slot.dirty = True
        save_slots(session, [s for s in self.runs.slots.values() if s.dirty], budget_limits=self._limits)
        return res

    def _fence(self, session: Session, batch: EdgeBatch) -> None:
        starts: dict[tuple[str, int], int] = {}
        for item in [*batch.records, *batch.dead]:
            key = (item.topic, item.partition)
            starts[key] = min(starts.get(key, item.offset), item.offset)
        if not starts:
            return
        rows = session.connection().execute(_STORED_OFFSETS, {"group": self.ctx.group_id,
                                                               "topics": sorted({t for t, _ in starts})}).all()
        for topic, partition, stored in rows:
            start = starts.get((topic, partition))
            # stored < start is a gap in the log (e.g. transaction markers), not a competitor
            if start is not None and stored > start:
                raise StaleBatch(topic, partition, stored, start)

    # -- one input ----------------------------------------------------------------------------

    def _feed(self, session: Session, slot: RunSlot, inp: Input, res: BatchResult) -> None:
        slot.recovery, actions = transition(self.ctx.recovery, slot.recovery, inp)
        for act in actions:
            self._apply(session, slot, act, inp, res)

    def _apply(self, session: Session, slot: RunSlot, act: ActionT, inp: Input, res: BatchResult) -> None:
        run_id = slot.run_id
        now = getattr(inp, "now", 0.0)
        if isinstance(act, SendCommand):
            row = enqueue_command(session, run_id=run_id, type=act.type, args=act.args, secret=self.ctx.secret,
                                  commands_topic=self.ctx.commands_topic, ttl_s=act.ttl_s, source="controller",
                                  incident_id=act.incident_id, cmd_id=act.id, attempt=act.attempt, now=now)
            res.commands += 1
            if self.on_command is not None:
                self.on_command(session, row.id)
        elif isinstance(act, RecordTransition):
            session.add(TransitionRow(run_id=run_id, incident_id=act.incident_id, ts=act.ts, step=act.step,
                                   from_state=str(act.from_state), to_state=str(act.to_state),
                                   reason=f"{act.trigger}: {act.reason}", evidence=to_json(act.evidence)))
            res.transitions.append((run_id, str(act.from_state), str(act.to_state)))
            log.info("run %s: %s -> %s (%s)", run_id, act.from_state, act.to_state, act.reason)
        elif isinstance(act, OpenIncident):
            session.add(IncidentRow(id=act.id, run_id=run_id, opened_at=act.opened_at, rule=act.rule, level=act.level,
                                 spike_step=act.spike_step, onset_step=act.onset_step, outcome="open",
                                 evidence=to_json(act.evidence)))
            session.flush()  # no ORM relationships: the incident row must exist before rows naming it
        elif isinstance(act, CloseIncident):
            row = session.get(IncidentRow, act.id)
            if row is not None:
                row.outcome = act.outcome
                row.closed_at = act.closed_at
                row.rollback_to = act.rollback_to
                row.lr_scale = act.lr_scale
                if act.lr_scales or act.escalation:  # every cut of the LR, and the rung: shown with the incident
                    row.evidence = {**(row.evidence or {}), "lr_scales": list(act.lr_scales),
                                    "escalation_rung": act.escalation}
        elif isinstance(act, Alert):
            spec = AlertSpec(rule=act.rule[:64], level=act.level, title=act.title, body=act.body, run_id=run_id,
                             incident_id=act.incident_id, action=act.action, evidence=act.evidence)
            enqueue_alert(session, spec, self.ctx.alerts, now)
            res.alerts += 1
        elif isinstance(act, MarkStable):
            session.execute(update(CheckpointRow)
                            .where(CheckpointRow.run_id == run_id, CheckpointRow.step == act.step)
                            .values(stable=True, stable_reason=act.reason))
        elif isinstance(act, FlagSamples):
            ids = [i for a, b in act.ranges for i in range(a, b)][:MAX_FLAGGED_SAMPLES]
            session.add(DataFlagRow(run_id=run_id, step=act.step, ts=now, rule="transient_spike", score=act.score,
                                 sample_ids=ids))
        elif isinstance(act, (RecordSuspect, ClearSuspect)):
            self.suspects.apply(session, run_id, act)
        elif isinstance(act, MarkCommand):
            session.execute(update(CommandRow).where(CommandRow.id == act.id, CommandRow.acked_at.is_(None))
                            .values(status=act.status, ack_detail=act.detail))
        else:  # pragma: no cover - the action union is closed
            raise TypeError(f"unknown action {act!r}")

