"""A restart's plan: what the controller decided for a hung worker group, written where every
process of the job reads it.

The controller's ``restart`` command (core/payloads.py ``RestartArgs``) reaches rank 0 of the
hung group on its listener thread; rank 0 writes this plan (atomically, temp + rename) and leaves,
so torchrun tears the group down. Then:

- every launcher (``cliffguard train``, one per node) polls the plan: a plan that names its node
  in ``exclude_nodes``, or says ``halt``, makes it stop its torchrun agent and exit saying why, so
  an excluded node never rejoins the rendezvous and a halted job stops for a human; a plan that
  names one of its devices in ``exclude_devices`` (``(node, slot)``: a device-level eviction) makes
  it restart its torchrun agent with one process fewer, that device left out (``SLOTS_ENV``);
- the next worker group reads it at start: ``halt`` ends each worker before it trains.

The plan lives beside the run's checkpoints (one filesystem for the job, as the checkpoints
already need) or in ``[agent.hang] plan_dir``. A plan belongs to one torchrun job
(``TORCHELASTIC_RUN_ID``, ``job``) and one life of its worker group; a fresh launch clears it.
``WorkerLife`` is what torchrun tells a worker about its job (its environment variables).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODES = ("in_place", "exclude", "halt")
"""``in_place``: the same nodes start again; ``exclude``: without ``exclude_nodes``; ``halt``: stop."""
NODE_ENV = "CLIFFGUARD_NODE_ID"
"""A node's id for the plan and the evidence (the launcher sets it; default: the host name)."""
MIN_NODES_ENV = "CLIFFGUARD_MIN_NODES"
"""The fewest nodes the launch accepts (``--nnodes MIN:MAX``), set by the launcher for its workers."""
SLOTS_ENV = "CLIFFGUARD_DEVICE_SLOTS"
"""The node's device slots its workers run on, by local rank (comma-separated; the launcher sets it
after a device-level eviction left one out; unset: slot = local rank). On GPU the launcher also
narrows ``CUDA_VISIBLE_DEVICES`` to these slots, so local rank i runs on the i-th kept device."""
PLAN_NAME = "restart-plan.json"
RESTART_EXIT_CODE = 75
"""A worker's exit status when it leaves for a restart (EX_TEMPFAIL): torchrun restarts the group."""


