"""The simulator's words for a replay's inputs and outputs: its options (``SimOptions``), its result
(``SimResult``), its error, the default class of trace jobs and the speedup curves of elastic jobs, and what a
replay reads of the simulator that runs it (``ReplayInputs``, which ``raylane.sim.engine.Simulator`` provides).

``raylane.sim.engine`` re-exports every name here; the words themselves (*work*, *estimate*, *service*, *tick*,
*outage*, *elastic job*, *resize*) are defined in its docstring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Protocol, Tuple

from raylane.errors import FatalError
from raylane.runtimes import RuntimeModel
from raylane.scheduling import PLACEMENTS
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.types import Node, SchedulerConfig, Team, Workload, WorkloadClass
from raylane.sim.cluster import ClusterSpec
from raylane.sim.outages import Outages
from raylane.sim.traces import SPEEDUP_ALLOWED, Speedup, Trace, TraceJob, parse_speedup

__all__ = ["ESTIMATES", "DEFAULT_CLASS", "DEFAULT_RESIZE_OVERHEAD_S", "DEFAULT_TICK_S", "CAUSES",
           "DEFAULT_STARTUP_S", "DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_SPOT_RECLAIM_PER_HOUR", "ELASTIC_SPEEDUP_ALLOWED",
           "SimOptions", "SimResult", "SimulationError", "speedup_table", "ReplayInputs", "FIDELITIES",
           "LIVE_TICK_S", "LIVE_CHANGE_EXAMINED"]

ESTIMATES = ("none", "exact", "noisy", "declared", "predicted", "predicted-declared")

# The class of trace jobs that name none: preemptible training with a checkpoint every 5 minutes, whose elastic
# jobs (min_workers < max_workers) may be resized.
DEFAULT_CLASS = WorkloadClass("train", priority=100, preemptible=True, min_runtime_s=0.0, checkpoint_interval_s=300.0,
                              grace_period_s=0.0, resizable=True)

# Seconds an elastic job makes no progress after a resize (its restart at the new size), by default.
DEFAULT_RESIZE_OVERHEAD_S = 60.0

# Seconds between clock-triggered cycles when preemption is on and ``tick_s`` is left to the simulator.
DEFAULT_TICK_S = 300.0

# How closely a replay follows the live control plane (``SimOptions.fidelity``):
# - ``trace``: cycles on DEFAULT_TICK_S and at every change, repeated at an instant until they settle (the SETTLE rule
#   of raylane.scheduling.apply); a stop frees its lease ``stop_delay_s`` after it is asked, keeping the work up to
#   the last periodic checkpoint before the request; a resize takes its size at once; no hand-over. Cheap: months of
#   trace in seconds.
# - ``live``: what the control plane does (raylane.control): a full cycle every LIVE_TICK_S, and a cycle of the
#   queues' first LIVE_CHANGE_EXAMINED workloads after each change, again at the same instant only when one freed
#   something at once (the LIVE rule); a stop takes ``stop_delay_s`` capped at its class's grace period (the control
#   plane stops a gang by force at the deadline), and a gang that yields in time keeps all its work (the training
#   loop saves a checkpoint when asked to stop) while one stopped by force keeps its last periodic checkpoint; a
#   resize waits for its gang to yield (a growth is booked at once); each admission's gang starts ``handover_s``
#   after it (Ray Train's start): a stop before then frees the lease at once, and a resize waits until the gang
#   has run its class's grace period or checkpointed. The default for journal replays.
FIDELITIES = ("trace", "live")
LIVE_TICK_S = 1.0
LIVE_CHANGE_EXAMINED = 64

# Why a lease went back to its queue. A replay of autoscaled groups adds "reclaim" (a spot node taken back).
CAUSES = ("preemption", "drain", "failure")

# Autoscaled node groups (raylane.sim.autoscaled). Seconds from asking for a node to it taking work, for a group
# whose cluster file gives no ``startup``: a cloud VM's boot, Ray's start and the image pull, typically 2-5 minutes.
DEFAULT_STARTUP_S = 180.0
# Seconds a node holds no lease before it is let go: Ray's autoscaler's ``idle_timeout_minutes`` default (5, in
# ray/autoscaler/{aws,gcp,azure,local}/defaults.yaml).
DEFAULT_IDLE_TIMEOUT_S = 300.0
# Reclaims per hour of each spot node (exponential): 0.01 is one in 100 node-hours, about one node in five a day,
# on the pessimistic side of what clouds publish for GPU spot capacity.
DEFAULT_SPOT_RECLAIM_PER_HOUR = 0.01


class SimulationError(FatalError):
    """The replay cannot go on (e.g. the cycles at one instant never settle)."""


ELASTIC_SPEEDUP_ALLOWED = ("a curve for every class, or CLASS=CURVE entries separated by commas with at most one "
                           "bare CURVE for the other classes (like amdahl:0.05 or pretrain=amdahl:0.05,linear); "
                           f"a curve is {SPEEDUP_ALLOWED}")


def speedup_table(text: str) -> Tuple[Speedup, Dict[str, Speedup]]:
    """(the default curve, class -> curve) from ``SimOptions.elastic_speedup``; FatalError naming the bad part."""
    default, by_class = None, {}
    for part in (p.strip() for p in (text or "").split(",")):
        cls, sep, curve = part.rpartition("=") if "=" in part else ("", "", part)
        try:
            s = parse_speedup(curve)
        except ValueError:
            raise FatalError(f"elastic speedup {text!r}: {part!r} is not a curve; allowed: "
                             f"{ELASTIC_SPEEDUP_ALLOWED}") from None
        if sep:
            if not cls.strip() or cls.strip() in by_class:
                raise FatalError(f"elastic speedup {text!r}: {part!r}: allowed: {ELASTIC_SPEEDUP_ALLOWED} (each "
                                 "class once)")
            by_class[cls.strip()] = s
        elif default is not None:
            raise FatalError(f"elastic speedup {text!r}: two curves for the other classes; allowed: "
                             f"{ELASTIC_SPEEDUP_ALLOWED}")
        else:
            default = s
    return default or Speedup(), by_class


@dataclass(frozen=True)
class SimOptions:
    estimates: str = "none"
    # Sigma of the log-normal factor of ``noisy`` estimates (0.5: half of them within about x0.7..x1.4).
    noise_sigma: float = 0.5
    seed: int = 0
    # Seconds from a preemption decision to the victim's resources being free (the sim's stand-in for the grace;
    # ``live`` fidelity caps it at each class's grace period).
    stop_delay_s: float = 0.0
    # Seconds between clock-triggered cycles; None: DEFAULT_TICK_S when preemption is on, else none (``live``:
    # LIVE_TICK_S).
    tick_s: Optional[float] = None
    # How closely the replay follows the live control plane: ``trace`` or ``live`` (see FIDELITIES).
    fidelity: str = "trace"
    # Seconds from an admission to its gang running (Ray Train's start), ``live`` fidelity only.
    handover_s: float = 0.0
    max_examined: int = MAX_EXAMINED
    # A guard against cycles that never settle at one instant (that would be a bug in a policy).
    max_cycles_per_instant: int = 10_000
    # Node failures and drains to play (none by default).
    outages: Outages = Outages()
    # The placement strategy of jobs whose trace names none.
    placement: str = "pack"
    # Speedup curves of elastic jobs whose trace row names none: one curve, or per class (``speedup_table``).
    elastic_speedup: str = "linear"
    # Seconds of no progress after each resize (the restart at the new size; see the module's *resize*).
    resize_overhead_s: float = DEFAULT_RESIZE_OVERHEAD_S
    # Autoscaled node groups (read only when the cluster has growable, priced or spot groups): seconds a node holds
    # no lease before it is removed, and reclaims per hour of each spot node.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    spot_reclaim_per_hour: float = DEFAULT_SPOT_RECLAIM_PER_HOUR

    def __post_init__(self):
        if self.estimates not in ESTIMATES:
            raise FatalError(f"estimates {self.estimates!r}: allowed: {', '.join(ESTIMATES)}")
        if self.fidelity not in FIDELITIES:
            raise FatalError(f"fidelity {self.fidelity!r}: allowed: {', '.join(FIDELITIES)}")
        h = self.handover_s
        if not (isinstance(h, (int, float)) and math.isfinite(h) and h >= 0):
            raise FatalError(f"hand-over {h!r}: allowed: seconds >= 0")
        if h and self.fidelity != "live":
            raise FatalError(f"hand-over {h!r}: allowed only with fidelity 'live' (the trace fidelity models none)")
        if self.placement not in PLACEMENTS:
            raise FatalError(f"placement {self.placement!r}: allowed: {', '.join(PLACEMENTS.names())}")
        speedup_table(self.elastic_speedup)
        o = self.resize_overhead_s
        if not (isinstance(o, (int, float)) and math.isfinite(o) and o >= 0):
            raise FatalError(f"resize overhead {o!r}: allowed: seconds >= 0")
        for what, v in (("idle timeout", self.idle_timeout_s), ("spot reclaim rate", self.spot_reclaim_per_hour)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise FatalError(f"{what} {v!r}: allowed: a number >= 0" + (" (seconds)" if what[0] == "i" else
                                                                             " (reclaims per node-hour)"))


@dataclass
class SimResult:
    """What a replay leaves behind: per-job outcomes (lists indexed like ``jobs``) and the time series."""

    jobs: List[TraceJob]
    config: SchedulerConfig
    options: SimOptions
    teams: Mapping[str, Team]
    total_gpus: float
    first_start: List[float]
    finish: List[float]
    preemptions: List[int]
    # Seconds of work lost to preemptions (multiply by the job's GPUs for GPU-seconds).
    lost_work: List[float]
    # GPU-seconds each team's leases held (useful and lost work alike).
    team_gpu_s: Dict[str, float]
    # Sampled after every instant: time, GPUs held by leases, pending workloads, running leases.
    times: List[float]
    busy: List[float]
    queued: List[int]
    running: List[int]
    rejected: List[Tuple[TraceJob, str]] = field(default_factory=list)
    cycles: int = 0
    instants: int = 0
    wall_s: float = 0.0
    # Wall seconds of each scheduling cycle (the core's ``cycle()``, timed as the control actor times it for
    # ``raylane_cycle_seconds``), and the pending workloads in the snapshot it was given.
    cycle_wall: List[float] = field(default_factory=list)
    cycle_pending: List[int] = field(default_factory=list)
    partial: bool = False
    # Simulated time the replay stopped at (the last completion, or where it was interrupted).
    end_time: float = 0.0
    cluster_name: str = ""
    trace_source: str = ""
    # The tick the replay used (``options.tick_s`` resolved).
    tick_s: float = 0.0
    # Stranded GPUs after each instant (beside ``times``).
    stranded: List[float] = field(default_factory=list)
    # Requeues and GPU-seconds of work lost, by cause (CAUSES).
    requeues: Dict[str, int] = field(default_factory=lambda: {c: 0 for c in CAUSES})
    lost_gpu_s: Dict[str, float] = field(default_factory=lambda: {c: 0.0 for c in CAUSES})
    # Outages: each failure (node, time); each drain (node, start, drained at: None when it never emptied).
    failures: List[Tuple[str, float]] = field(default_factory=list)
    drains: List[Tuple[str, float, Optional[float]]] = field(default_factory=list)
    # GPU-seconds of capacity that was down (failed and not yet repaired).
    down_gpu_s: float = 0.0
    # Resizes of each job (beside ``jobs``), and the GPU-seconds their restart overheads held without progress.
    resizes: List[int] = field(default_factory=list)
    resize_overhead_gpu_s: float = 0.0
    # The nodes' lives and cost, for a cluster with growable, priced or spot groups (``raylane.sim.autoscaled``);
    # None for a fixed cluster, whose report leaves the section out.
    capacity: Optional[Any] = None
    # Jobs ended by their class's ``on_max_runtime: stop``; None when no class has a ``max_runtime`` (the report then
    # leaves the run-limit section out). Their requeues and lost work are those of cause ``run_limit``.
    run_limit_stops: Optional[int] = None


class ReplayInputs(Protocol):
    """What one replay (``raylane.sim.replay.Replay``) reads of the simulator that runs it, never changes:
    ``raylane.sim.engine.Simulator`` provides it. Typed here so that the replay needs no import of the engine that
    imports it. ``jobs``, ``workloads`` and ``curves`` are indexed alike (the trace's jobs that can run); ``cluster``
    is the cluster file when its groups are elastic, else None."""

    trace: Trace
    nodes: List[Node]
    cluster: Optional[ClusterSpec]
    config: SchedulerConfig
    options: SimOptions
    runtime_model: Optional[RuntimeModel]
    cluster_name: str
    teams: Dict[str, Team]
    total_gpus: float
    jobs: List[TraceJob]
    workloads: List[Workload]
    rejected: List[Tuple[TraceJob, str]]
    curves: List[Speedup]
