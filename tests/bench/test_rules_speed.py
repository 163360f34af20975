"""bench.rules_speed --only state: the packed saves hold the same windows in fewer bytes."""

from __future__ import annotations

import json

from bench.rules_speed import main


def test_state_row_compares_packed_and_list_saves(tmp_path):
    out = tmp_path / "state.json"
    assert main(["--only", "state", "--ranks", "64", "--chunk", "16", "--warm", "200", "--repeat", "1",
                 "--json", str(out)]) == 0
    state = json.loads(out.read_text())["state"]
    assert set(state) == {"mix", "noise"}
    for rows in state.values():
        for rule in ("straggler", "mfu", "memory"):
            assert rows[rule]["packed"]["bytes"] < rows[rule]["lists"]["bytes"]
        assert rows["total"]["packed"]["bytes"] == sum(rows[r]["packed"]["bytes"] for r in ("straggler", "mfu", "memory"))
