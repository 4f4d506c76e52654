"""The cluster policy and the workload spec as users write them (YAML), and their conversion to the core's types.

This module owns the *schema* of ``policies/*.yaml`` and of workload specs: field names, types, units, defaults and
the checks that need more than one field. It does not read files (``raylane.config.loader`` does) and it does not
decide anything about scheduling: it turns text into ``raylane.scheduling.types`` values and stops there.

Words
- *policy*: one cluster's scheduler choices, workload classes, teams with quotas, node features and prices.
- *spec*: one submission: who (team), what kind of work (class, kind), how big (gang), why (run.intent).
- *duration*, *memory*, *allowed text*: as in ``raylane.config.fields``, which holds the field types (``Duration``,
  ``Memory``, ``Name``, ``ResourcesSpec``, ``StrictModel``) and their grammars; they are re-exported here.

Defaults live in one place: the core dataclasses (``SchedulerConfig``, ``WorkloadClass``, ``Team``, ``Quota``,
``Gang``) hold them, and the fields below read them from there. The names a policy axis accepts come from the
core's registries (``ORDERINGS``, ``BACKFILLS``, ...), exposed here as the ``*_POLICIES`` constants.

Every model forbids unknown fields: a typo is an error, never a silently ignored key.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import pydantic
from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo, WrapValidator, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_core import ValidationError as CoreValidationError

# Kind-specific sections live in modules of their own, built on the field types of ``raylane.config.fields``.
from raylane.config.datasets import DataConfigSpec, DatasetName, DatasetSource, split_name_errors
# The field types are re-exported here, where callers have always found them.
from raylane.config.fields import (DURATION_ALLOWED, MEMORY_ALLOWED, NAME_ALLOWED, NAME_MAX, Allowed, Duration,
                                   Memory, Name, NonNegative, ResourcesSpec, StrictModel, parse_duration,
                                   parse_memory)
from raylane.config.fields import error as _err
from raylane.config.fields import one_of as _one_of
from raylane.config.serve import ServeSpec
from raylane.config.sweep import SweepSpec
from raylane.errors import UnknownNameError, ValidationError
from raylane.scheduling.admission import ADMISSIONS
from raylane.scheduling.backfill import BACKFILLS
from raylane.scheduling.cohorts import CohortTree
from raylane.scheduling.ordering import ORDERINGS
from raylane.scheduling.placement import PLACEMENTS
from raylane.scheduling.runlimit import ON_MAX_RUNTIME
from raylane.scheduling.preemption import PREEMPTIONS, VICTIM_COSTS
from raylane.scheduling.types import (
    RESOURCE_NAMES,
    Cohort,
    Gang,
    Quota,
    Resources,
    SchedulerConfig,
    Team,
    UserRule,
    Workload,
    WorkloadClass,
)

__all__ = [
    "ORDERING_POLICIES",
    "BACKFILL_POLICIES",
    "PREEMPTION_POLICIES",
    "ADMISSION_POLICIES",
    "PLACEMENT_STRATEGIES",
    "WORKLOAD_KINDS",
    "RESOURCE_NAMES",
    "Allowed",
    "StrictModel",
    "Duration",
    "Memory",
    "Name",
    "parse_duration",
    "parse_memory",
    "SchedulerSpec",
    "WorkloadClassSpec",
    "QuotaSpec",
    "TeamSpec",
    "CohortQuotaSpec",
    "CohortSpec",
    "cohort_errors",
    "ClusterPolicy",
    "ResourcesSpec",
    "WorkersRange",
    "GangSpec",
    "spec_workers",
    "RunMetadata",
    "WorkloadSpec",
    "policy_name_errors",
    "validate_spec_against_policy",
]

# ------------------------------------------------------------------------------------------- allowed names

# The names each axis accepts come from the core's registries: a policy module that registers itself is at once
# accepted here and listed in the error messages.
ORDERING_POLICIES: Tuple[str, ...] = tuple(ORDERINGS.names())
BACKFILL_POLICIES: Tuple[str, ...] = tuple(BACKFILLS.names())
PREEMPTION_POLICIES: Tuple[str, ...] = tuple(PREEMPTIONS.names())
VICTIM_COST_NAMES: Tuple[str, ...] = tuple(VICTIM_COSTS.names())
ADMISSION_POLICIES: Tuple[str, ...] = tuple(ADMISSIONS.names())
PLACEMENT_STRATEGIES: Tuple[str, ...] = tuple(PLACEMENTS.names())
# Workload kinds have no registry (yet): the drivers that run each kind will be looked up by these names.
WORKLOAD_KINDS: Tuple[str, ...] = ("train", "tune", "serve", "batch", "eval")
DEFAULT_KIND = "train"

_SCHED = SchedulerConfig()
_CLASS = {f.name: f.default for f in dataclasses.fields(WorkloadClass) if f.default is not dataclasses.MISSING}
_TEAM = {f.name: f.default for f in dataclasses.fields(Team) if f.default is not dataclasses.MISSING}
_QUOTA = {f.name: f.default for f in dataclasses.fields(Quota) if f.default is not dataclasses.MISSING}
_COHORT = {f.name: f.default for f in dataclasses.fields(Cohort) if f.default is not dataclasses.MISSING}
_GANG = {f.name: f.default for f in dataclasses.fields(Gang) if f.default is not dataclasses.MISSING}

# The field types of each axis's choice (the scalar types, ``Duration``, ``Memory``, ``Name``: raylane.config.fields).
OrderingName = _one_of(ORDERING_POLICIES)
BackfillName = _one_of(BACKFILL_POLICIES)
PreemptionName = _one_of(PREEMPTION_POLICIES)
VictimCostName = _one_of(VICTIM_COST_NAMES)
AdmissionName = _one_of(ADMISSION_POLICIES)
PlacementName = _one_of(PLACEMENT_STRATEGIES)
KindName = _one_of(WORKLOAD_KINDS)
OnMaxRuntimeName = _one_of(ON_MAX_RUNTIME)
ResourceName = _one_of(RESOURCE_NAMES)

_Model = StrictModel


# ------------------------------------------------------------------------------------------------ policy


class SchedulerSpec(_Model):
    """Which policy runs on each axis of the scheduling cycle, and their parameters."""

    ordering: OrderingName = _SCHED.ordering
    backfill: BackfillName = _SCHED.backfill
    preemption: PreemptionName = _SCHED.preemption
    # How victims of equal class priority are priced: lost_work (GPU-seconds since the last checkpoint), recency or
    # remaining (the longest predicted remaining time first).
    victim_cost: VictimCostName = _SCHED.victim_cost
    admission: AdmissionName = _SCHED.admission
    max_admissions_per_cycle: int = Field(default=_SCHED.max_admissions_per_cycle, ge=1)
    # Attained GPU-time boundaries of the LAS queues; "1h" means 3600 GPU-seconds.
    las_thresholds: Tuple[Duration, ...] = _SCHED.las_thresholds
    fair_share_half_life: Duration = _SCHED.fair_share_half_life_s
    default_runtime: Duration = _SCHED.default_runtime_s
    # Hysteresis of the ``ordering`` preemption (LAS, SRTF): a lease is not stopped by it before it has run, since
    # its last (re)start, max(hysteresis_min_run, hysteresis_service_fraction x the time it had run before).
    hysteresis_min_run: Duration = _SCHED.hysteresis_min_run_s
    hysteresis_service_fraction: Annotated[float, Field(ge=0, le=100), Allowed(
        "a number >= 0 and <= 100, like 0.5 (0: no scaling with attained service)")] = \
        _SCHED.hysteresis_service_fraction
    # Elastic gangs grow into free capacity only once they have run this long since their last (re)start or resize.
    resize_interval: Duration = _SCHED.resize_interval_s

    @field_validator("las_thresholds")
    @classmethod
    def _increasing(cls, v: Tuple[float, ...]) -> Tuple[float, ...]:
        if any(b <= a for a, b in zip(v, v[1:])):
            raise _err("increasing", "strictly increasing GPU-time thresholds (durations), e.g. [1h, 10h]")
        return v

    @field_validator("fair_share_half_life", "default_runtime")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise _err("positive", "a duration > 0, like 7d or 24h")
        return v


class WorkloadClassSpec(_Model):
    """A workload class: how important its work is and what a preemption may cost it."""

    priority: int
    preemptible: bool
    # Work of a preemptible class is never preempted before it ran this long.
    min_runtime: Duration = _CLASS["min_runtime_s"]
    checkpoint_every: Duration = _CLASS["checkpoint_interval_s"]
    grace_period: Duration = _CLASS["grace_period_s"]
    retry_budget: int = Field(default=_CLASS["retry_budget"], ge=0)
    # Past this wait the queue reports the workload as late (0: no target).
    queue_time_target: Duration = _CLASS["queue_time_target_s"]
    default_placement: PlacementName = _GANG["strategy"]
    # Whether its work may be resized: only then may a spec of this class ask for ``gang.workers: {min, max}``.
    resizable: bool = _CLASS["resizable"]
    # Its work's run limit (null: none), and what is done with work that reaches it (raylane.scheduling.runlimit).
    # Waiting for capacity that a node being added could give, how long its work waits for that node before it
    # preempts anyone (raylane.control.state_scale; 0: it preempts at once). Needs growable node groups.
    wait_for_scale_up: Duration = 0.0
    # Spot nodes (labelled raylane.io/spot=true, which the cloud may reclaim): never on them, allowed, or preferred.
    spot: Literal["never", "allow", "prefer"] = "allow"
    max_runtime: Optional[Duration] = _CLASS["max_runtime_s"]
    on_max_runtime: OnMaxRuntimeName = Field(default=_CLASS["on_max_runtime"], validate_default=True)

    @field_validator("max_runtime")
    @classmethod
    def _limit_positive(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and v <= 0:
            raise _err("positive", "a duration > 0, like 2h or 3d, or null for no limit")
        return v

    @field_validator("on_max_runtime")
    @classmethod
    def _requeue_keeps_work(cls, v: str, info: ValidationInfo) -> str:
        # A requeued attempt keeps only the work up to its last checkpoint: without one within the limit, work that
        # needs longer than the limit would be requeued from the same point for ever.
        limit, every = info.data.get("max_runtime"), info.data.get("checkpoint_every")
        if v == "requeue" and limit is not None and every is not None and not 0 < every <= limit:
            raise _err("requeue", f"stop, or requeue with checkpoint_every > 0 and at most max_runtime "
                                  f"({limit:g}s): a requeued attempt keeps only the work up to its last checkpoint "
                                  f"(checkpoint_every is {every:g}s)")
        return v

    def to_core(self, name: str) -> WorkloadClass:
        return WorkloadClass(
            name=name,
            priority=self.priority,
            preemptible=self.preemptible,
            min_runtime_s=self.min_runtime,
            checkpoint_interval_s=self.checkpoint_every,
            grace_period_s=self.grace_period,
            retry_budget=self.retry_budget,
            queue_time_target_s=self.queue_time_target,
            resizable=self.resizable,
            max_runtime_s=self.max_runtime,
            wait_for_scale_up_s=self.wait_for_scale_up,
            on_max_runtime=self.on_max_runtime,
        )


class QuotaSpec(_Model):
    """One resource of a team's quota. ``null`` for a limit means unlimited (see ``raylane.scheduling.admission``)."""

    nominal: NonNegative
    borrowing_limit: Optional[NonNegative] = _QUOTA["borrowing_limit"]
    lending_limit: Optional[NonNegative] = _QUOTA["lending_limit"]

    # A field validator, not a model one: it runs (and reports) even when borrowing_limit is invalid.
    @field_validator("lending_limit")
    @classmethod
    def _lend_at_most_nominal(cls, v: Optional[float], info: ValidationInfo) -> Optional[float]:
        nominal = info.data.get("nominal")
        if v is not None and nominal is not None and v > nominal:
            raise _err("lending", f"a number from 0 to nominal ({nominal:g}), or null to lend all unused nominal quota")
        return v

    def to_core(self) -> Quota:
        return Quota(self.nominal, self.borrowing_limit, self.lending_limit)


