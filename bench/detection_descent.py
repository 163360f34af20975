"""The spike rule on a fast first descent: how far a loss must rise before it counts (docs/detection.md).

    python -m bench.detection_descent [--probes 0.05,0.1,0.18,0.5]

``CURVE`` is the loss of the tiny GPT-2 of ``tests/agent/test_integrations_hf.py`` (the same model,
seed, data and LR, its corrupted batches at steps 40-42 skipped by the guard and replayed: the
healthy points only), recorded here on 2026-12-05: 3.28 -> 0.022 in 66 steps. The rule's level is
the median of its window, which on such a descent sits far above the newest points. Each probe
is judged as the loss of step 66, after the whole curve, at the guard's budget and at the
controller's (the defaults of ``SpikeConfig``), and the table shows the level, σ, σ above the
level and the verdict: a probe several times the newest points' level that reads healthy is the
shortfall the docs describe. Re-run it after changing how the level is taken.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from statistics import median

from cliffguard.core.spike import SpikeConfig, SpikeDetector

CURVE = (
    3.276585, 2.815972, 2.550438, 2.515308, 2.147246, 2.144686, 1.952988, 1.945378, 1.812787, 1.643046,
    1.409007, 1.373854, 1.130449, 1.052628, 0.933692, 0.817245, 0.76632, 0.731766, 0.637641, 0.597401,
    0.538366, 0.481766, 0.431614, 0.37543, 0.339872, 0.292633, 0.250057, 0.222277, 0.194842, 0.18712,
    0.159952, 0.13676, 0.12919, 0.096212, 0.094249, 0.082902, 0.074477, 0.071465, 0.059334, 0.048845,
    0.049595, 0.053481, 0.046414, 0.040498, 0.04002, 0.046766, 0.039573, 0.037309, 0.041184, 0.03534,
    0.034508, 0.034664, 0.03354, 0.029305, 0.028046, 0.027105, 0.028117, 0.025097, 0.025326, 0.022922,
    0.023569, 0.024896, 0.023069, 0.020824, 0.021142, 0.021777,
)


def probe(budget: float, losses: list[float]) -> list[str]:
    """One line per probe: the rule's view of it as the next point after ``CURVE``."""
    det = SpikeDetector(dataclasses.replace(SpikeConfig(), budget=budget))
    flagged = [i for i, x in enumerate(CURVE) if str(det.observe(x).level) != "ok"]
    recent = median(CURVE[-10:])
    out = [f"budget {budget:g}: healthy curve flagged at {flagged or 'no point'}; newest 10 points' median {recent:.4f}"]
    for loss in losses:
        v = copy.deepcopy(det).observe(loss)
        out.append(f"  loss {loss:<6g} ({loss / recent:4.1f}x recent)  level {v.median:.4f}  σ {v.sigma:.4f}  "
                   f"{v.sigmas:+5.1f}σ  {v.level}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.detection_descent", description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", default="0.05,0.1,0.18,0.5", help="losses judged as step 66")
    args = p.parse_args(argv)
    losses = [float(x) for x in args.probes.split(",") if x]
    cfg = SpikeConfig()
    for budget in (cfg.guard_budget, cfg.budget):
        print("\n".join(probe(budget, losses)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
