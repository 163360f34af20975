"""SQLAlchemy 2.0 models: everything the controller decides, and what the dashboard reads.

Portable across SQLite and PostgreSQL: generic types only (JSON, not JSONB; String ids). Floats
that may be non-finite (a NaN loss is exactly what we must record) are stored as-is in REAL/
DOUBLE columns on PostgreSQL; SQLite turns NaN into NULL, so rows also carry ``nonfinite``
(a short text, "nan"/"inf"/"-inf" for the loss) to keep the fact. JSON columns never hold NaN
(encoders use ``core.events.to_json`` first) because PostgreSQL's JSON rejects it.

The tables live by family in ``models_runs``, ``models_recovery``, ``models_delivery`` and
``models_fleet``; this module names them all, for importers, Alembic and ``Base.metadata``.

Schema changes go through Alembic migrations in ``controller/store/migrations``.
"""

from __future__ import annotations

from cliffguard.controller.store.models_base import NAMING_CONVENTION, Base
from cliffguard.controller.store.models_delivery import (
    AlertEndpointStateRow,
    AlertRow,
    ConsumerOffsetRow,
    DlqCountRow,
    DlqRunRow,
    OutboxRow,
)
from cliffguard.controller.store.models_fleet import (
    ElasticEventRow,
    GoodputCostRow,
    GoodputRow,
    RankNodeRow,
    SuspectNodeRow,
)
from cliffguard.controller.store.models_recovery import (
    AuditRow,
    CheckpointRow,
    CommandRequestRow,
    CommandRow,
    EvidenceRow,
    IncidentRow,
    TransitionRow,
    ValidationRow,
)
from cliffguard.controller.store.models_runs import (
    DataFlagRow,
    DataStatsRow,
    GradHistRow,
    HeartbeatRow,
    RankArrayRow,
    RuleStateRow,
    RunRow,
    StepMetricRow,
)

__all__ = [
    "NAMING_CONVENTION",
    "Base",
    "RunRow",
    "StepMetricRow",
    "GradHistRow",
    "HeartbeatRow",
    "RankArrayRow",
    "RuleStateRow",
    "IncidentRow",
    "TransitionRow",
    "CommandRow",
    "AuditRow",
    "CommandRequestRow",
    "CheckpointRow",
    "ValidationRow",
    "DataFlagRow",
    "DataStatsRow",
    "ElasticEventRow",
    "EvidenceRow",
    "AlertRow",
    "OutboxRow",
    "AlertEndpointStateRow",
    "ConsumerOffsetRow",
    "DlqCountRow",
    "GoodputRow",
    "GoodputCostRow",
    "DlqRunRow",
    "SuspectNodeRow",
    "RankNodeRow",
]