USER_ORDERS = ("fair", "queue")


class UserRuleSpec(_Model):
    """Fairness between a team's users (``raylane.scheduling.users``). ``order``: ``fair`` orders the team's work,
    inside each class priority, by its users' decayed usage plus what they hold (least first); ``queue`` keeps the
    team queue's own order. ``max_share``: the most of the team's nominal GPU quota one user may hold (null: no
    cap); borrowing never raises it."""

    order: _one_of(USER_ORDERS) = "fair"
    max_share: Optional[Annotated[float, Field(gt=0, le=1), Allowed("a number > 0 and <= 1 (a share of the team's "
                                                                    "nominal GPUs), or null for no cap")]] = None

    def to_core(self) -> UserRule:
        return UserRule(fair=self.order == "fair", max_share=self.max_share)


class TeamSpec(_Model):
    weight: float = Field(default=_TEAM["weight"], gt=0)
    # A resource with no entry is not limited for this team.
    quotas: Dict[ResourceName, QuotaSpec] = Field(default_factory=dict)
    # What the team may spend in a calendar month (UTC), in the currency of ``prices``; null: no budget. Read by
    # cost reports and the budget alert (raylane.cost), never by admission.
    budget: Optional[Annotated[float, Field(gt=0), Allowed("a number > 0 (a month's budget, in the currency "
                                                           "of prices)")]] = None

    # The team's nearest cohort (``cohorts:``); none: the team is under the whole cluster, as in a flat policy.
    cohort: Optional[Name] = None
    # Fairness between the team's users; none: off (the team queue's own order, no per-user cap).
    users: Optional[UserRuleSpec] = None
    # Per-flavor GPU quotas: node type -> how many GPUs of nodes of that type the team may hold, pooled per node
    # type with the other teams' (raylane.scheduling.flavors). A node type with no entry is not limited by them.
    flavors: Dict[Name, QuotaSpec] = Field(default_factory=dict)

    @field_validator("flavors")
    @classmethod
    def _flavor_within_gpu_quota(cls, v: Dict[str, QuotaSpec], info: ValidationInfo) -> Dict[str, QuotaSpec]:
        gpu = (info.data.get("quotas") or {}).get("gpu")
        if gpu is None:
            return v
        ceiling = gpu.to_core().ceiling
        over = sorted(name for name, q in v.items() if q.nominal > ceiling + 1e-9)
        if over:
            raise _err("flavor_nominal", f"a flavor's nominal at most the team's GPU quota ceiling ({ceiling:g}: "
                                         f"quotas.gpu nominal + borrowing_limit); over it: {', '.join(over)}")
        return v

    @field_validator("users")
    @classmethod
    def _cap_needs_gpu_quota(cls, v: Optional[UserRuleSpec], info: ValidationInfo) -> Optional[UserRuleSpec]:
        quotas = info.data.get("quotas")
        if v is not None and v.max_share is not None and quotas is not None and "gpu" not in quotas:
            raise _err("users_max_share", "max_share only with a gpu quota (it is a share of the nominal GPUs); "
                                          "add quotas.gpu or drop max_share")
        return v

    def to_core(self, name: str, cohort: Optional[Cohort] = None) -> Team:
        return Team(name=name, quotas={r: q.to_core() for r, q in self.quotas.items()}, weight=self.weight,
                    cohort=cohort, users=None if self.users is None else self.users.to_core(),
                    flavors={t: q.to_core() for t, q in self.flavors.items()})


