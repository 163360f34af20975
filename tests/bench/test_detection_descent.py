"""bench/detection_descent.py: the spike rule on a fast first descent (docs/detection.md)."""

from __future__ import annotations

from bench.detection_descent import CURVE, main, probe


def test_the_healthy_descent_is_never_flagged_and_a_blow_up_is_critical(capsys):
    lines = probe(10.0, [0.5])
    assert len(CURVE) == 66 and "flagged at no point" in lines[0]
    assert lines[1].rstrip().endswith("critical")
    assert main(["--probes", "0.1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4  # a header and one probe per budget
