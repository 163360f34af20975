"""Admission before a node joins (issue 22, item 4): the suspect-node list a launcher reads before
its node joins the rendezvous, and the pure decision it takes from it.

The controller publishes the fleet's suspect-node list to the compacted topic
``<prefix>.suspects`` (``KafkaConfig.suspects_topic``; ``controller/admission.py``): one record per
node, keyed by the node id, whose value is a signed JSON entry:

- ``{"state": "suspect", "cause", "reason", "since", "run", "incident", "record", ...}``: the node
  is refused (an open record, not on probation);
- ``{"state": "cleared", ...}``: the node is admitted (cleared, or on probation after
  ``cliffguard nodes recheck``: a probation node may join, its node check decides).

Every entry carries ``kind`` (``KIND``), ``v``, ``node`` and ``at`` (when the controller published
it) and is signed with the command key (``core/signing.py`` ``sign_payload``: Ed25519, or the HMAC
fallback); a clear is a signed ``cleared`` value, never a tombstone, so a forged tombstone cannot
admit a node. The network is hostile, so ``read_board`` keeps only entries whose signature checks,
whose key is the node they name, and of the newest ``at`` per node (an old ``cleared`` entry
replayed onto the topic loses to the newer ``suspect`` one); every other record (unsigned, badly
signed, malformed, a tombstone) is ignored and named in ``Board.problems`` for the launcher to
print. ``decide`` is the launcher's verdict for its node; ``refusal_line`` its one line.

The launcher's side (the read, its timeout, fail-open) is ``cliffguard/admission.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.signing import SigningKey, VerifyingKey, payload_signature_ok, sign_payload

KIND = "cliffguard.suspect_node"
VERSION = 1
SUSPECT = "suspect"
CLEARED = "cleared"
REFUSED_EXIT = 77
"""``cliffguard train``'s exit code when the suspect-node list refuses its node (EX_NOPERM: not
75, the requeue code, so a scheduler does not start it again on the same node by itself)."""
PROBLEMS_KEPT = 20
"""Problems a board keeps word of (the count is kept in full)."""


@dataclass(kw_only=True, slots=True)
class AdmissionConfig:
    """``[train.admission]``: the launcher's check of the suspect-node list before its node joins."""

    enabled: bool = True
    """Read the suspect-node list before starting torchrun and refuse to start on a suspect node
    (``cliffguard train --no-admission-check``: off)."""
    timeout_s: float = bounded(5.0, gt=0)
    """How long the read may take in all; past it (or with the broker unreachable) the launch goes
    on unchecked and says so (fail-open), and the controller's heartbeat refusal still applies."""

    def __post_init__(self) -> None:
        check_declared(self)


def suspect_entry(node: str, *, cause: str, reason: str, since: float, run: str, incident: str | None,
                  record: int | None, at: float) -> dict[str, Any]:
    return {"kind": KIND, "v": VERSION, "node": node, "state": SUSPECT, "cause": cause, "reason": reason,
            "since": since, "run": run, "incident": incident, "record": record, "at": at}


