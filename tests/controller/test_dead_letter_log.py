"""The controller's dead-letter log, rate-limited (controller/dead_letter_log.py): per reason, the
first in full, then one line per window with the count and the runs; a quiet window closes."""

from __future__ import annotations

import logging

from cliffguard.controller.dead_letter_log import DeadLetterLog
from cliffguard.controller.edge_classify import DeadLetter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _letters(n: int, reason: str = "unsigned", run: bytes = b"r1") -> list[DeadLetter]:
    return [DeadLetter(reason, f"$: {reason} event {i}", "p.metrics", 0, i, b"{}", run) for i in range(n)]


def test_a_stream_of_dead_letters_is_one_line_then_one_count_per_window(caplog):
    clock = Clock()
    dlog = DeadLetterLog(window_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="cliffguard.controller.edge"):
        dlog.note(_letters(30))
        clock.now = 30.0
        dlog.flush()  # the window is still open: nothing yet
        dlog.note(_letters(21, run=b"r2"))
        clock.now = 61.0
        dlog.flush()
        dlog.flush()  # a second flush in the same new window says nothing
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert (
        lines[0]
        == "dead letter p.metrics[0]@0: unsigned: $: unsigned event 0 (more of unsigned are counted for 60 s)"
    )
    assert lines[1].startswith("50 more dead letters unsigned in the last 61 s (runs: r1 x29, r2 x21)")
    assert lines[1].endswith("newest: $: unsigned event 20")


def test_reasons_are_counted_apart_and_a_quiet_window_closes(caplog):
    clock = Clock()
    dlog = DeadLetterLog(window_s=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="cliffguard.controller.edge"):
        dlog.note(_letters(1) + _letters(3, "clock_skew"))
        clock.now = 61.0
        dlog.flush()  # unsigned: nothing after its first; clock_skew: two more
        clock.now = 122.0
        dlog.flush()  # clock_skew's second window ended empty: closed
        dlog.note(_letters(1))  # a fresh window: in full again
        dlog.note(_letters(2, "clock_skew"))
        dlog.flush(final=True)  # at the close: what is counted, whatever the window
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "dead letter p.metrics[0]@0",
        "dead letter p.metrics[0]@0",
        "2 more dead letters clock_skew in the last 61 s (runs",
        "dead letter p.metrics[0]@0",
        "dead letter p.metrics[0]@0",
        "1 more dead letters clock_skew in the last 0 s (runs",
    ]
