"""The bundled trainer's own account of what it did: ``<run_dir>/trainer-record.jsonl``.

Rank 0 appends one JSON line per fact, flushed at once, so a killed run leaves every line it
wrote: ``start`` (the step it starts at, the steps it was asked for, its LR scale), ``command``
(each command dispatched: id, type, ack status, the step before and after, the LR scale before
and after), ``timeout`` (a hold or pause timeout's policy applied alone, with the same fields) and
``end`` (the step reached and why it stopped; after a preemption save, what ``run.preempted`` said). It does not go through Kafka, so it is the
trainer's side of the ledger a controller, its store and the topics can be checked against
(``python -m bench.soak`` does). Written only on those events, never per step.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import IO, Any

from cliffguard.agent.command_target import Outcome
from cliffguard.agent.recovery.timeouts import Timeout
from cliffguard.core.events import Command

log = logging.getLogger(__name__)

RECORD_NAME = "trainer-record.jsonl"
SAMPLES_NAME = "samples.jsonl"


class TrainerRecord:
    """Appends the record's lines; a write that fails is logged once and the run goes on."""

    def __init__(self, path: str | Path, lr_scale: float = 1.0) -> None:
        self.path = Path(path)
        self._lr_scale = lr_scale
        self._fh: IO[str] | None = None
        self._failed = False

    def _write(self, kind: str, **fields: Any) -> None:
        if self._failed:
            return
        try:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = self.path.open("a", encoding="utf-8")
            self._fh.write(json.dumps({"kind": kind, "ts": time.time(), **fields}, allow_nan=False) + "\n")
            self._fh.flush()
        except (OSError, ValueError) as exc:
            self._failed = True
            log.error("trainer record %s: cannot write (%s); no further lines", self.path, exc)

    def start(self, step: int, steps: int, lr_scale: float) -> None:
        self._lr_scale = lr_scale
        self._write("start", step=step, steps=steps, lr_scale=lr_scale)

    def command(
        self, cmd: Command, outcome: Outcome, step_before: int, step_after: int, lr_scale: float
    ) -> None:
        self._write(
            "command",
            id=cmd.id,
            type=str(cmd.type),
            status=str(outcome.status),
            detail=outcome.detail,
            step_before=step_before,
            step_after=step_after,
            lr_scale_before=self._lr_scale,
            lr_scale=lr_scale,
        )
        self._lr_scale = lr_scale

    def timeout(self, timeout: Timeout, step_before: int, step_after: int, lr_scale: float) -> None:
        self._write(
            "timeout",
            wait=timeout.wait,
            policy=timeout.policy,
            after_s=timeout.after_s,
            step_before=step_before,
            step_after=step_after,
            lr_scale_before=self._lr_scale,
            lr_scale=lr_scale,
        )
        self._lr_scale = lr_scale

    def end(self, step: int, stop_reason: str, lr_scale: float, preempted: dict[str, Any] | None = None) -> None:
        """``preempted``: the ``run.preempted`` payload of a run that saved for a preemption."""
        extra = {} if preempted is None else {"preempted": preempted}
        self._write("end", step=step, stop_reason=stop_reason, lr_scale=lr_scale, **extra)

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None


def last_end(path: str | Path, since: float = 0.0) -> dict[str, Any] | None:
    """The newest ``end`` line written at or after ``since`` (epoch s), or None. A torn or hand-edited
    line is skipped: the file is read as untrusted."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("kind") == "end" and isinstance(row.get("ts"), (int, float)):
            return row if row["ts"] >= since else None
    return None


class SampleLog(TrainerRecord):
    """``<run_dir>/samples.jsonl`` (``[train] sample_log``, for exactness checks): one line per step
    run, ``{"kind": "step", "step", "ids": [rank 0's ids, rank 1's, ...], "loss"[, "param_digest"]}``,
    appended across restarts, so a preempted and resumed run's lines can be compared with an
    uninterrupted run's (no sample repeated or skipped). Costs a line write per step: off by default."""

    def step(self, step: int, ids: list[list[int]], loss: float, param_digest: str | None = None) -> None:
        fields: dict[str, Any] = {"step": step, "ids": ids, "loss": loss if loss == loss else None}
        if param_digest is not None:
            fields["param_digest"] = param_digest
        self._write("step", **fields)
