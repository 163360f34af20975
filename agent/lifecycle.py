"""The agent's lifecycle: ``start`` (the peak's calibration, ``run.started``, the heartbeats) and
``close`` (``run.finished``/``run.failed``, then every part closed, each even if another fails).

MFU calibration: without a table or configured peak each rank times a matmul
(agent/collectors/mfu.py); ranks calibrate concurrently and differ a little, so all use the
highest (a conservative MFU), agreed with one all-reduce at start. The step probe later raises a
calibrated peak that a step beats (``StepProbe._raise_calibrated_peak``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cliffguard.agent.collectors.mfu import ModelShape, resolve_peak
from cliffguard.agent.command_channel import CommandChannel
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.emitter import Emitter
from cliffguard.agent.hang.part import HangPart
from cliffguard.agent.heartbeat import Heartbeat
from cliffguard.agent.modes import STOPPING, ModeMachine
from cliffguard.agent.node_beats import NodeBeats, NodeLayout
from cliffguard.agent.ranks import Ranks
from cliffguard.agent.sinks import EventSink
from cliffguard.agent.step_probe import StepProbe
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.enums import CommandType, EventType
from cliffguard.core.restart_plan import device_slots, node_id

log = logging.getLogger(__name__)

LISTENER_WAIT_S = 2.0
"""At ``start``: how long to wait for the command listener to reach the end of the topic."""


class _Closeable(Protocol):
    def close(self) -> None: ...


class Lifecycle:
    """See the module docstring. One per process."""

    def __init__(self, config: AgentConfig, ranks: Ranks, emitter: Emitter, probe: StepProbe,
                 channel: CommandChannel, modes: ModeMachine, sink: EventSink, hang: HangPart | None = None) -> None:
        self.config = config
        self.ranks = ranks
        self.emitter = emitter
        self.probe = probe
        self.channel = channel
        self.modes = modes
        self.sink = sink
        self.hang = hang
        self._heartbeat: Heartbeat | None = None
        self._node: NodeBeats | None = None
        self.closed = False
        self.summaries: dict[str, Callable[[], dict[str, Any]]] = {}
        """Name -> what the run's ``run.finished`` carries under it (the kit's ``validation``)."""
        self.closers: list[_Closeable] = []
        """Closed with the agent (the kit's preemption watch: its signal handlers go back)."""

    def start(self, *, global_batch: int = 0, lr_schedule: dict[str, Any] | None = None,
              config: dict[str, Any] | None = None, capabilities: Iterable[CommandType | str] | None = None) -> None:
        """Resolve the MFU peak (same on every rank), emit ``run.started`` (rank 0), start heartbeats.

        ``capabilities``: the commands this loop applies (``core/capabilities.py``); the controller
        sends no other. None declares nothing, which the controller reads as every command."""
        ranks, probe = self.ranks, self.probe
        peak, source = resolve_peak(ranks.device, self.config.peak_flops, self.config.calibration_s)
        if ranks.distributed and source == "calibration":
            t = torch.tensor([peak], dtype=torch.float64, device=ranks.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            peak = float(t.item())
        probe.peak_flops, probe.peak_source = peak, source
        if self.hang is not None:
            self.hang.agree_life()  # the worker group's life, the same on every rank (run.started says it)
        sdc_off = probe.param_check_off
        if sdc_off and ranks.rank == 0:  # asked for, and impossible: said where the user looks, not skipped quietly
            log.warning("cliffguard: the SDC watch cannot check this run: %s ([agent] param_check_every %d)",
                        sdc_off, self.config.param_check_every)
        if ranks.rank == 0:
            shape = probe.shape or ModelShape(n_params=probe.n_params, n_layers=0, n_heads=0, head_dim=0, seq_len=0)
            self.emitter.emit(EventType.RUN_STARTED, {
                "n_params": shape.n_params, "n_layers": shape.n_layers, "n_heads": shape.n_heads,
                "head_dim": shape.head_dim, "seq_len": shape.seq_len, "global_batch": global_batch,
                "peak_flops": peak, "peak_source": source, "lr_schedule": lr_schedule or {},
                "world_size": ranks.world, "config": config or {},
                "param_check_every": probe.param_check_every,
                **({"param_check_off": sdc_off} if sdc_off else {}),
                **({} if capabilities is None else {"capabilities": list(normalize_capabilities(capabilities))}),
                **self._life(),
            })
        self._node = self._make_node_beats()
        if self.hang is not None and self._node is not None:
            self.hang.peers_gone = self._node.gone  # a hang's evidence names the node's dead ranks
        wait_ready = getattr(self.channel.source, "wait_ready", None)  # the listener has it; a test's fake may not
        if wait_ready is not None:
            wait_ready(LISTENER_WAIT_S)  # commands sent before the listener is positioned are re-sent by the controller
        self._heartbeat = Heartbeat(self.config.heartbeat_s, self.beat, name=f"cliffguard-heartbeat-r{ranks.rank}").start()
        if self.hang is not None:
            self.hang.start()
        probe.clock.restart()

    def _life(self) -> dict[str, int]:
        """Which start of the worker group this is, and what torchrun allows (core/restart_plan.py)."""
        if self.hang is None:
            return {}
        life = self.hang.life
        return {"life": life.life, "max_restarts": life.max_restarts, "restarts_left": life.restarts_left,
                "nodes": life.nodes, "min_nodes": life.min_nodes}

    def _make_node_beats(self) -> NodeBeats | None:
        from cliffguard.agent.spill import default_spill_dir

        base = Path(self.config.spill_dir or default_spill_dir())
        try:
            return NodeBeats(base / f"beats-{self.config.run}", NodeLayout.from_env(self.ranks.rank, self.ranks.world))
        except (OSError, ValueError):
            log.exception("node heartbeats unavailable; this rank beats for itself")
            return None

    def beat(self) -> None:
        """Every rank says it is alive in its node file; the node's leader publishes the node's
        heartbeat (agent/node_beats.py). Without the files a rank beats for itself."""
        if self._node is None:
            self.emitter.emit(EventType.HEARTBEAT, {"state": str(self.modes.mode), **self._whose()})
            return
        self._node.write(self.probe.step, self.ranks.collective)
        if self._node.layout.leader:
            slots = list(device_slots(self._node.layout.local_world))  # a device-level eviction names these
            self.emitter.emit(EventType.HEARTBEAT, {"state": str(self.modes.mode), **self._node.read(), **self._whose(),
                                                    "slots": slots})

    def _whose(self) -> dict[str, Any]:
        """The beating node and its worker group's life: the controller leaves out a node its store
        holds suspect by this (controller/suspects.py), from the first beats of any life."""
        if self.hang is not None:
            return {"node": self.hang.life.node, "life": self.hang.life.life}
        return {"node": node_id()}

    def _summaries(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, summary in self.summaries.items():
            try:
                out[name] = summary()
            except Exception:  # noqa: BLE001 - the run's end is sent anyway
                log.exception("run summary %r failed", name)
        return out

    def close(self, error: BaseException | str | None = None, *, final_loss: float | None = None,
              ended: bool = True) -> None:
        """Emit run.finished/run.failed (rank 0) and close everything, each part even if another fails.
        ``ended=False`` (a preempted run, which said so in ``run.preempted`` and will be requeued):
        neither, unless it failed."""
        if self.closed:
            return
        self.closed = True
        deferred = False
        if self.hang is not None:
            try:  # evidence first: a collective that failed is a hang's end (or a peer's death)
                deferred = self.hang.collective_failed(error)
            except Exception:  # noqa: BLE001 - close the rest anyway
                log.exception("hang evidence on close failed")
        self.modes.move(STOPPING)
        if self.ranks.rank == 0 and (ended or error is not None):
            if error is not None:
                self.emitter.emit(EventType.RUN_FAILED, {"error": str(error) or type(error).__name__})
            else:
                data: dict[str, Any] = {"steps": self.probe.step}
                if final_loss is not None:
                    data["final_loss"] = final_loss
                data.update(self._summaries())
                self.emitter.emit(EventType.RUN_FINISHED, data)
        # the sink before the listener (whose thread may take a poll to stop): the events out first
        parts: list[_Closeable | None] = [*self.closers, self.hang, self._heartbeat, self.sink, self.channel.source]
        for part in parts:
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # noqa: BLE001 - close the rest anyway
                log.exception("closing %s failed", type(part).__name__)
        if deferred and self.hang is not None:
            self.hang.end_deferral()
