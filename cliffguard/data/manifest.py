"""The manifest the trainer reads (per-document weights, phases) and the report, as JSON.

Manifest::

    {"version": 1, "root": "/abs/corpus",
     "documents": [{"path": "/abs/file", "kept": true, "weight": 0.8, "category": "code",
                    "reasons": [{"reason": "perplexity", ...}]}, ...],
     "curriculum": {"categories": {...}, "default": "other", "phases": [...]},
     "perplexity_model": {"path": "/abs/manifest.lm.npz", "median": 4.2},
     "live_reweight": {"floor": 0.25, "sources": {"web": {"floor": 0.1}}}}

``perplexity_model`` (written by ``cliffguard data``) names the byte-trigram reference model the
pass scored documents with (trainer/byte_lm.py) and the median document perplexity; the trainer's
data watch scores each batch with it. ``live_reweight`` (``--live-reweight-floor``) declares how far the
trainer's live reweighting may lower each category (trainer/reweight.py). A removed document has ``kept: false`` and weight 0. trainer/data.py reads this format (it
cannot import this package), so a change here is a change there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_VERSION = 1


@dataclass(slots=True)
class DocEntry:
    path: str
    category: str
    kept: bool = True
    weight: float = 1.0
    reasons: list[dict[str, Any]] = field(default_factory=list)

    def lower(self, weight: float, reason: dict[str, Any]) -> None:
        """Multiply in a weight < 1 with its reason (weights from independent checks compound)."""
        self.weight = round(self.weight * weight, 4)
        self.reasons.append({**reason, "weight": weight})

    def remove(self, reason: dict[str, Any]) -> None:
        self.kept = False
        self.weight = 0.0
        self.reasons.append(reason)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "kept": self.kept, "weight": self.weight, "category": self.category,
                "reasons": self.reasons}


def manifest_json(root: str, docs: list[DocEntry], curriculum: dict[str, Any]) -> dict[str, Any]:
    return {"version": MANIFEST_VERSION, "root": root, "documents": [d.to_json() for d in docs],
            "curriculum": curriculum}


def write_json(path: str | Path, obj: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