class CohortQuotaSpec(_Model):
    """One resource of a cohort's own quota (``raylane.scheduling.cohorts``): a nominal of its own (0: the cohort
    only groups what its members lend), how much its subtree may borrow from outside it and how much of its subtree
    quota may leave it (null: no limit)."""

    nominal: NonNegative = 0.0
    borrowing_limit: Optional[NonNegative] = _QUOTA["borrowing_limit"]
    lending_limit: Optional[NonNegative] = _QUOTA["lending_limit"]

    def to_core(self) -> Quota:
        return Quota(self.nominal, self.borrowing_limit, self.lending_limit)


class CohortSpec(_Model):
    """A node of the quota tree: teams (``teams.NAME.cohort``) and cohorts (``parent``) under it lend to each other
    first. No ``parent``: a top-level cohort, under the whole cluster."""

    parent: Optional[Name] = None
    quotas: Dict[ResourceName, CohortQuotaSpec] = Field(default_factory=dict)
    # The subtree's share under fair-share ordering, against its siblings.
    weight: float = Field(default=_COHORT["weight"], gt=0)


class HealthSpec(_Model):
    """How the control plane checks nodes and when it takes one out of service (``raylane.health``)."""

    # ``module:function`` run as a Ray task on every node; it raises (or returns False) when the node is unhealthy.
    probe: str = "raylane.health:default_probe"
    probe_interval: Duration = 30.0
    probe_timeout: Duration = 20.0
    # Consecutive failed probes that quarantine a node (0: probes never quarantine).
    probe_failures: int = Field(default=2, ge=0)
    # Gang failures attributed to one node within ``gang_failure_window`` that quarantine it (0: never).
    gang_failures: int = Field(default=3, ge=0)
    gang_failure_window: Duration = 3600.0
    # Where the default probe looks for condition files (``<node id>`` or ``all``; their text is the reason), as
    # node-problem-detector's custom plugins do. ``~`` is the home of the user the cluster runs as, on that node.
    conditions_dir: str = "~/.raylane/node-conditions"

    @field_validator("probe")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", v):
            raise _err("probe", "module:function, like raylane.health:default_probe")
        return v

    @field_validator("probe_interval", "probe_timeout", "gang_failure_window")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise _err("positive", "a duration > 0, like 30s or 1h")
        return v


