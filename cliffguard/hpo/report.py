"""What the search prints: a line per finished trial, the summary, and the ``--json`` object."""

from __future__ import annotations

import math
from typing import Any


def _fmt_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def trial_line(trial: Any, best: float | None, total: int | None = None) -> str:
    """``trial 3/8  lr=... global_batch=16 ...  value 0.4213  best 0.4511`` (or ``PRUNED (why)``)."""
    state = trial.state.name
    of = f"/{total}" if total else ""
    if state == "COMPLETE":
        result = f"value {trial.value:.4f}"
    elif state == "PRUNED":
        result = "PRUNED" + (f" ({trial.user_attrs['pruned_reason']})" if "pruned_reason" in trial.user_attrs else "")
    else:
        result = state
    best_s = f"best {best:.4f}" if best is not None else "best -"
    return f"trial {trial.number}{of}  {_fmt_params(trial.params)}  {result}  {best_s}"


def importances(study: Any) -> dict[str, float]:
    """Parameter importances (fANOVA, Optuna's default); empty with fewer than two complete trials."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return {}
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}
    except (RuntimeError, ValueError):  # e.g. every complete trial has the same params
        return {}


def best_of(study: Any) -> Any | None:
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return study.best_trial if complete else None


def summary_text(study: Any, imps: dict[str, float]) -> str:
    best = best_of(study)
    lines = [f"study {study.study_name}: {len(study.trials)} trial(s), "
             + ", ".join(f"{n} {s}" for s, n in sorted(state_counts(study).items()))]
    if best is None:
        lines.append("no complete trial: no best parameters")
    else:
        lines.append(f"best trial {best.number} (run {best.user_attrs.get('run', '-')}): "
                     f"val-loss drop {best.value:.4f}")
        lines += [f"  {k:<14} {v:.6g}" if isinstance(v, float) else f"  {k:<14} {v}" for k, v in best.params.items()]
    if imps:
        lines.append("parameter importance:")
        lines += [f"  {k:<14} {v:6.3f}  {'#' * int(round(30 * v))}" for k, v in imps.items()]
    return "\n".join(lines)


def state_counts(study: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in study.trials:
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def summary_json(study: Any, imps: dict[str, float], storage: str, seconds: float) -> dict[str, Any]:
    best = best_of(study)
    return {
        "study": study.study_name,
        "storage": storage,
        "seconds": round(seconds, 2),
        "best": None if best is None else {"trial": best.number, "run": best.user_attrs.get("run"),
                                           "value": best.value, "params": best.params},
        "trials": [{"number": t.number, "state": t.state.name, "value": _finite(t.value), "params": t.params,
                    "run": t.user_attrs.get("run"), "pruned_reason": t.user_attrs.get("pruned_reason")}
                   for t in study.trials],
        "importances": imps,
    }
