"""The data-quality page's data: a ``cliffguard data`` report and manifest as frames (pure).

Both files come from disk, so they are checked before use: anything that is not the shape
``cliffguard/data/manifest.py`` writes is a ``DataFileError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd


class DataFileError(ValueError):
    pass


def load_json(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFileError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise DataFileError(f"{path}: expected a JSON object")
    return doc


def report_counts(report: dict[str, Any]) -> dict[str, int]:
    """documents / kept / removed / skipped, as the page's metrics."""
    skipped = sum(int((report.get(k) or {}).get("count", 0)) for k in ("skipped_binary", "skipped_unreadable"))
    return {"documents": int(report.get("documents", 0)), "kept": int(report.get("kept", 0)),
            "removed": int(report.get("removed", 0)), "skipped": skipped}


def reasons_frame(report: dict[str, Any]) -> pd.DataFrame:
    reasons = report.get("reasons") or {}
    return pd.DataFrame({"reason": list(reasons), "documents": [int(v) for v in reasons.values()]},
                        columns=["reason", "documents"])


def clusters_frame(report: dict[str, Any]) -> pd.DataFrame:
    rows = [{"kept": c.get("kept"), "removed": len(c.get("removed") or []),
             "examples": ", ".join(Path(p).name for p in (c.get("removed") or [])[:3])}
            for c in ((report.get("dedup") or {}).get("clusters") or [])]
    return pd.DataFrame(rows, columns=["kept", "removed", "examples"])


def contamination_frame(report: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame(report.get("contamination") or [])


def curriculum_frame(manifest: dict[str, Any]) -> pd.DataFrame:
    """One row per (phase, category): the phase's span of training [start, until) and the category's
    weight in it (a category a phase does not name keeps weight 1)."""
    cur = manifest.get("curriculum")
    if not cur:
        return pd.DataFrame(columns=["phase", "start", "until", "category", "weight"])
    if not isinstance(cur, dict) or not isinstance(cur.get("phases"), list):
        raise DataFileError("manifest: curriculum.phases must be a list")
    categories = sorted({*(cur.get("categories") or {}), cur.get("default") or "default"})
    rows, start = [], 0.0
    for i, phase in enumerate(cur["phases"]):
        until = float(phase["until"])
        weights = phase.get("weights") or {}
        rows += [{"phase": i + 1, "start": start, "until": until, "category": c, "weight": float(weights.get(c, 1.0))}
                 for c in categories]
        start = until
    return pd.DataFrame(rows, columns=["phase", "start", "until", "category", "weight"])


def weights_frame(manifest: dict[str, Any]) -> pd.DataFrame:
    """Kept documents' sampling weights by category (for a histogram)."""
    docs = manifest.get("documents")
    if not isinstance(docs, list):
        raise DataFileError("manifest: documents must be a list")
    rows = [{"category": d.get("category") or "default", "weight": float(d.get("weight", 1.0))}
            for d in docs if d.get("kept")]
    return pd.DataFrame(rows, columns=["category", "weight"])
