"""The words of the scheduling core: resources, nodes, workloads, leases, the snapshot, reasons and decisions.

This module owns the immutable value types that every policy reads and every driver (the control actor, the
simulator, the benchmark) builds. Nothing here imports Ray, reads a clock or draws random numbers.

Glossary
- *resources*: GPU count, CPU count and memory in GiB. Logical: what Ray schedules by, not what a process uses.
- *device*: one GPU of a node (index 0..n-1, n its whole GPU capacity). A worker asking 0 < g < 1 GPUs takes g of
  ONE device; a worker asking g >= 1 (a whole number) takes g whole, fully free devices (Ray's rule). A node's free
  GPU count is the sum over its devices, but a worker fits only where a device (or enough whole ones) has room.
- *gang*: ``workers`` identical bundles of ``per_worker`` resources that start all together or not at all. An
  *elastic* gang may run at any size in [``min_workers``, ``max_workers``]; ``workers`` is its size now.
- *placement*: one node id per worker of a gang, in worker order.
- *workload*: one submission (a training gang, a sweep, a serving shortfall...) as the core sees it.
- *lease*: a workload that holds resources now, with where it runs and since when.
- *class*: the workload class (pretrain, finetune, ...) with its priority and preemption rules.
- *team quota*: per resource, a ``nominal`` share, how much more it may ``borrow`` from the others' unused quota,
  and how much of its own unused nominal it may ``lend``. ``None`` for a limit means unlimited.
- *snapshot*: everything the cycle needs, frozen at one instant; ``now`` is passed beside it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Tuple, Union

from raylane.runtimes.dist import RuntimeDist

RESOURCE_NAMES: Tuple[str, ...] = ("gpu", "cpu", "memory")


@dataclass(frozen=True, slots=True)
class Resources:
    """A bundle of logical resources. ``memory`` is in GiB."""

    gpu: float = 0.0
    cpu: float = 0.0
    memory: float = 0.0

    def __add__(self, other: "Resources") -> "Resources":
        return Resources(self.gpu + other.gpu, self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: "Resources") -> "Resources":
        return Resources(self.gpu - other.gpu, self.cpu - other.cpu, self.memory - other.memory)

    def scale(self, k: float) -> "Resources":
        return Resources(self.gpu * k, self.cpu * k, self.memory * k)

    def fits_in(self, other: "Resources") -> bool:
        # A small epsilon absorbs float sums of fractional requests (0.1 + 0.2 ...).
        return (
            self.gpu <= other.gpu + 1e-9
            and self.cpu <= other.cpu + 1e-9
            and self.memory <= other.memory + 1e-9
        )

    def get(self, name: str) -> float:
        return getattr(self, name)

    def items(self):
        return ((n, getattr(self, n)) for n in RESOURCE_NAMES)

    def rounded(self) -> "Resources":
        """To 9 decimals: sums of fractional GPU shares then compare equal whatever order they were added in."""
        return Resources(round(self.gpu, 9), round(self.cpu, 9), round(self.memory, 9))

    def is_zero(self) -> bool:
        return self.gpu == 0 and self.cpu == 0 and self.memory == 0

    def __str__(self) -> str:
        parts = []
        if self.gpu:
            parts.append(f"{self.gpu:g} GPU")
        if self.cpu:
            parts.append(f"{self.cpu:g} CPU")
        if self.memory:
            parts.append(f"{self.memory:g} GiB")
        return ", ".join(parts) or "nothing"


ZERO = Resources()

# Float sums of fractional GPU shares (0.1 + 0.2 ...) are compared with this slack.
GPU_EPS = 1e-9


def gpu_request_error(per_worker_gpu: float) -> Optional[str]:
    """Why a worker cannot ask for ``per_worker_gpu`` GPUs (Ray's rule), or None when it can.

    A worker asks for a share of one GPU device (0 < g < 1) or for whole devices (a whole number); 1.5 GPUs would
    be one device and half of another, which Ray refuses.
    """
    g = per_worker_gpu
    if g != g or g < 0 or g == float("inf"):
        return "a number >= 0"
    if g < 1 or abs(g - round(g)) <= GPU_EPS:
        return None
    return "a fraction below 1 (a share of one GPU) or a whole number of GPUs per worker"


@dataclass(frozen=True, slots=True)
class Node:
    """A schedulable node. ``free`` is capacity minus what leases hold on it."""

    id: str
    capacity: Resources
    free: Resources
    features: frozenset = frozenset()
    # Label values used by the ``group`` placement (e.g. {"rack": "r1"}) and data locality ({"datasets": ...}).
    labels: Mapping[str, str] = field(default_factory=dict)
    node_type: str = ""
    # Datasets cached on this node's local disk, for data-locality placement.
    datasets: frozenset = frozenset()
    # False while the node is cordoned, draining or quarantined: what runs there stays, nothing new is placed.
    schedulable: bool = True
    # Free GPU share of each device (1.0: fully free). None: derived from ``capacity`` and ``free`` by
    # ``node_devices`` (whole free GPUs first, the fractional rest on the next device).
    devices: Optional[Tuple[float, ...]] = None


def device_count(capacity_gpu: float) -> int:
    """How many GPU devices a node of ``capacity_gpu`` GPUs has (a fractional rest counts as one more)."""
    return max(0, math.ceil(capacity_gpu - GPU_EPS))


def node_devices(node: "Node") -> Tuple[float, ...]:
    """The free share of each of ``node``'s GPU devices: its own when it has them and they add up to its free GPUs
    (a node copied with another ``free``, as a repaired node is, has stale ones), else derived from its free GPUs."""
    devs = node.devices
    if devs is not None and abs(sum(devs) - node.free.gpu) <= 1e-6:
        return devs
    left, out = node.free.gpu, []
    for _ in range(device_count(node.capacity.gpu)):
        d = min(1.0, max(0.0, left))
        out.append(round(d, 9))
        left -= d
    return tuple(out)


class Strategy(str, enum.Enum):
    PACK = "pack"
    SPREAD = "spread"
    STRICT_PACK = "strict-pack"
    STRICT_SPREAD = "strict-spread"
    BALANCED = "balanced"
    GROUP = "group"
    DATA_LOCALITY = "data-locality"


@dataclass(frozen=True, slots=True)
class Gang:
    workers: int
    per_worker: Resources
    strategy: str = "pack"
    features: frozenset = frozenset()
    # For the ``group`` strategy: the node label whose value all workers must share (e.g. "rack").
    group_by: str = "rack"
    # Nodes to try first, in order, before the strategy: the whole gang on one of them if it fits there now (a
    # pipeline stage's planned node, then the nodes that hold its inputs). Empty: the strategy alone.
    prefer: Tuple[str, ...] = ()
    # Elastic gangs: the sizes it may run at. None: fixed at ``workers`` (the bound is ``workers`` itself).
    # ``workers`` stays the current (or requested) size, so every policy that reads it sees the size to place.
    min_workers: Optional[int] = None
    max_workers: Optional[int] = None
    # Flavors: the node types it may run on, most preferred first (Kueue's resource flavors); empty: any. It is
    # placed on the first that has room now (``raylane.scheduling.placement.place``).
    node_types: Tuple[str, ...] = ()
    # Spot nodes (labelled ``SPOT_LABEL``): "never" on them, "allow" (any node), "prefer" (spot nodes first, of each
    # node type), or "only" (spot nodes alone: one tier of "prefer"). From its class's ``spot``.
    spot: str = "allow"
    # Node types it must not be placed on now: those its team's flavor quotas have no room for (set by the cycle on
    # the copy it places; empty on every gang a driver builds).
    avoid_types: frozenset = frozenset()
    # ``per_worker`` times ``workers``, worked out once: every quota check of a cycle reads it.
    total: Resources = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p, n = self.per_worker, self.workers
        object.__setattr__(self, "total", Resources(p.gpu * n, p.cpu * n, p.memory * n))

    @property
    def lo(self) -> int:
        """The fewest workers it may run with (``workers`` for a fixed gang)."""
        return self.workers if self.min_workers is None else self.min_workers

    @property
    def hi(self) -> int:
        """The most workers it may run with (``workers`` for a fixed gang)."""
        return self.workers if self.max_workers is None else self.max_workers

    @property
    def elastic(self) -> bool:
        return self.lo < self.hi

    def at(self, n: int) -> "Gang":
        """The same gang at ``n`` workers (its bounds kept): what a resize or an admission below max places."""
        return replace(self, workers=n)


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    name: str
    priority: int
    preemptible: bool
    min_runtime_s: float = 0.0
    checkpoint_interval_s: float = 0.0
    grace_period_s: float = 30.0
    retry_budget: int = 0
    queue_time_target_s: float = 0.0
    # Whether its work may run at another size than it started with (an elastic gang of this class may grow and
    # shrink); the spec refuses an elastic gang on a class that says no.
    resizable: bool = False
    # Its work's run limit (seconds; None: none) and what happens when it is reached: "requeue" (stopped after a
    # checkpoint, back to its queue) or "stop" (stopped, and it ends FAILED). raylane.scheduling.runlimit.
    max_runtime_s: Optional[float] = None
    on_max_runtime: str = "requeue"
    # How long its work, waiting for capacity that a node being added could give, waits for that node before it
    # preempts anyone (seconds; 0: it preempts at once). The driver says which workloads wait (``Snapshot.scale_wait``).
    wait_for_scale_up_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    team: str
    cls: WorkloadClass
    gang: Gang
    submit_time: float
    # What the scheduler is told about the runtime once running (seconds); None when the user gave none.
    runtime_estimate_s: Optional[float] = None
    data_snapshot: Optional[str] = None
    # GPU-seconds this workload already received in earlier attempts (for LAS and for progress accounting).
    attained_gpu_s: float = 0.0
    kind: str = "train"
    # Who submitted it (the control plane: the record's owner; the simulator: a trace's user column). None: not
    # known; all such work of a team counts as one anonymous user under its team's user rule (``UserRule``).
    user: Optional[str] = None
    # Its runtime as learned from similar finished work (``raylane.runtimes``), the user's estimate folded in; the
    # driver attaches it. When set, duration-aware policies read it instead of ``runtime_estimate_s``.
    predicted: Optional[RuntimeDist] = None

    @property
    def priority(self) -> int:
        return self.cls.priority

    @property
    def ran_s(self) -> float:
        """Seconds of service at its size in earlier attempts (``attained_gpu_s`` over its GPUs)."""
        gpus = self.gang.total.gpu
        return self.attained_gpu_s / gpus if gpus > 0 else 0.0

    def planned_s(self, q: float = 0.5) -> Optional[float]:
        """Seconds it is planned to run from its next start: the q-quantile of what its prediction leaves given
        the service it had (``RuntimeDist.remaining``), else its estimate as given, else None."""
        if self.predicted is not None:
            return self.predicted.remaining(self.ran_s, q)
        return self.runtime_estimate_s


class LeaseState(str, enum.Enum):
    RUNNING = "running"
    # Told to stop (preempted or cancelled); still holds its resources until it is gone.
    TERMINATING = "terminating"


@dataclass(frozen=True, slots=True)
class Lease:
    workload: Workload
    placement: Tuple[str, ...]
    start_time: float
    last_checkpoint_time: Optional[float] = None
    state: LeaseState = LeaseState.RUNNING
    # The GPU devices each worker holds, in worker order (a worker of 0.5 GPU: one index; of 2 GPUs: two). Empty
    # when not known (a lease built without them): giving back then derives them from the node's devices.
    devices: Tuple[Tuple[int, ...], ...] = ()

    @property
    def id(self) -> str:
        return self.workload.id

    @property
    def team(self) -> str:
        return self.workload.team

    def progress_at_risk_s(self, now: float) -> float:
        """Seconds of work a stop now would lose: time since the last checkpoint (or since start)."""
        ref = self.last_checkpoint_time if self.last_checkpoint_time is not None else self.start_time
        return max(0.0, now - max(ref, self.start_time))

    def expected_end(self) -> Optional[float]:
        est = self.workload.planned_s()
        return None if est is None else self.start_time + est


@dataclass(frozen=True, slots=True)
class Quota:
    nominal: float
    borrowing_limit: Optional[float] = None
    lending_limit: Optional[float] = None

    @property
    def guaranteed(self) -> float:
        """The part of the nominal quota that is never lent."""
        if self.lending_limit is None:
            return 0.0
        return max(0.0, self.nominal - self.lending_limit)

    @property
    def ceiling(self) -> float:
        return float("inf") if self.borrowing_limit is None else self.nominal + self.borrowing_limit


@dataclass(frozen=True, slots=True)
class Cohort:
    """A node of the quota tree (``raylane.scheduling.cohorts``): teams and cohorts under it share what they lend.

    ``quotas`` are the cohort's own: a ``nominal`` of its own (added to what its members lend), a ``borrowing_limit``
    on what its subtree may take from outside it and a ``lending_limit`` on what may leave it. ``parent`` None: a
    child of the implicit root, the whole cluster. ``weight``: its subtree's share under fair share."""

    name: str
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    parent: Optional["Cohort"] = None
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class UserRule:
    """Fairness between the users of one team (``raylane.scheduling.users``; Slurm's Fair Tree inside an account).

    ``fair``: the team's pending work is ordered, inside each class priority, by its user's decayed usage plus what
    the user holds now (least first). ``max_share``: a user may hold at most this share of the team's nominal GPU
    quota (None: no cap); borrowing raises what the team may hold, never a user's cap."""

    fair: bool = True
    max_share: Optional[float] = None


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    quotas: Mapping[str, Quota]
    weight: float = 1.0
    # GPU-seconds of past usage with exponential decay, maintained by the driver (fair share reads it).
    decayed_usage: float = 0.0
    # The team's nearest cohort; None: a child of the implicit root cohort, the whole cluster (a flat policy).
    cohort: Optional[Cohort] = None
    # Fairness between its users; None: off (the team queue's own order, no per-user cap).
    users: Optional[UserRule] = None
    # Per user (None: the anonymous user), GPU-seconds of past usage with the same decay as ``decayed_usage``;
    # kept by the driver only while ``users`` is set.
    user_usage: Mapping[Optional[str], float] = field(default_factory=dict)
    # Per-flavor GPU quotas (Kueue's resource flavors): node type -> its quota of GPUs on nodes of that type, pooled
    # with the other teams' quotas of that type (``raylane.scheduling.flavors``). A node type with no entry is not
    # limited for the team by a flavor quota (only by ``quotas``).
    flavors: Mapping[str, Quota] = field(default_factory=dict)


# The node label that marks a spot (reclaimable) node, as ``raylane.localcluster.node_labels`` and the deploy files
# write it for a node group with ``spot: true``.
SPOT_LABEL = "raylane.io/spot"
SPOT_MODES = ("never", "allow", "prefer")


# The default LAS queue thresholds in GPU-seconds: 1, 4, 16, 64 and 256 GPU-hours.
LAS_LADDER: Tuple[float, ...] = tuple(3600.0 * 4 ** k for k in range(5))

@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Which policy runs on each axis, with their parameters. Names are looked up in the registries."""

    ordering: str = "priority"
    admission: str = "quota"
    backfill: str = "easy"
    preemption: str = "default"
    # How victims of equal class priority are priced (``raylane.scheduling.preemption.VICTIM_COSTS``): ``lost_work``
    # (the GPU-seconds since each one's last checkpoint, or its start), ``recency`` (Kueue's: the most recently
    # started first, checkpoints ignored) or ``remaining`` (the longest predicted remaining time first).
    victim_cost: str = "lost_work"
    # Upper bound on admissions in one cycle, so a cycle stays short; the rest wait for the next cycle.
    max_admissions_per_cycle: int = 64
    # LAS: attained-service thresholds (GPU-seconds) of the discretized queues, Tiresias-style: a geometric ladder,
    # 1, 4, 16, 64 and 256 GPU-hours (two queues at 1 and 10 left gangs of 16-64 GPUs in one FIFO queue with
    # everything past 10 GPU-hours: docs/simulator.md, "LAS queue thresholds").
    las_thresholds: Tuple[float, ...] = LAS_LADDER
    # Fair share: half-life of decayed usage, used by drivers that maintain Team.decayed_usage.
    fair_share_half_life_s: float = 7 * 24 * 3600.0
    # Runtime assumed for a lease with no estimate when computing reservations (EASY backfill).
    default_runtime_s: float = 24 * 3600.0
    # Hysteresis of the ``ordering`` preemption policy (LAS, SRTF), against thrash: a running lease is not nominated
    # before it has run, since its last (re)start, max(hysteresis_min_run_s, hysteresis_service_fraction x the wall
    # time it had run before that start). 0 and 0: none (any lease past its class's minimum runtime).
    hysteresis_min_run_s: float = 0.0
    hysteresis_service_fraction: float = 0.0
    # Elastic gangs: a running gang grows into free capacity only once it has run this long since its last
    # (re)start or resize (each resize is a restart from a checkpoint), so that growth and shrinking do not
    # alternate with every arrival. Shrinking, a preemption, follows the class's minimum runtime instead.
    resize_interval_s: float = 600.0
    # Whether the driver carries out ``Resize`` decisions of running gangs (growth, and shrinking as a preemption).
    # Off: an elastic gang is still admitted at a size in its bounds (its ``Admit`` says which), and is then fixed.
    resize_running: bool = True


@dataclass(frozen=True)
class Snapshot:
    """Everything a cycle reads, frozen. ``queues`` maps team -> its pending workloads in submit order."""

    nodes: Tuple[Node, ...]
    leases: Tuple[Lease, ...]
    queues: Mapping[str, Tuple[Workload, ...]]
    teams: Mapping[str, Team]
    config: SchedulerConfig = SchedulerConfig()
    # Team -> resources its leases hold; derived from ``leases`` when a driver does not keep it.
    usage: Optional[Mapping[str, Resources]] = None
    # Team -> its leases (the same leases as ``leases``, grouped); derived when a driver does not keep it. Lets a
    # preemption search read only the teams it may take from.
    leases_by_team: Optional[Mapping[str, Tuple[Lease, ...]]] = None
    # The same leases in the orders a cycle reads them in (``raylane.scheduling.leaseorder.LeaseOrder``), kept by
    # a driver as leases start and end; None: the cycle sorts them (the same decisions).
    lease_order: Optional[Any] = None
    # Workload id -> the time until which it preempts nobody: it waits for a node that the autoscaler is adding or
    # may add for it (its class's ``wait_for_scale_up_s``, kept by a driver that asks an autoscaler). None: none waits.
    scale_wait: Optional[Mapping[str, float]] = None
    # Node types a growable node group could add (kept by a driver that asks an autoscaler): for flavor quotas, a gang
    # naming no node type is not blocked by quota while one of these is not limited for it or has room.
    growable_types: frozenset = frozenset()
    # Pending workloads (also in ``queues``, or past a snapshot's ``limit`` there) that preempted in an earlier cycle
    # and still wait for what they freed: the cycle examines them past its window too (``raylane.scheduling.cycle``),
    # so that a cycle of a smaller window does not give what they freed to work ahead of them (kept by the driver's
    # ``Applier``). Empty: none.
    nominated: Tuple["Workload", ...] = ()

    def pending(self) -> Tuple[Workload, ...]:
        return tuple(w for q in self.queues.values() for w in q)


# ---------------------------------------------------------------------------------------------------- reasons


@dataclass(frozen=True, slots=True)
class QuotaExceeded:
    team: str
    resource: str
    used: float
    nominal: float
    borrowable: float
    needed: float
    # A flavor quota (``raylane.scheduling.flavors``): the node type the figures are of, and the other node types
    # the gang may use whose quotas are full as well. Empty: the team's quota of ``resource`` over all nodes.
    flavor: str = ""
    also: Tuple[str, ...] = ()

    def __str__(self) -> str:
        on = f" on node type {self.flavor}" if self.flavor else ""
        also = (f" (the quota of {', '.join(self.also)} {'is' if len(self.also) == 1 else 'are'} full for it too)"
                if self.also else "")
        return (
            f"team {self.team} uses {self.used:g} of {self.nominal:g} {self.resource.upper()} nominal{on}"
            f" + {self.borrowable:g} borrowable{also}; this gang needs {self.needed:g}"
        )


@dataclass(frozen=True, slots=True)
class UserShareExceeded:
    """Its user holds ``held`` GPUs of the team, and the team's user rule caps a user at ``cap`` (``max_share`` of
    the team's nominal GPUs)."""

    team: str
    user: Optional[str]
    held: float
    cap: float
    needed: float

    def __str__(self) -> str:
        who = "(unknown user)" if self.user is None else self.user
        return (f"user {who} holds {self.held:g} of team {self.team}'s GPUs; a user may hold at most {self.cap:g} "
                f"(max_share of its nominal); this gang needs {self.needed:g}")


@dataclass(frozen=True, slots=True)
class NoCapacity:
    workers: int
    per_worker: Resources
    best_node: Optional[str]
    best_node_free: Resources
    free_total: Resources
    # The free share of each GPU of the best node, when one is partly used (its free GPUs may not hold a worker).
    best_node_devices: Tuple[float, ...] = ()

    def __str__(self) -> str:
        best = f"best node {self.best_node} has {self.best_node_free} free" if self.best_node else "no node matches"
        if self.best_node_devices:
            best += " (per GPU: " + ", ".join(f"{d:g}" for d in self.best_node_devices) + ")"
        return (
            f"needs {self.workers} x ({self.per_worker}); {best}; cluster has {self.free_total} free in all"
        )


@dataclass(frozen=True, slots=True)
class Reserved:
    """This gang is the head of the queue: resources are held back for it from ``start`` on."""

    start: float
    inner: NoCapacity

    def __str__(self) -> str:
        return f"head of queue, reserved start at t={self.start:.0f}s; {self.inner}"


@dataclass(frozen=True, slots=True)
class BlockedByReservation:
    head: str
    reserved_start: float
    inner: NoCapacity | None = None

    def __str__(self) -> str:
        return f"would delay {self.head}, reserved to start at t={self.reserved_start:.0f}s"


@dataclass(frozen=True, slots=True)
class BehindHead:
    head: str

    def __str__(self) -> str:
        return f"waits behind {self.head} (no backfill)"


@dataclass(frozen=True, slots=True)
class WaitingForPreemption:
    victims: Tuple[str, ...]

    def __str__(self) -> str:
        return "waiting for preempted " + ", ".join(self.victims) + " to stop"


@dataclass(frozen=True, slots=True)
class Displaced:
    """It fitted earlier in this cycle, but ``by`` (later in queue order) would have preempted it at once: it gave
    its place back before starting, which loses nothing, instead of starting only to be stopped."""

    by: str

    def __str__(self) -> str:
        return f"gave its place to {self.by}, which may preempt it"


@dataclass(frozen=True, slots=True)
class NotReached:
    """The cycle's admission budget ran out before this workload was looked at."""

    def __str__(self) -> str:
        return "not reached in this cycle"


@dataclass(frozen=True, slots=True)
class Infeasible:
    field: str
    detail: str

    def __str__(self) -> str:
        return f"can never run: {self.field}: {self.detail}"


Reason = Union[
    QuotaExceeded, NoCapacity, Reserved, BlockedByReservation, BehindHead, WaitingForPreemption, Displaced, NotReached,
    Infeasible, UserShareExceeded,
]


# -------------------------------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Admit:
    workload: Workload
    placement: Tuple[str, ...]
    borrowing: bool = False
    # The GPU devices each worker takes (see ``Lease.devices``); empty: the state chooses them by Ray's rule.
    devices: Tuple[Tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Preempt:
    preemptor: Workload
    victims: Tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    workload: Workload
    reason: Reason
    position: int


@dataclass(frozen=True, slots=True)
class Reject:
    workload: Workload
    reason: Infeasible


@dataclass(frozen=True, slots=True)
class Resize:
    """A running elastic gang goes from ``from_workers`` to ``to_workers``: growth into free capacity, or shrinking
    as a preemption that stops only some workers. ``placement`` holds the nodes of the whole gang at the new size
    (not only the added workers), ``devices`` the GPU devices of each worker as in ``Admit``."""

    workload: Workload
    from_workers: int
    to_workers: int
    placement: Tuple[str, ...]
    devices: Tuple[Tuple[int, ...], ...] = ()
    reason: str = ""


Decision = Union[Admit, Preempt, Pending, Reject, Resize]


@dataclass(frozen=True)
class CycleResult:
    admitted: Tuple[Admit, ...]
    preempted: Tuple[Preempt, ...]
    pending: Tuple[Pending, ...]
    # Last and defaulted: a core that does not size gangs builds the result as before.
    resized: Tuple[Resize, ...] = ()

    @property
    def decisions(self) -> Tuple[Decision, ...]:
        return self.admitted + self.preempted + self.pending + self.resized


__all__ = [
    "SPOT_LABEL", "SPOT_MODES", "RESOURCE_NAMES", "Resources", "ZERO", "GPU_EPS", "gpu_request_error", "Node", "device_count", "node_devices", "Strategy", "Gang", "WorkloadClass", "Workload", "LeaseState",
    "Lease", "Quota", "Cohort", "UserRule", "Team", "LAS_LADDER", "SchedulerConfig", "Snapshot", "QuotaExceeded", "NoCapacity", "Reserved",
    "BlockedByReservation", "BehindHead", "WaitingForPreemption", "Displaced", "NotReached", "Infeasible", "UserShareExceeded", "Reason", "Admit",
    "Preempt", "Pending", "Reject", "Resize", "Decision", "CycleResult",
]
