"""Curriculum: document categories from path globs and per-phase mixture weights.

A spec is JSON (inline or a file path)::

    {"categories": {"code": ["**/*.py"], "docs": ["**/*.md", "**/*.rst"]},
     "default": "other",
     "phases": [{"until": 0.3, "weights": {"docs": 1.0, "other": 1.0, "code": 0.3}},
                {"until": 1.0, "weights": {"code": 1.0, "docs": 0.5, "other": 0.5}}]}

``until`` is the fraction of total training steps where a phase ends (increasing, the last 1.0);
a category missing from a phase's weights gets 1.0. The trainer's sampler (trainer/data.py)
multiplies a sample's weight by its category's weight in the phase of the current step.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(kw_only=True, slots=True)
class Curriculum:
    categories: dict[str, list[str]] = field(default_factory=dict)
    default: str = "other"
    phases: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, globs in self.categories.items():
            if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
                raise ValueError(f"categories: {name!r} must map to a list of glob strings")
        last = 0.0
        for i, ph in enumerate(self.phases):
            until = ph.get("until") if isinstance(ph, dict) else None
            if not isinstance(until, int | float) or not last < until <= 1.0:
                raise ValueError(f"phases: phase {i} needs an 'until' in ({last}, 1]")
            weights = ph.get("weights", {})
            if not isinstance(weights, dict) or any(not isinstance(v, int | float) or v < 0 for v in weights.values()):
                raise ValueError(f"phases: phase {i} weights must be non-negative numbers")
            known = {*self.categories, self.default}
            if unknown := sorted(set(weights) - known):
                raise ValueError(f"phases: phase {i} names unknown categories {unknown}")
            last = float(until)
        if self.phases and last != 1.0:
            raise ValueError("phases: the last phase must end at until=1.0")

    def category(self, relpath: str) -> str:
        for name, globs in self.categories.items():
            for g in globs:
                if fnmatch.fnmatch(relpath, g) or (g.startswith("**/") and fnmatch.fnmatch(relpath, g[3:])):
                    return name
        return self.default

    def to_json(self) -> dict:
        return {"categories": self.categories, "default": self.default, "phases": self.phases}


def parse_curriculum(spec: str) -> Curriculum:
    """A Curriculum from inline JSON or a JSON file; errors name the spec."""
    text = spec
    if not spec.lstrip().startswith("{"):
        if not Path(spec).is_file():
            raise ValueError(f"curriculum: {spec!r} is neither inline JSON nor an existing file")
        text = Path(spec).read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"curriculum: {spec!r} is not valid JSON ({exc.msg})") from None
    if not isinstance(raw, dict) or set(raw) - {"categories", "default", "phases"}:
        raise ValueError(f"curriculum: {spec!r} must be an object with categories/default/phases")
    return Curriculum(**raw)