class PipelinesSpec(_Model):
    """How the control plane plans and watches pipelines (``raylane.pipelines``, docs/pipelines.md)."""

    # The planner a pipeline uses unless its spec names one.
    planner: Literal["best", "heft", "olb", "cpsat"] = "best"
    # Bandwidth between two nodes for a stage's output, in GB per hour (3600: 1 GB/s); same node: no transfer.
    bandwidth_gb_per_h: Annotated[float, Field(gt=0), Allowed("a bandwidth in GB per hour > 0")] = 3600.0
    # A stage running longer than this many times its estimate makes the control plane re-plan what has not started.
    overrun: Annotated[float, Field(gt=1), Allowed("a factor > 1 of the stage's estimated duration")] = 2.0


class JournalSpec(_Model):
    """How the control plane keeps its journal from growing with its history (``raylane.control.archive``,
    docs/operations.md "Journal compaction")."""

    # An ended workload leaves memory and the journal's live tail this long after its end; it is still read by id.
    archive_after: Duration = 86400.0
    # An archived workload is deleted this long after its end, an archived audit entry this long after it was made.
    retention: Duration = 90 * 86400.0
    audit_retention: Duration = 90 * 86400.0
    # Entries appended between two compactions, and the most workloads one compaction archives (its work is bounded).
    compact_every: Annotated[int, Field(ge=1), Allowed("an integer >= 1, like 10000")] = 10_000
    compact_batch: Annotated[int, Field(ge=1), Allowed("an integer >= 1, like 5000")] = 5_000

    @field_validator("archive_after", "retention", "audit_retention")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise _err("positive", "a duration > 0, like 90d or 1h")
        return v