def node_id(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(NODE_ENV) or socket.gethostname()


def device_slots(local_world: int, env: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The device slot of each local rank of this node (``SLOTS_ENV``; default: the local ranks)."""
    env = os.environ if env is None else env
    raw = env.get(SLOTS_ENV, "")
    try:
        slots = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        slots = ()
    return slots if len(slots) == local_world else tuple(range(local_world))


def device_slot(env: Mapping[str, str] | None = None) -> int:
    """This process's device slot on its node (``LOCAL_RANK`` through ``SLOTS_ENV``)."""
    env = os.environ if env is None else env
    try:
        local, world = int(env.get("LOCAL_RANK", "0")), int(env.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return 0
    slots = device_slots(world, env)
    return slots[local] if 0 <= local < len(slots) else local


@dataclass(frozen=True, slots=True)
class WorkerLife:
    """What torchrun says about this worker's job; a process outside torchrun is life 0 of a job
    that cannot restart (``max_restarts`` 0)."""

    job: str
    life: int
    """Which start of the job's worker group this is (agent/hang/life.py makes it the same on every rank)."""
    max_restarts: int
    node: str
    nodes: int
    min_nodes: int
    restarted: bool = False
    """torchrun restarted the group (on some node; TORCHELASTIC_RESTART_COUNT > 0 there)."""
    restart_count: int = 0
    """This node's torchrun restarts of failed workers (``TORCHELASTIC_RESTART_COUNT``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerLife:
        env = os.environ if env is None else env

        def number(name: str, default: int) -> int:
            try:
                return int(env.get(name, default))
            except ValueError:
                return default

        nodes = number("GROUP_WORLD_SIZE", 1)
        count = number("TORCHELASTIC_RESTART_COUNT", 0)
        return cls(job=env.get("TORCHELASTIC_RUN_ID", ""), life=count,
                   max_restarts=number("TORCHELASTIC_MAX_RESTARTS", 0), node=node_id(env), nodes=nodes,
                   min_nodes=min(number(MIN_NODES_ENV, nodes), nodes), restarted=count > 0, restart_count=count)

    @property
    def restarts_left(self) -> int:
        """What torchrun allows still (this node's count; a membership change is not counted)."""
        return max(self.max_restarts - self.restart_count, 0)

    def agreed(self, life: int, restarted: bool) -> WorkerLife:
        return dataclasses.replace(self, life=life, restarted=restarted)

    @property
    def can_leave_out_a_node(self) -> bool:
        return self.nodes > self.min_nodes


@dataclass(frozen=True, slots=True)
class RestartPlan:
    mode: str
    life: int
    """The life of the worker group the plan tore down."""
    job: str = ""
    exclude_nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    exclude_devices: tuple[tuple[str, int], ...] = ()
    """A device-level eviction: ``(node, slot)`` of each device left out; its node stays with one
    process fewer (its launcher restarts its torchrun agent: cliffguard/plan_watch.py)."""
    reason: str = ""
    incident: str = ""
    cmd: str = ""
    written_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "exclude" and not (self.exclude_nodes or self.exclude_devices):
            raise ValueError("exclude_nodes: an exclude plan names the nodes (or devices) to leave out")

    @property
    def scope(self) -> str:
        """``device`` when the plan leaves devices out (their nodes stay), else ``node``."""
        return "device" if self.exclude_devices and not self.exclude_nodes else "node"

    def excludes(self, node: str) -> bool:
        return self.mode == "halt" or (self.mode == "exclude" and node in self.exclude_nodes)

    def devices_out(self, node: str) -> tuple[int, ...]:
        """The slots of ``node`` this plan leaves out (its node stays), none when the whole node goes."""
        if self.mode != "exclude" or node in self.exclude_nodes:
            return ()
        return tuple(slot for n, slot in self.exclude_devices if n == node)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["exclude_nodes"], d["ranks"] = list(self.exclude_nodes), list(self.ranks)
        d["exclude_devices"] = [[n, slot] for n, slot in self.exclude_devices]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RestartPlan:
        return cls(mode=str(d["mode"]), life=int(d["life"]), job=str(d.get("job", "")),
                   exclude_nodes=tuple(str(n) for n in d.get("exclude_nodes", ())),
                   ranks=tuple(int(r) for r in d.get("ranks", ())),
                   exclude_devices=tuple((str(n), int(slot)) for n, slot in d.get("exclude_devices", ())),
                   reason=str(d.get("reason", "")),
                   incident=str(d.get("incident", "")), cmd=str(d.get("cmd", "")),
                   written_at=float(d.get("written_at", 0.0)))


def plan_path(directory: str | Path) -> Path:
    return Path(directory) / PLAN_NAME


def write_plan(directory: str | Path, plan: RestartPlan) -> Path:
    """Write ``plan`` atomically (a reader sees the old plan or the new one, never half)."""
    path = plan_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(plan.to_dict()))
    os.replace(tmp, path)
    return path


def read_plan(directory: str | Path) -> RestartPlan | None:
    """The plan in ``directory``; None when there is none. A plan that does not parse raises
    ValueError naming the file (a half-written plan cannot exist: it is renamed into place)."""
    path = plan_path(directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return RestartPlan.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a restart plan ({exc})") from None


def clear_plan(directory: str | Path) -> RestartPlan | None:
    """Remove the plan (a fresh launch); returns what it said."""
    try:
        old = read_plan(directory)
    except ValueError:
        old = None
    try:
        plan_path(directory).unlink()
    except FileNotFoundError:
        pass
    return old
