"""The invariants about health (pure): no command stuck or unknown to the store, no gap in storing
after the faults, no traceback in any log, the controller's exits only the ones the soak caused."""

from __future__ import annotations

from bench.soak.ledger import longest_stall, overlap_s
from bench.soak.observed import Check, Observed
from bench.soak.tracebacks import find

STUCK_BOUND_S = 60.0
"""A command may wait this long for the broker's ack outside fault time (the outbox's longest
backoff between tries); longer is stuck."""
GAP_BOUND_S = 20.0
"""After the last fault ended, the store may stand still this long while the trainer is ahead
(a restarted controller's group join and catch-up); longer is a gap."""
DELIVERY_TARGETS = ("controller", "broker", "store")
"""Faults that may rightly hold a command back (a stopped rank does not)."""


def commands_stuck(o: Observed, c: Check) -> None:
    windows = [(a, b) for _, target, a, b in o.fault_windows if target in DELIVERY_TARGETS]
    for cmd in o.store["commands"]:
        box = o.store["outbox"].get(cmd["id"])
        if box is None:
            continue
        done = box["delivered_at"] if box["status"] == "delivered" else min(cmd["expires_at"], o.ended_at)
        waited = done - box["created_at"] - overlap_s(box["created_at"], done, windows)
        if waited > STUCK_BOUND_S:
            c.fail(
                1,
                f"command {cmd['id'][:12]} ({cmd['type']}) {box['status']} after {box['attempts']} "
                f"attempt(s): {waited:.0f}s outside faults without the broker's ack",
            )


def commands_unknown(o: Observed, c: Check) -> None:
    known = {r["id"] for r in o.store["commands"]}
    unknown = [cmd for cmd in o.commands_seen.values() if cmd["run"] == o.run and cmd["id"] not in known]
    for cmd in unknown:
        c.fail(1, f"command {cmd['id'][:12]} ({cmd['type']}) on the topic, unknown to the store")


def gap_after_faults(o: Observed, c: Check) -> None:
    since = max((b for *_, b in o.fault_windows), default=0.0)
    trainer = sorted(e["ts"] for e in o.events.values() if e["type"] == "step" and e["rank"] == 0 and e["ts"])
    stall, began = longest_stall(o.polls, trainer, since)
    if stall > GAP_BOUND_S and began is not None:
        c.fail(
            1,
            f"the store stood still {stall:.0f}s from {began - since:+.0f}s after the last fault "
            "while the trainer was ahead",
        )


def tracebacks(o: Observed, c: Check) -> None:
    """Ours: a frame of this project's code, a cliffguard logger, or uncaught (bench/soak/tracebacks.py)."""
    for name, text in sorted(o.logs.items()):
        for tb in find(text):
            if tb.ours:
                c.fail(
                    1, f"{name}: {tb.exception[:160]}" + (f" (logged by {tb.logger})" if tb.logger else "")
                )


def library_tracebacks(o: Observed, c: Check) -> None:
    """Logged by a library from its own frames only (kafka-python on a dropped socket, say)."""
    for name, text in sorted(o.logs.items()):
        for tb in find(text):
            if not tb.ours:
                c.fail(
                    1, f"{name}: {tb.exception[:160]} (logged by {tb.logger}; frames: {_where(tb.frames)})"
                )


def _where(frames: list[str]) -> str:
    return ", ".join(sorted({f.split("/site-packages/")[-1].split("/")[0] for f in frames})) or "none"


def controller_exits(o: Observed, c: Check) -> None:
    for e in o.controller_exits:
        if (
            not e["asked"]
            or (e["how"] == "SIGKILL" and e["rc"] != -9)
            or (e["how"] != "SIGKILL" and e["rc"] != 0)
        ):
            c.fail(1, f"controller exited {e['rc']} ({e['how']})")
