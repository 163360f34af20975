"""The store's one read API: the dashboard, ``cliffguard status``, ``cliffguard backtest --run``
and the demo summary read the store through these functions only.

Every function takes an open ``Session`` (``with store.session() as s:``) and returns plain data:
``list[dict]`` whose keys are the model's column names (see ``controller.store.models``) unless a
docstring says otherwise, newest first for logs (incidents, commands, alerts) and oldest first for
curves and timelines. ``limit=None`` means all rows. Nothing here writes.

Which rank's rows speak for the run (the loss curve, the speaking rank's step rows, histograms)
follows ``core.ranks``: the lowest rank with rows.

Non-finite values come back as floats on both databases: a NaN loss reads as ``nan`` whether it
was stored as NaN (PostgreSQL) or as NULL plus ``nonfinite="nan"`` (SQLite); histogram and
per-layer values stored as "NaN"/"Infinity" strings in JSON come back as floats too.
"""

from cliffguard.controller.store.read._rows import speaker_rank
from cliffguard.controller.store.read.alerts import alert_endpoints, alerts, outbox_status
from cliffguard.controller.store.read.checkpoints import checkpoints
from cliffguard.controller.store.read.commands import audit_log, commands
from cliffguard.controller.store.read.curves import loss_curve, redone_steps, step_rows
from cliffguard.controller.store.read.data_stats import data_baseline, data_evidence, data_steps, data_windows
from cliffguard.controller.store.read.dlq import dlq_counts, dlq_runs
from cliffguard.controller.store.read.elastic import elastic_events, scale_timeline
from cliffguard.controller.store.read.evidence import evidence, hang_evidence
from cliffguard.controller.store.read.goodput import ettr_by_run, goodput, goodput_costs, remedy_costs
from cliffguard.controller.store.read.hists import grad_hists
from cliffguard.controller.store.read.incidents import incident_detail, incidents, transitions
from cliffguard.controller.store.read.preemptions import preemptions
from cliffguard.controller.store.read.ranks import (
    DETAIL_COLUMNS,
    RANK_COLUMNS,
    latest_rank_steps,
    rank_detail,
    rank_metrics,
)
from cliffguard.controller.store.read.requests import REQUEST_COLUMNS, recent_requests
from cliffguard.controller.store.read.rule_stats import STAT_COLUMNS, SpikeRuleStats, spike_rule_stats
from cliffguard.controller.store.read.runs import get_run, heartbeats, list_runs, liveness
from cliffguard.controller.store.read.suspects import SUSPECT_COLUMNS, suspect_nodes
from cliffguard.controller.store.read.validations import data_flags, validations

__all__ = [
    "preemptions",
    "SUSPECT_COLUMNS",
    "suspect_nodes",
    "DETAIL_COLUMNS",
    "RANK_COLUMNS",
    "REQUEST_COLUMNS",
    "STAT_COLUMNS",
    "SpikeRuleStats",
    "recent_requests",
    "spike_rule_stats",
    "alert_endpoints",
    "alerts",
    "audit_log",
    "checkpoints",
    "commands",
    "data_baseline",
    "data_evidence",
    "data_flags",
    "data_steps",
    "data_windows",
    "dlq_counts",
    "dlq_runs",
    "elastic_events",
    "evidence",
    "hang_evidence",
    "ettr_by_run",
    "goodput",
    "goodput_costs",
    "remedy_costs",
    "scale_timeline",
    "get_run",
    "grad_hists",
    "heartbeats",
    "liveness",
    "incident_detail",
    "incidents",
    "latest_rank_steps",
    "list_runs",
    "loss_curve",
    "outbox_status",
    "rank_detail",
    "rank_metrics",
    "redone_steps",
    "speaker_rank",
    "step_rows",
    "transitions",
    "validations",
]
