"""bench.goodput: the stream it times books every second, and the figures it writes are there."""

from __future__ import annotations

import json

from bench.goodput import main, stream
from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.summary import summarize


def test_the_stream_books_every_second_and_the_bench_writes_its_figures(tmp_path):
    events = stream(2000)
    ledger = Ledger()
    for ev in events:
        ledger.on_event(ev)
    out = summarize(ledger)
    assert out["seconds"]["unknown"] < 1e-6 and out["rollbacks"] == 0 and out["redos"] == 0
    assert abs(out["booked_s"] - out["wall_s"]) < 1e-6
    path = tmp_path / "goodput.json"
    assert main(["--steps", "6000", "--repeat", "1", "--json", str(path)]) == 0
    got = json.loads(path.read_text())
    assert got["events"] > 6000 and got["us_per_event"] > 0 and got["state_bytes"] > 0
