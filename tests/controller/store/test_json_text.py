"""controller/store/json_text.py: orjson's text only where it reads back as the standard text does."""

from __future__ import annotations

import json
import math

from cliffguard.controller.store.json_text import column_json, orjson_text


def test_orjson_text_is_used_only_for_values_that_read_back_equal():
    assert json.loads(orjson_text({"w": [0.1 + 0.2, 1e-7, -0.0], "n": None, "t": "é"})) == {
        "w": [0.1 + 0.2, 1e-7, -0.0], "n": None, "t": "é"}
    for unfaithful in ({"x": float("nan")}, [float("inf")], {"p": (1, 2)}, {1: 2.0}, [2**70]):
        assert orjson_text(unfaithful) is None, unfaithful


def test_column_json_reads_back_as_sqlalchemys_default_serializer_wrote_it():
    for obj in ({"w": [1.5, 2.25], "k": "v"}, {"p": (1, 2)}, {1: 2.0}, [2**70]):
        assert json.loads(column_json(obj)) == json.loads(json.dumps(obj))
    back = json.loads(column_json({"x": float("nan"), "y": float("-inf")}))  # json.dumps's NaN literal, as before
    assert math.isnan(back["x"]) and back["y"] == -math.inf
