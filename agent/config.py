"""The agent's own settings (``[agent]``, with ``[agent.guard]``, ``[agent.hang]`` and ``[agent.hist]``).

Kept apart from ``agent/hooks.py`` (the runtime: distributed hooks, publisher, command listener)
so the CLI and the config map build and validate it without importing the runtime. The spike rule and the rollback policy
the guard uses are the deployment's ``[spike]`` and ``[policy]`` (``core/deployment.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cliffguard.agent.collectors.grad_hist import HistConfig
from cliffguard.agent.data_watch.config import DataWatchConfig
from cliffguard.agent.guard import GuardConfig
from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.param_check import DEFAULT_EVERY
from cliffguard.agent.recovery.config import KitConfig
from cliffguard.agent.recovery.preemption import PreemptionConfig
from cliffguard.core.declared import bounded, check_declared, non_empty, one_of
from cliffguard.core.events import check_run_id
from cliffguard.core.rank_arrays import MAX_RANKS_PER_EVENT


@dataclass(kw_only=True, slots=True)
class AgentConfig:
    run: str = non_empty(reason="must be set")
    """Run id: the Kafka key of every event and the run commands must name."""
    hist_every: int = bounded(100, ge=0)
    """Emit per-layer gradient histograms every this many steps (0 = never)."""
    layer_norms: bool = True
    """Put per-layer gradient norms in step events (carried by the same all-reduce)."""
    layer_norms_every: int = bounded(10, ge=1)
    """Per-layer norms in every this many steps' events (their cost grows with the layers; the
    global ``grad_norm`` is in every step event)."""
    grad_norm_from_buckets: bool = True
    """Under DDP, take the step's global grad norm from the buckets the all-reduce has just
    written (agent/collectors/timing.py). Off when the loop changes the gradients between the
    backward and ``before_optimizer_step`` in a way a norm must see, e.g. a loss scaler's unscale
    (off by itself when the Accelerator has a scaler); clipping there is seen as the pre-clip norm."""
    heartbeat_s: float = bounded(5.0, gt=0)
    """Seconds between heartbeats (one per node, from its local rank 0; also while paused)."""
    ranks_every: int = bounded(10, ge=0)
    """Publish every rank's step time, MFU, exposed communication, data wait and memory (means
    since the last one) in ``ranks`` events every this many steps (0 = never)."""
    detail_steps: int = bounded(0, ge=0)
    """Every rank publishes its own ``step`` event (``detail: true``) for steps below this, as
    if a ``detail`` command had asked at the start (0 = only when a command asks)."""
    ranks_per_event: int = bounded(1024, ge=1, le=MAX_RANKS_PER_EVENT)
    """Ranks per ``ranks`` event; the first rank of each chunk publishes it (rank 0 alone while
    the world fits in one; a multiple of the node size makes them node leaders)."""
    param_check: str = one_of("auto", ("auto", "on", "off"))
    """The SDC watch (agent/param_check.py): data-parallel replicas compare a hash of their
    parameters. "auto": when the model is DDP-wrapped (its replicas are bit-identical), FSDP2-sharded
    with replicas of each shard (HSDP: compared within each shard's replicas, agent/replica_groups.py)
    or DeepSpeed ZeRO 0-2; "on": also a plain multi-rank model (say so only when every rank holds the
    same parameters, e.g. a loop that all-reduces its gradients itself); "off": never. Plain FSDP and
    ZeRO-3 have no replicas to compare: the run says so at start."""
    param_check_every: int = bounded(DEFAULT_EVERY, ge=0)
    """Steps between the replicas' parameter checks (0 = never): a diverged rank is named within
    this many steps, and the rollback goes back at most about this far past the divergence."""
    command_tick_s: float = bounded(0.2, gt=0)
    """While paused or held: seconds between command polls (each is one broadcast)."""
    peak_flops: float | None = bounded(None, gt=0)
    """Peak FLOP/s per device for MFU; unset = device table, else a matmul calibration."""
    calibration_s: float = bounded(0.3, gt=0)
    """Seconds of matmul calibration when the peak is neither configured nor in the table."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The in-process guard (spike rule before optimizer.step())."""
    recovery: KitConfig = field(default_factory=KitConfig)
    """The recovery kit (agent/recovery/kit.py): controller-silence timeout, memory ring, held-back batches."""
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    """The scheduler's warning signals: a save at the next step boundary, then a requeue exit
    (agent/recovery/preemption.py)."""
    hang: HangConfig = field(default_factory=HangConfig)
    """Hangs (agent/hang/): collective timeouts, the watchdog's evidence, restarts, the node check."""
    hist: HistConfig = field(default_factory=HistConfig)
    """Fixed log2 bin edges of the gradient histograms."""
    data_watch: DataWatchConfig = field(default_factory=DataWatchConfig)
    """Batch statistics off the training thread (agent/data_watch/): ``data.stats`` every ``every`` steps."""
    spill_dir: str = ""
    """Where each rank's publisher spills events while the broker is down (default: temp dir)."""

    def __post_init__(self) -> None:
        check_declared(self)
        check_run_id(self.run)  # else the broker side would drop every event of the run