class ClusterPolicy(_Model):
    """Everything an operator decides for one cluster. Loaded from ``policies/*.yaml`` by ``raylane.config.loader``."""

    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    classes: Dict[Name, WorkloadClassSpec] = Field(min_length=1)
    teams: Dict[Name, TeamSpec] = Field(min_length=1)
    # Tag -> what it means; workload specs may only ask for declared tags.
    node_features: Dict[Name, str] = Field(default_factory=dict)
    # Node type -> price of one GPU-hour (for CPU-only nodes: of one node-hour), in any one currency.
    prices: Dict[Name, NonNegative] = Field(default_factory=dict)
    # The share of its monthly budget past which a team's spend raises an alert (raylane_rules.yml).
    budget_alert_share: Annotated[float, Field(gt=0, le=1), Allowed("a share of the budget: a number > 0 and <= 1, "
                                                                    "like 0.8")] = 0.8
    # The share of its monthly budget from which a team's waiting gangs ask for no new node (raylane.control.
    # state_scale); above 1, scale-up goes on past the budget until that share of it.
    budget_stop_share: Annotated[float, Field(gt=0, le=10), Allowed("a share of the budget: a number > 0 and <= 10, "
                                                                    "like 0.9")] = 0.9
    health: HealthSpec = Field(default_factory=HealthSpec)
    pipelines: PipelinesSpec = Field(default_factory=PipelinesSpec)
    journal: JournalSpec = Field(default_factory=JournalSpec)
    # The quota tree (``raylane.scheduling.cohorts``): cohort name -> its parent and own quotas. Empty: flat.
    cohorts: Dict[Name, CohortSpec] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cohort_tree(self) -> "ClusterPolicy":
        bad = cohort_errors(self)
        if bad:
            raise CoreValidationError.from_exception_data("ClusterPolicy", [
                InitErrorDetails(type=_err("cohort", allowed), loc=loc, input=value) for loc, value, allowed in bad])
        return self

    def to_scheduler_config(self) -> SchedulerConfig:
        s = self.scheduler
        return SchedulerConfig(
            ordering=s.ordering,
            admission=s.admission,
            backfill=s.backfill,
            preemption=s.preemption,
            victim_cost=s.victim_cost,
            max_admissions_per_cycle=s.max_admissions_per_cycle,
            las_thresholds=tuple(s.las_thresholds),
            fair_share_half_life_s=s.fair_share_half_life,
            default_runtime_s=s.default_runtime,
            hysteresis_min_run_s=s.hysteresis_min_run,
            hysteresis_service_fraction=s.hysteresis_service_fraction,
            resize_interval_s=s.resize_interval,
        )

    def workload_class(self, name: str) -> WorkloadClass:
        spec = self.classes.get(name)
        if spec is None:
            raise UnknownNameError("workload class", name, list(self.classes))
        return spec.to_core(name)

    def core_cohorts(self) -> Dict[str, Cohort]:
        """Each cohort as the core knows it, its parent chain built in (the policy has no cycle)."""
        out: Dict[str, Cohort] = {}

        def build(name: str) -> Cohort:
            got = out.get(name)
            if got is None:
                c = self.cohorts[name]
                got = out[name] = Cohort(name, {r: q.to_core() for r, q in c.quotas.items()},
                                         build(c.parent) if c.parent is not None else None, c.weight)
            return got

        for name in self.cohorts:
            build(name)
        return out

    def core_teams(self) -> Dict[str, Team]:
        cohorts = self.core_cohorts() if self.cohorts else {}
        return {name: t.to_core(name, cohorts.get(t.cohort) if t.cohort is not None else None)
                for name, t in self.teams.items()}


def cohort_errors(policy: ClusterPolicy) -> List[Tuple[Tuple[Any, ...], Any, str]]:
    """Every way ``policy``'s cohort tree cannot hold, as (field location, value, what is allowed): a team's cohort
    or a cohort's parent that is not a cohort of the policy; a parent chain that leads back to its cohort (a cycle,
    reported once, at its first cohort in file order); a cohort named like a team; a cohort with no team under it
    (its quota would serve no one); and a cohort's lending limit above its subtree quota (its own nominal plus what
    its members lend: it cannot lend more than that). The last is checked only once the tree itself is sound."""
    cohorts, teams = policy.cohorts, policy.teams
    bad: List[Tuple[Tuple[Any, ...], Any, str]] = []
    known = f"one of {_names(cohorts)}"
    for name, t in teams.items():
        if t.cohort is not None and t.cohort not in cohorts:
            bad.append((("teams", name, "cohort"), t.cohort, f"a cohort of the policy: {known} (or omit it: the "
                                                                f"team is then under the whole cluster)"))
    for name, c in cohorts.items():
        if name in teams:
            bad.append((("cohorts", name), name, f"a name no team has (team {name} exists): teams and cohorts are "
                                                   f"nodes of one tree"))
        if c.parent is not None and c.parent not in cohorts:
            bad.append((("cohorts", name, "parent"), c.parent,
                        f"a cohort of the policy: {known} (or omit it: a top-level cohort)"))
    in_cycle: set = set()
    for name in cohorts:
        chain, c = [name], cohorts[name].parent
        while c is not None and c in cohorts and c not in chain and c not in in_cycle:
            chain.append(c)
            c = cohorts[c].parent
        if c is not None and c in chain:
            loop = chain[chain.index(c):]
            in_cycle.update(loop)
            bad.append((("cohorts", loop[0], "parent"), cohorts[loop[0]].parent,
                        f"a parent that does not lead back to {loop[0]} ({' > '.join(loop + [loop[0]])} is a cycle)"))
    if bad:
        return bad
    used = {t.cohort for t in teams.values() if t.cohort is not None}
    for name in list(used):
        c = cohorts[name].parent
        while c is not None and c not in used:
            used.add(c)
            c = cohorts[c].parent
    for name in cohorts:
        if name not in used:
            bad.append((("cohorts", name), name, "a cohort with at least one team under it (no team names it or a "
                                                 "cohort below it): its quota would serve no one"))
    if bad:
        return bad
    # The core's arithmetic: one definition of what a cohort can lend.
    tree = CohortTree(policy.core_teams())
    for name, c in cohorts.items():
        for r, q in c.quotas.items():
            s, g, _ = tree.limits[name][r]
            if q.lending_limit is not None and q.lending_limit > s + 1e-9:
                bad.append((("cohorts", name, "quotas", r, "lending_limit"), q.lending_limit,
                            f"a number from 0 to {s:g} (what cohort {name} can lend: its own nominal {q.nominal:g} "
                            f"plus what its members lend, {s - q.nominal:g}), or null to lend all of it"))
    return bad


