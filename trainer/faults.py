"""Fault injection for demos and tests, by flag (``--fault`` specs; pure apart from ``delay``/``maybe_kill``).
This decides which fault fires when; trainer/fault_wrappers.py puts it around the loop's parts.

Spec strings (step numbers are optimizer steps; ``[:r]`` limits a fault to rank r):

==========================  =====================================================================
``lr_blowup@300x50:20``     the learning rate × 50 for steps 300..319
``corrupt@200[:r]``         step 200's input batch replaced by random bytes
``nan@250[:r]``             step 250's loss reported as NaN
``slow_rank@1:0.05``        rank 1 sleeps 0.05 s every step (a straggler)
``slow_rank@1:0.05:100``    ... from step 100 on
``kill_rank@1:400``         rank 1 SIGKILLs itself at step 400 (a lost node)
``broker_outage@100:10``    the agent treats the broker as down for steps 100..109
``data_shift@150[:r]``      from step 150 on, batches drawn from another corpus: the prose of the
                            Python documentation (``pydoc_data.topics``) instead of code
``dup_burst@150:20[:r]``    steps 151..169 train on step 150's batch again (a loader stuck on one shard)
``garble@150:10[:r]``       steps 150..159: half of each batch's sequences garbled (U+FFFD
                            replacement characters and control bytes, what a broken decode leaves)
``bitflip@250:r``           rank r flips one bit of its first parameter before step 250's forward
                            (silent data corruption: its replica differs from the others from then on)
``bitflip@250:r:N``         ... on each of the first N passes over step 250 (a rollback to before it
                            replays it: the flip comes back, a persistent SDC), on rank r's node
``bad_rank@R[:S]``          from step S on (default 0), rank R's node computes wrong numbers at every
                            training forward: its loss, so its gradient, times ``BAD_RANK_FACTOR``
                            (a bad GPU): the kit's re-runs see the excess stay on that rank
                            whatever shard it gets (``bad_rank``)
==========================  =====================================================================

``bad_rank`` and a repeated ``bitflip`` follow the device, not the rank number, as a bad GPU does:
the first time rank R reaches step S it writes its node (``CLIFFGUARD_NODE_ID``, else the host
name) and device slot (``LOCAL_RANK``, through ``CLIFFGUARD_DEVICE_SLOTS`` once a device-level
eviction renumbered the node's processes) to ``<state_dir>/<kind>-r<R>-s<S>.node`` (the run directory's
``faults/``), and from then on, in every life of the worker group, whichever rank runs as that local
rank on that node is the bad one (the node's other ranks are not; a group restarted without the
node has none). Without a ``state_dir`` it stays on rank R. A repeated ``bitflip`` counts its
passes in the process (a life's rollbacks).

The data faults' content is trainer/data_faults.py. One-shot (all but slow_rank, data_shift
and bad_rank, which stay): a fault window fires on the first pass only. When the loop leaves the window — past
its end, or back before its start by a rollback — it is spent, so a rollback to before the fault
replays the steps cleanly (a transient glitch does not recur; that is what recovery must show).
Random bytes come from a generator seeded by (seed, step, rank): the same spec corrupts the same
way every run.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cliffguard.core.restart_plan import device_slot, node_id

_SPEC_RE = re.compile(
    r"^(?P<kind>lr_blowup|corrupt|nan|slow_rank|kill_rank|broker_outage|data_shift|dup_burst|garble|bitflip|bad_rank)"
    r"@(?P<args>[0-9.x:]+)$"
)
KINDS = ("lr_blowup", "corrupt", "nan", "slow_rank", "kill_rank", "broker_outage", "data_shift", "dup_burst", "garble",
         "bitflip", "bad_rank")
FLIP_BIT = 20
"""The mantissa bit ``bitflip`` flips: the value changes by ~1/8 of itself, enough that later
updates never round the difference away (a flip in the lowest bits may vanish)."""
BAD_RANK_FACTOR = 8.0
"""What ``bad_rank`` multiplies its rank's training loss by (so its gradient contribution too): far
past the guard's spike threshold and the triage's carrier margin, finite in fp16 and fp32."""
DATA_KINDS = ("data_shift", "dup_burst", "garble")
"""Faults in the batch's content (trainer/data_faults.py)."""
CONTENT_KEPT_STEPS = 1024
"""Steps back for which ``note_content`` keeps what fed each shard (a re-run's control batch is
the newest step that passed the guard: within a held stretch, never this far back)."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    kind: str
    step: int = 0
    """First step the fault affects."""
    steps: int = 1
    """How many steps it lasts (lr_blowup, broker_outage)."""
    factor: float = 1.0
    """LR multiplier (lr_blowup)."""
    rank: int | None = None
    """Only this rank (None = every rank)."""
    seconds: float = 0.0
    """Sleep per step (slow_rank)."""
    times: int = 1
    """Passes over ``step`` it fires on (bitflip)."""

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        m = _SPEC_RE.match(text.strip())
        if not m:
            raise ValueError(f"fault: cannot parse {text!r} (kinds: {', '.join(KINDS)}; e.g. lr_blowup@300x50:20)")
        kind, args = m["kind"], m["args"]
        try:
            if kind == "lr_blowup":
                at, rest = args.split("x")
                factor, n = rest.split(":")
                return cls(kind=kind, step=int(at), factor=float(factor), steps=int(n))
            parts = args.split(":")
            if kind in ("corrupt", "nan"):
                return cls(kind=kind, step=int(parts[0]), rank=int(parts[1]) if len(parts) > 1 else None)
            if kind == "data_shift":  # stays: the data changed, a rollback does not change it back
                return cls(kind=kind, step=int(parts[0]), steps=1 << 62, rank=int(parts[1]) if len(parts) > 1 else None)
            if kind in ("dup_burst", "garble"):
                return cls(kind=kind, step=int(parts[0]), steps=int(parts[1]),
                           rank=int(parts[2]) if len(parts) > 2 else None)
            if kind == "slow_rank":
                start = int(parts[2]) if len(parts) > 2 else 0
                return cls(kind=kind, rank=int(parts[0]), seconds=float(parts[1]), step=start, steps=1 << 62)
            if kind == "bad_rank":  # stays: a bad GPU does not heal with a rollback or a restart
                if len(parts) > 2:
                    raise ValueError
                return cls(kind=kind, rank=int(parts[0]), step=int(parts[1]) if len(parts) > 1 else 0, steps=1 << 62)
            if kind == "bitflip":
                if len(parts) not in (2, 3):
                    raise ValueError
                return cls(kind=kind, rank=int(parts[1]), step=int(parts[0]),
                           times=int(parts[2]) if len(parts) > 2 else 1)
            if kind == "kill_rank":
                (r, at) = parts
                return cls(kind=kind, rank=int(r), step=int(at))
            (at, n) = parts
            return cls(kind=kind, step=int(at), steps=int(n))
        except ValueError:
            raise ValueError(f"fault: bad arguments in {text!r}") from None

    def __post_init__(self) -> None:
        if self.step < 0 or self.steps < 1:
            raise ValueError("fault: step must be >= 0 and the duration >= 1")
        if self.kind == "lr_blowup" and self.factor <= 0:
            raise ValueError("fault: lr_blowup factor must be > 0")
        if self.seconds < 0:
            raise ValueError("fault: slow_rank seconds must be >= 0")
        if self.rank is not None and self.rank < 0:
            raise ValueError("fault: rank must be >= 0")
        if self.times < 1:
            raise ValueError("fault: the number of passes must be >= 1")


class _Window:
    """A [start, start+n) window that fires on the first pass only."""

    __slots__ = ("start", "stop", "entered", "spent")

    def __init__(self, start: int, n: int) -> None:
        self.start, self.stop = start, start + n
        self.entered = False
        self.spent = False

    def active(self, step: int) -> bool:
        if self.spent:
            return False
        if self.start <= step < self.stop:
            self.entered = True
            return True
        if self.entered:
            self.spent = True  # left the window (forward past it, or rolled back before it)
        return False


class FaultInjector:
    def __init__(
        self,
        specs: list[FaultSpec | str],
        rank: int = 0,
        seed: int = 0,
        kill: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        state_dir: str | Path | None = None,
        node: str | None = None,
        local_rank: int | None = None,
    ) -> None:
        parsed = [s if isinstance(s, FaultSpec) else FaultSpec.parse(s) for s in specs]
        self.specs = [s for s in parsed if s.rank is None or s.rank == rank]
        self.bad_ranks = [s for s in parsed if s.kind == "bad_rank"]
        """bad_rank specs of any rank: each follows its rank's node (``bad_rank_factor``)."""
        self.repeated_flips = [s for s in parsed if s.kind == "bitflip" and s.times > 1]
        """bitflips on N > 1 passes, of any rank: each follows its rank's node (``flip_param``)."""
        self.state_dir = None if state_dir is None else Path(state_dir)
        local = device_slot() if local_rank is None else local_rank
        self.device = f"{node_id() if node is None else node} {local}"
        """This process's device, as the markers name it: ``node local_rank``."""
        self._bad_devices: dict[int, str] = {}  # id(spec) -> the device it was pinned to
        self._passes: dict[int, int] = {}  # id(spec) -> passes a repeated bitflip fired on
        self.all_specs = parsed
        """Every rank's specs: the content faults of any shard are known on every rank (``note_content``)."""
        self.rank = rank
        self.seed = seed
        self._kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self._sleep = sleep
        self._windows = {id(s): _Window(s.step, s.steps) for s in parsed}
        self._content: dict[int, dict[int, list[FaultSpec]]] = {}  # step -> shard rank -> content faults it fed
        self.fired: list[tuple[str, int]] = []
        """(kind, step) of every fault that took effect, for logs and tests."""

    def _hits(self, kind: str, step: int) -> list[FaultSpec]:
        hits = [s for s in self.specs if s.kind == kind and s.times == 1 and self._windows[id(s)].active(step)]
        if hits and (kind, step) not in self.fired:
            self.fired.append((kind, step))
        return hits

    def lr_factor(self, step: int) -> float:
        factor = 1.0
        for s in self._hits("lr_blowup", step):
            factor *= s.factor
        return factor

    def corrupt_batch(self, step: int, x: torch.Tensor) -> torch.Tensor:
        if not self._hits("corrupt", step):
            return x
        return self.corrupted(step, x, self.rank)

    def corrupted(self, step: int, x: torch.Tensor, rank: int) -> torch.Tensor:
        """What ``corrupt`` makes of rank ``rank``'s batch at ``step`` (pure: seeded by seed, step, rank)."""
        gen = torch.Generator().manual_seed(hash((self.seed, step, rank)) & 0x7FFF_FFFF)
        return torch.randint(0, 256, x.shape, generator=gen, dtype=x.dtype).to(x.device)

    def corrupt_pair(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A corrupted sample is random bytes: its inputs *and* its next-byte targets are garbage
        (``y`` is ``x`` shifted by one, so both come from one corrupted window)."""
        window = self.corrupt_batch(step, torch.cat([x, y[:, -1:]], dim=1))
        return window[:, :-1], window[:, 1:]

    def corrupted_pair(self, step: int, x: torch.Tensor, y: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``corrupt_pair``'s content for rank ``rank``'s shard, without asking whether it fires."""
        window = self.corrupted(step, torch.cat([x, y[:, -1:]], dim=1), rank)
        return window[:, :-1], window[:, 1:]

    def note_content(self, step: int, world: int) -> None:
        """At ``step``'s batch: which content faults (``corrupt``, then ``data_faults``' order) fed
        each of the ``world`` shards, so a re-run of any shard on any rank gets it as it was fed
        (``content_of``). Every rank visits the same steps, so each rank's windows of the other
        ranks' specs move as theirs do (one-shot: a replay of the step after leaving it is clean)."""
        fed: dict[int, list[FaultSpec]] = {}
        for spec in self.all_specs:
            if spec.kind == "data_shift":
                hit = step >= spec.step
            elif spec.kind in ("corrupt", *DATA_KINDS):
                hit = self._windows[id(spec)].active(step)
            else:
                continue
            for r in range(world) if spec.rank is None else [spec.rank]:
                if hit and r < world:
                    fed.setdefault(r, []).append(spec)
        order = ("corrupt", "data_shift", "dup_burst", "garble")
        for specs in fed.values():
            specs.sort(key=lambda sp: order.index(sp.kind))
        if fed:
            self._content[step] = fed
        else:
            self._content.pop(step, None)  # a replayed step whose one-shot faults are spent
        for old in [s for s in self._content if s < step - CONTENT_KEPT_STEPS]:
            del self._content[old]

    def content_of(self, step: int, shard: int) -> list[FaultSpec]:
        """The content faults that fed ``shard``'s batch of ``step`` (as ``note_content`` saw them)."""
        return list(self._content.get(step, {}).get(shard, []))

    def data_faults(self, step: int) -> list[FaultSpec]:
        """The content faults of ``step``'s batch (a data shift from its step on, the others once)."""
        shift = [s for s in self.specs if s.kind == "data_shift" and step >= s.step]
        if shift and ("data_shift", step) not in self.fired:
            self.fired.append(("data_shift", step))
        return shift + self._hits("dup_burst", step) + self._hits("garble", step)

    def nan_loss(self, step: int) -> bool:
        return bool(self._hits("nan", step))

    def delay(self, step: int) -> float:
        # A straggler is a property of the machine, not a one-off: it stays slow after a rollback.
        seconds = sum(s.seconds for s in self.specs if s.kind == "slow_rank" and step >= s.step)
        if seconds:
            self._sleep(seconds)
        return seconds

    def maybe_kill(self, step: int) -> None:
        if self._hits("kill_rank", step):
            self._kill()

    def flip_param(self, step: int, model: torch.nn.Module) -> bool:
        """Flip ``FLIP_BIT`` of this rank's first floating parameter's first element (once, or on
        the first N passes over the step on rank r's node)."""
        once = bool(self._hits("bitflip", step))
        again = [s for s in self.repeated_flips if s.step == step and self._passes.get(id(s), 0) < s.times
                 and self._on_bad_device(s)]
        for s in again:
            self._passes[id(s)] = self._passes.get(id(s), 0) + 1
            self.fired.append(("bitflip", step))
        if not (once or again):
            return False
        p = next(p for p in model.parameters() if p.is_floating_point())
        with torch.no_grad():
            flat = p.data.view(-1)
            bits = flat.view(torch.int32) if flat.dtype == torch.float32 else flat.view(torch.int16)
            bits[0] ^= 1 << (FLIP_BIT if flat.dtype == torch.float32 else 4)
        return True

    def bad_rank_factor(self, step: int) -> float:
        """What this rank's training loss is multiplied by at ``step`` (``bad_rank``; 1.0: healthy)."""
        factor = 1.0
        for s in self.bad_ranks:
            if step >= s.step and self._on_bad_device(s):
                factor *= BAD_RANK_FACTOR
                if ("bad_rank", step) not in self.fired:
                    self.fired.append(("bad_rank", step))
        return factor

    def _on_bad_device(self, s: FaultSpec) -> bool:
        """Whether this process runs on ``s``'s bad device (bad_rank, a repeated bitflip): the node and
        local rank that rank R had when it first reached the fault's step, in any life (the marker
        file); without a state_dir, rank R itself."""
        if self.state_dir is None:
            return self.rank == s.rank
        device = self._bad_devices.get(id(s))
        if device is None:
            path = self.state_dir / f"{s.kind}-r{s.rank}-s{s.step}.node"
            if self.rank == s.rank and not path.exists():
                self.state_dir.mkdir(parents=True, exist_ok=True)
                try:
                    with path.open("x") as fh:  # the first to reach it pins the device; nobody overwrites it
                        fh.write(self.device)
                except FileExistsError:
                    pass
            try:
                device = path.read_text().strip()
            except OSError:
                return False  # not pinned yet: rank R has not reached the step
            if not device:
                return False  # written, not yet flushed: read again next step
            self._bad_devices[id(s)] = device
        return device == self.device

    def broker_down(self, step: int) -> bool:
        return bool(self._hits("broker_outage", step))
