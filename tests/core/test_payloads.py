"""Typed payloads (core/payloads.py): every type has one, and the tables derived from them."""

from typing import NotRequired, TypedDict

import pytest

from cliffguard.core.enums import CheckpointKind, CommandType, EventType, TrainerMode
from cliffguard.core.events import COMMAND_ARG_SCHEMAS, DATA_SCHEMAS, SchemaError, make_event
from cliffguard.core.payloads import COMMAND_ARGS, EVENT_PAYLOADS, HistLayer, StepData, schema_of


def test_every_event_and_command_type_has_a_payload():
    assert set(EVENT_PAYLOADS) == set(EventType)
    assert set(COMMAND_ARGS) == set(CommandType)
    assert set(DATA_SCHEMAS) == set(EventType) and set(COMMAND_ARG_SCHEMAS) == set(CommandType)


def test_schema_of_maps_annotations_and_not_required():
    schema = schema_of(StepData)
    assert schema["loss"] == (float, True)
    assert schema["layer_grad_norms"] == (("map", float), False)
    assert schema["sample_range"] == (("list", int), False)
    assert schema_of(HistLayer)["numel"] == (int, False)
    assert DATA_SCHEMAS[EventType.CHECKPOINT]["kind"] == (CheckpointKind, True)


def test_an_annotation_without_a_validator_is_refused():
    class Bad(TypedDict):
        when: NotRequired[complex]

    with pytest.raises(TypeError, match="no validation"):
        schema_of(Bad)


def test_heartbeat_state_is_a_trainer_mode():
    ev = make_event(EventType.HEARTBEAT, "r", 3, {"state": "held"})
    assert ev.data["state"] is TrainerMode.HELD
    with pytest.raises(SchemaError, match="data.state: 'dozing' is not one of"):
        make_event(EventType.HEARTBEAT, "r", 3, {"state": "dozing"})