# -------------------------------------------------------------------------------------------------- spec


WORKER_COUNT_ALLOWED = "an integer >= 1"
WORKERS_ALLOWED = (
    "an integer >= 1 (a fixed gang), or {min: N, max: M} with integers 1 <= N <= M (an elastic gang, for a class "
    "with resizable: true)"
)
_COUNT = pydantic.TypeAdapter(Annotated[int, Field(ge=1)])


def _check_count(value: Any) -> int:
    # ``true`` is not a count; "3" and 3.0 are, as they were before gangs could be elastic.
    if isinstance(value, bool):
        raise _err("workers", WORKER_COUNT_ALLOWED)
    try:
        return _COUNT.validate_python(value)
    except pydantic.ValidationError:
        raise _err("workers", WORKER_COUNT_ALLOWED) from None


WorkerCount = Annotated[int, BeforeValidator(_check_count), Allowed(WORKER_COUNT_ALLOWED)]


class WorkersRange(_Model):
    """``gang.workers: {min: N, max: M}``: the sizes an elastic gang may run at. It is submitted at ``min``; the
    scheduler may admit it larger, grow it into free capacity and shrink it back, never outside [min, max]."""

    min: WorkerCount
    max: WorkerCount

    @field_validator("max")
    @classmethod
    def _at_least_min(cls, v: int, info: ValidationInfo) -> int:
        lo = info.data.get("min")
        if lo is not None and v < lo:
            raise _err("workers", f"an integer >= min ({lo}): the most workers the gang may grow to")
        return v


def _check_workers(value: Any, handler: Callable[[Any], Any]) -> Any:
    """An int or a ``{min, max}`` mapping; each path reports its own errors (a union would report both)."""
    if isinstance(value, WorkersRange):
        return value
    if isinstance(value, Mapping):
        keys = set(value)
        if keys != {"min", "max"}:
            missing = ", ".join(sorted({"min", "max"} - keys, key=str))
            extra = ", ".join(sorted((str(k) for k in keys - {"min", "max"})))
            why = "; ".join(x for x in (f"missing {missing}" if missing else "", f"unknown {extra}" if extra else "")
                            if x)
            raise _err("workers", f"{WORKERS_ALLOWED} ({why})")
        # Its ValidationError carries the inner path: the error reads gang.workers.min / gang.workers.max.
        return WorkersRange.model_validate(dict(value))
    try:
        return _check_count(value)
    except PydanticCustomError:
        raise _err("workers", WORKERS_ALLOWED) from None


Workers = Annotated[Union[int, WorkersRange], WrapValidator(_check_workers), Allowed(WORKERS_ALLOWED)]


def spec_workers(value: Any) -> int:
    """The size a gang is submitted at from a spec's ``gang.workers`` as written (an int, or ``{min, max}``: min);
    for readers of a spec dict that was validated before (a launcher, the pipeline planner)."""
    if isinstance(value, WorkersRange):
        return value.min
    if isinstance(value, Mapping):
        return int(value["min"])
    return int(value)


class GangSpec(_Model):
    # An int, or {min, max} for an elastic gang; ``lo``/``hi`` read either.
    workers: Workers = 1
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    # None: the class's default_placement.
    placement: Optional[PlacementName] = None
    # For the ``group`` placement: the node label all workers must share.
    group_by: str = Field(default=_GANG["group_by"], min_length=1)
    features: List[Name] = Field(default_factory=list)
    # Flavors: the node types it may run on, most preferred first (placed on the first with room now); empty: any.
    node_types: List[Name] = Field(default_factory=list, max_length=16)

    @field_validator("node_types")
    @classmethod
    def _each_type_once(cls, v: List[str]) -> List[str]:
        seen = [t for i, t in enumerate(v) if t in v[:i]]
        if seen:
            raise _err("node_types", f"each node type once, most preferred first (named twice: {', '.join(seen)})")
        return v

    @property
    def lo(self) -> int:
        """The size it is submitted at: the fewest workers it may run with."""
        return self.workers.min if isinstance(self.workers, WorkersRange) else self.workers

    @property
    def hi(self) -> int:
        return self.workers.max if isinstance(self.workers, WorkersRange) else self.workers

    @property
    def elastic(self) -> bool:
        return self.lo < self.hi

    @property
    def workers_value(self) -> Any:
        """``workers`` as the user wrote it (an int or a dict), for error messages."""
        w = self.workers
        return {"min": w.min, "max": w.max} if isinstance(w, WorkersRange) else w