def cleared_entry(node: str, *, at: float, devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Admitted; ``devices``: its device slots recorded suspect (``device_entry``), which a launch of
    the node leaves out (absent when none, so an entry without them reads as before)."""
    entry = {"kind": KIND, "v": VERSION, "node": node, "state": CLEARED, "at": at}
    if devices:
        entry["devices"] = devices
    return entry


def device_entry(slot: int, *, cause: str, reason: str, since: float, run: str, incident: str | None,
                 record: int | None) -> dict[str, Any]:
    return {"slot": slot, "cause": cause, "reason": reason, "since": since, "run": run, "incident": incident,
            "record": record}


def encode_entry(entry: dict[str, Any], key: SigningKey) -> bytes:
    """The record value: the entry with its signature (``sig``) over everything else."""
    return json.dumps({**entry, "sig": sign_payload(entry, key)}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


@dataclass(slots=True)
class Board:
    """The suspect-node list as a launcher read it: node -> its newest verified entry."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: int = 0
    """Records read (every one, verified or not)."""
    ignored: int = 0
    """Records ignored: unsigned, badly signed, malformed, tombstones."""
    problems: list[str] = field(default_factory=list)
    """Why, for the first ``PROBLEMS_KEPT`` of them."""

    def _ignore(self, why: str) -> None:
        self.ignored += 1
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append(why)


def _check(key: bytes | None, value: bytes | None, verifying: VerifyingKey) -> tuple[dict[str, Any] | None, str]:
    """(the verified entry, "") or (None, why it is ignored)."""
    name = key.decode("utf-8", "replace") if key else "?"
    if value is None:
        return None, f"node {name}: a tombstone (not signed; a clear is a signed 'cleared' entry)"
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None, f"node {name}: not JSON"
    if not isinstance(doc, dict):
        return None, f"node {name}: not a JSON object"
    sig = doc.pop("sig", None)
    if not sig:
        return None, f"node {name}: unsigned entry"
    try:
        ok = payload_signature_ok(doc, sig, verifying)
    except (TypeError, ValueError):  # a value canonical JSON cannot hold
        ok = False
    if not ok:
        return None, f"node {name}: bad signature"
    if doc.get("kind") != KIND or doc.get("state") not in (SUSPECT, CLEARED):
        return None, f"node {name}: signed, but not a suspect-node entry"
    if not key or doc.get("node") != name:
        return None, f"record key {name!r} does not match the signed node {doc.get('node')!r}"
    at = doc.get("at")
    if not isinstance(at, (int, float)) or not math.isfinite(at):
        return None, f"node {name}: signed entry without a time"
    return doc, ""


def read_board(records: Iterable[tuple[bytes | None, bytes | None]], key: VerifyingKey) -> Board:
    """The board from the topic's records (key, value) in log order; only verified entries count, the
    newest ``at`` per node (a tie: the later record)."""
    board = Board()
    for k, v in records:
        board.records += 1
        entry, why = _check(k, v, key)
        if entry is None:
            board._ignore(why)
            continue
        node = entry["node"]
        cur = board.entries.get(node)
        if cur is None or entry["at"] >= cur["at"]:
            board.entries[node] = entry
    return board


@dataclass(frozen=True, slots=True)
class Verdict:
    node: str
    admitted: bool
    entry: dict[str, Any] | None = None
    """The node's verified entry (None: the list does not name it)."""

    @property
    def devices_out(self) -> tuple[dict[str, Any], ...]:
        """An admitted node's device slots recorded suspect, each ``device_entry``, by slot; an item
        that is not one (no whole slot >= 0) is left aside, never guessed at."""
        raw = (self.entry or {}).get("devices") if self.admitted else None
        if not isinstance(raw, list):
            return ()
        ok = {d["slot"]: d for d in raw if isinstance(d, dict) and type(d.get("slot")) is int and d["slot"] >= 0}
        return tuple(ok[s] for s in sorted(ok))


def decide(board: Board, node: str) -> Verdict:
    """Refused when the node's newest verified entry says suspect; admitted otherwise."""
    entry = board.entries.get(node)
    return Verdict(node, admitted=entry is None or entry.get("state") != SUSPECT, entry=entry)


def refusal_line(v: Verdict) -> str:
    """The launcher's one line for a refused node."""
    e = v.entry or {}
    since = e.get("since")
    when = f" since {since:.0f}" if isinstance(since, (int, float)) else ""
    where = f", run {e.get('run')}" + (f", incident {e.get('incident')}" if e.get("incident") else "")
    return (f"cliffguard train: node {v.node} is suspect{when} ({e.get('cause')}{where}: {e.get('reason')}) and is "
            f"not admitted to any run; not starting (exit {REFUSED_EXIT}). After a fix: "
            f"cliffguard nodes clear {v.node} --reason '...' (or cliffguard nodes recheck {v.node})")


def devices_line(v: Verdict, kept: tuple[int, ...]) -> str:
    """The launcher's line for an admitted node whose device slots are recorded suspect."""
    out = ", ".join(f"{d['slot']} ({d.get('cause')}, run {d.get('run')}: {d.get('reason')})" for d in v.devices_out)
    if not kept:
        return (f"cliffguard train: every device slot of node {v.node} is recorded suspect: {out}; not starting "
                f"(exit {REFUSED_EXIT}). After a fix: cliffguard nodes clear {v.node} --reason '...'")
    return (f"cliffguard train: WARNING: node {v.node} admitted without device slot(s) {out}: recorded suspect by "
            f"the controller; starting {len(kept)} process(es) on slot(s) {', '.join(map(str, kept))}. After a fix: "
            f"cliffguard nodes clear {v.node} --reason '...'")
