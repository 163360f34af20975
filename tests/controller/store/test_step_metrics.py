"""The step-metric table (controller/store/step_metrics.py) against the payload, the model and the
read API: one table drives them all."""

import typing

from cliffguard.controller.store.models import StepMetricRow
from cliffguard.controller.store.read import RANK_COLUMNS
from cliffguard.controller.store.step_metrics import STEP_METRICS
from cliffguard.core.payloads import StepData

# step fields the store keeps in their own way: the loss (with its bucket min/max and non-finite
# kind), the guard's decision (a string), per-layer norms (JSON) and the sample range (data flags);
# the run-level event's loss summary (every rank's loss reaches the rows through ``ranks`` events)
# and the detail marker (detail rows are told apart by their guard decision, read.rank_detail); a
# triaged step's class (its verdict is stored whole with the run's evidence: step.triaged); the SDC
# watch's check (a disagreeing one is the sdc verdict's evidence, stored with its incident)
NOT_IN_TABLE = {"loss", "guard", "layer_grad_norms", "sample_range", "rank_losses", "detail", "triaged",
                "param_check"}


def test_every_step_field_is_stored_or_deliberately_left_out():
    fields = set(typing.get_type_hints(StepData))
    table = {m.name for m in STEP_METRICS}
    assert table | NOT_IN_TABLE == fields
    assert not table & NOT_IN_TABLE


def test_the_model_has_a_column_of_the_declared_type_per_metric():
    cols = StepMetricRow.__table__.columns
    for m in STEP_METRICS:
        assert isinstance(cols[m.name].type, m.sql_type), m.name
        assert cols[m.name].nullable is (m.default is None), m.name


def test_per_rank_columns_come_from_the_table():
    assert tuple(m.name for m in STEP_METRICS if m.per_rank) == RANK_COLUMNS