INTENT_ALLOWED = "a sentence saying why this run exists"


def _check_intent(value: str) -> str:
    if not value.strip():
        raise _err("intent", INTENT_ALLOWED)
    return value


Intent = Annotated[str, AfterValidator(_check_intent), Allowed(INTENT_ALLOWED)]


class RunMetadata(_Model):
    """Why the run exists and what it ran on; recorded with the run (e.g. as MLflow tags)."""

    intent: Intent
    owner: Optional[str] = None
    # None: filled in at submit (e.g. the git commit of the working tree).
    code_version: Optional[str] = None
    data_snapshot: Optional[str] = None


class StageOf(_Model):
    """Set by the control plane on a pipeline's stage (``raylane.pipelines``): which pipeline (its id), which stage,
    and the pipeline's MLflow run, which the stage's run becomes a child of. A user writes ``kind: pipeline`` specs,
    never this."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,80}$")]
    stage: Name
    parent_run_id: Optional[str] = None


class WorkloadSpec(_Model):
    """One submission. Kind-specific sections (``sweep:``, ``serve:``) are to be added as optional fields, each
    checked against ``kind`` by a model validator, so specs written today stay valid."""

    name: Name
    team: Name
    class_: Name = Field(alias="class")
    kind: KindName = DEFAULT_KIND
    gang: GangSpec = Field(default_factory=GangSpec)
    runtime_estimate: Optional[Duration] = None
    # The user's code (raylane.entrypoints): ``package.module:function`` for kinds train, eval and batch, or a
    # ``command`` (program and arguments) for the one-shot kinds eval and batch. Resolved and checked at submit.
    entrypoint: Optional[str] = Field(default=None, min_length=1)
    command: Optional[List[str]] = Field(default=None, min_length=1, max_length=1000)
    # Passed to the workload unread.
    config: Dict[str, Any] = Field(default_factory=dict)
    run: RunMetadata
    # A pipeline's stage: set by the control plane (raylane.pipelines), never by users.
    pipeline: Optional[StageOf] = None
    # kind: serve only (raylane.config.serve). Validated even when absent, to require it for kind: serve.
    serve: Optional[ServeSpec] = Field(default=None, validate_default=True)

    @field_validator("serve")
    @classmethod
    def _serve_iff_kind_serve(cls, v: Optional[ServeSpec], info: ValidationInfo) -> Optional[ServeSpec]:
        kind = info.data.get("kind")
        if kind == "serve" and v is None:
            raise _err("serve", "required for kind: serve: a mapping with fields " + ", ".join(ServeSpec.model_fields))
        if kind is not None and kind != "serve" and v is not None:
            raise _err("serve", f"only for kind: serve (this spec's kind is {kind}); remove the section")
        return v

    # kind: tune only (raylane.config.sweep). Validated even when absent, to require it for kind: tune.
    sweep: Optional[SweepSpec] = Field(default=None, validate_default=True)

    @field_validator("sweep")
    @classmethod
    def _sweep_iff_kind_tune(cls, v: Optional[SweepSpec], info: ValidationInfo) -> Optional[SweepSpec]:
        kind = info.data.get("kind")
        if kind == "tune" and v is None:
            raise _err("sweep", "required for kind: tune: a mapping with fields " + ", ".join(SweepSpec.model_fields))
        if kind is not None and kind != "tune" and v is not None:
            raise _err("sweep", f"only for kind: tune (this spec's kind is {kind}); remove the section")
        gang: Optional[GangSpec] = info.data.get("gang")
        # Each trial slot is 1 worker of sweep.resources; a gang may add features and placement, not a size.
        if v is not None and gang is not None and gang.hi != 1:
            raise _err("sweep", f"gang.workers 1 for kind: tune (got {gang.workers_value}): each trial slot is 1 "
                                f"worker of sweep.resources")
        return v

    # kind: train only (raylane.config.datasets): named Ray Data sources handed to the TorchTrainer as datasets=,
    # and Ray Train's DataConfig for them. They change nothing the scheduler sees (the gang's resources are its own).
    datasets: Dict[DatasetName, DatasetSource] = Field(default_factory=dict)
    data_config: Optional[DataConfigSpec] = None

    @field_validator("datasets")
    @classmethod
    def _datasets_for_train(cls, v: Dict[str, DatasetSource], info: ValidationInfo) -> Dict[str, DatasetSource]:
        kind = info.data.get("kind")
        if v and kind is not None and kind != "train":
            raise _err("datasets", f"only for kind: train (this spec's kind is {kind}); remove the section")
        return v

    @field_validator("data_config")
    @classmethod
    def _data_config_of_datasets(cls, v: Optional[DataConfigSpec], info: ValidationInfo) -> Optional[DataConfigSpec]:
        if v is None or "datasets" not in info.data:  # the datasets have errors of their own
            return v
        if not info.data["datasets"]:
            raise _err("data_config", "only with datasets: (Ray Train's DataConfig of the spec's datasets); add "
                                      "datasets or remove data_config")
        bad = split_name_errors(v, info.data["datasets"])
        if bad is not None:
            raise bad  # its errors read data_config.datasets_to_split[i]
        return v

    def to_core(self, workload_id: str, policy: ClusterPolicy, submit_time: float) -> Workload:
        """The core's ``Workload``; raises ``ValidationError`` when the spec does not fit the policy."""
        errors = validate_spec_against_policy(self, policy)
        if errors:
            raise ValidationError(f"workload {self.name}", errors)
        cls_spec = policy.classes[self.class_]
        g = self.gang
        # An elastic gang is submitted at its min (what submit-time feasibility checks: min fits somewhere).
        gang = Gang(
            workers=g.lo,
            per_worker=g.resources.to_core(),
            strategy=g.placement or cls_spec.default_placement,
            features=frozenset(g.features),
            group_by=g.group_by,
            min_workers=g.lo if g.elastic else None,
            max_workers=g.hi if g.elastic else None,
            node_types=tuple(g.node_types),
            spot=cls_spec.spot,
        )
        return Workload(
            id=workload_id,
            team=self.team,
            cls=cls_spec.to_core(self.class_),
            gang=gang,
            submit_time=submit_time,
            runtime_estimate_s=self.runtime_estimate,
            data_snapshot=self.run.data_snapshot,
            kind=self.kind,
            user=self.run.owner,
        )


def _names(names) -> str:
    names = list(names)
    return ", ".join(names) if names else "(none declared)"


def policy_name_errors(
    policy: ClusterPolicy, *, team: Optional[str] = None, class_: Optional[str] = None, features: Sequence[str] = ()
) -> List[Tuple[str, Any, str]]:
    """The names a spec uses that ``policy`` does not declare (None: not checked)."""
    errors: List[Tuple[str, Any, str]] = []
    if team is not None and team not in policy.teams:
        errors.append(("team", team, f"a team of the policy: one of {_names(policy.teams)}"))
    if class_ is not None and class_ not in policy.classes:
        errors.append(("class", class_, f"a class of the policy: one of {_names(policy.classes)}"))
    for i, tag in enumerate(features):
        if tag not in policy.node_features:
            errors.append(
                (f"gang.features[{i}]", tag, f"a node feature declared by the policy: one of {_names(policy.node_features)}")
            )
    return errors


def validate_spec_against_policy(spec: WorkloadSpec, policy: ClusterPolicy) -> List[Tuple[str, Any, str]]:
    """Every way ``spec`` does not fit ``policy``, as (field path, value, what is allowed). Empty when it fits."""
    errors = policy_name_errors(policy, team=spec.team, class_=spec.class_, features=spec.gang.features)
    cls_spec = policy.classes.get(spec.class_)
    if spec.gang.elastic and cls_spec is not None and not cls_spec.resizable:
        resizable = [n for n, c in policy.classes.items() if c.resizable]
        errors.append(
            (
                "gang.workers",
                spec.gang.workers_value,
                f"an integer: class {spec.class_} is not resizable (resizable: false in the policy), so its gangs"
                f" have a fixed size; an elastic {{min, max}} needs a class with resizable: true: "
                f"{_names(resizable)}",
            )
        )
    # A gang larger than its team's quota ceiling could never be admitted; say so now rather than queue forever.
    team = policy.teams.get(spec.team)
    if team is not None and policy.scheduler.admission == "quota":
        per_worker = spec.gang.resources.to_core()
        for r, q in team.quotas.items():
            # An elastic gang needs only its min to be admitted at all.
            need = per_worker.get(r) * spec.gang.lo
            ceiling = q.to_core().ceiling
            if need > ceiling + 1e-9:
                errors.append(
                    (
                        f"gang.resources.{r}",
                        per_worker.get(r),
                        f"at most {ceiling:g} {r} for the whole gang ({spec.gang.lo} workers): team {spec.team}"
                        f" may hold {q.nominal:g} nominal + {q.borrowing_limit:g} borrowed",
                    )
                )
        # Named node types whose flavor quotas are all too small for the gang: it could never be placed.
        need = per_worker.gpu * spec.gang.lo
        types = list(spec.gang.node_types)
        ceilings = [team.flavors[t].to_core().ceiling if t in team.flavors else math.inf for t in types]
        if types and need > 0 and all(need > c + 1e-9 for c in ceilings):
            errors.append((
                "gang.node_types", types,
                f"a node type on which team {spec.team}'s flavor quota can hold the gang's {need:g} GPUs: it may hold "
                f"at most " + ", ".join(f"{c:g} on {t}" for t, c in zip(types, ceilings))
                + f" (teams.{spec.team}.flavors: nominal + borrowing_limit)"))
    return errors
