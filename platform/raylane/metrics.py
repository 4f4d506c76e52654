"""Every Prometheus metric Raylane exports, defined in this one module; the help text of each documents its labels.

Metrics go through ``ray.util.metrics``, so each node's Ray metrics agent exports them on its metrics export port
(``ray.nodes()[i]["MetricsExportPort"]``, ``/metrics``), with Ray's ``ray_`` prefix and its own labels
(``SessionName``, ``NodeAddress``, ...) added: ``raylane_serve_replicas_running`` is scraped as
``ray_raylane_serve_replicas_running``. A process records through its own Ray worker, so the Ray object behind a
metric is created on first use in that process (creating one before ``ray.init`` fails); until then, and outside
Ray, a value is only kept in the in-process mirror that ``snapshot()`` reads, which is what tests and the
benchmark look at without scraping.

Words
- *app*: a serving workload's name (its Serve application name, the spec's ``name``).
- *path*: how a serving replica got its GPU: ``free`` (capacity was free), ``reclaim`` (training was preempted for
  it; its lease admission followed a preemption chosen for it).
- *team*, *workload_class*: the workload's team and class, as in the policy.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

__all__ = [
    "Metric",
    "ALL",
    "snapshot",
    "SERVE_REPLICAS_WANTED",
    "SERVE_REPLICAS_RUNNING",
    "SERVE_REPLICA_LEASES_PENDING",
    "SERVE_ONGOING_REQUESTS",
    "SERVE_RECLAIMS",
    "SERVE_RECLAIMED_GPUS",
    "SERVE_DEMAND_TO_SERVING",
    "SERVE_LATENCY_OBJECTIVE",
    "QUEUE_LENGTH",
    "ADMISSIONS",
    "PREEMPTIONS",
    "LEASES_RUNNING",
    "GPUS_HELD",
    "COHORT_GPUS",
    "QUEUE_WAIT",
    "QUEUE_ETA_WAIT",
    "QUEUE_ETA_WAIT_LOW",
    "QUEUE_ETA_WAIT_HIGH",
    "ETA_SECONDS",
    "CYCLE_SECONDS",
    "COST",
    "IDLE_COST",
    "TEAM_SPEND",
    "TEAM_BUDGET",
    "STRANDED_GPUS",
]

_KINDS = ("counter", "gauge", "histogram")
_lock = threading.Lock()
_mirror: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = {}


@dataclass(frozen=True)
class Metric:
    """One metric: its name, kind, help text (naming its labels) and label keys. Thread-safe to record.

    ``set`` (gauges), ``inc`` (counters) and ``observe`` (histograms) take the labels as keyword arguments; every
    label key must be given, and no other.
    """

    name: str
    kind: str
    help: str
    labels: Tuple[str, ...]
    boundaries: Tuple[float, ...] = ()

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"kind: got {self.kind!r}; allowed: one of {', '.join(_KINDS)}")

    def set(self, value: float, **labels: str) -> None:
        self._record("gauge", value, labels)

    def inc(self, value: float = 1.0, **labels: str) -> None:
        self._record("counter", value, labels)

    def observe(self, value: float, **labels: str) -> None:
        self._record("histogram", value, labels)

    def _record(self, kind: str, value: float, labels: Mapping[str, str]) -> None:
        if kind != self.kind:
            raise TypeError(f"{self.name} is a {self.kind}; it cannot {_VERB[kind]}")
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name}: labels {sorted(labels)}; allowed: exactly {', '.join(self.labels)}")
        tags = {k: str(v) for k, v in labels.items()}
        key = (self.name, tuple(sorted(tags.items())))
        with _lock:
            if kind == "gauge":
                _mirror[key] = float(value)
            elif kind == "counter":
                _mirror[key] = _mirror.get(key, 0.0) + float(value)
            else:  # the mirror keeps a histogram's count and sum
                _mirror[key + ("count",)] = _mirror.get(key + ("count",), 0.0) + 1
                _mirror[key + ("sum",)] = _mirror.get(key + ("sum",), 0.0) + float(value)
        ray_metric = _ray_metric(self)
        if ray_metric is not None:
            getattr(ray_metric, {"gauge": "set", "counter": "inc", "histogram": "observe"}[kind])(value, tags=tags)


_VERB = {"gauge": "be set", "counter": "be incremented", "histogram": "observe a value"}
_ray_metrics: Dict[str, object] = {}


def _ray_metric(m: Metric) -> Optional[object]:
    """The ``ray.util.metrics`` object of ``m`` in this process, created on first use; None outside Ray. A process
    that never imported Ray is outside it: Ray is not imported here (Ray-free code such as the control plane's state
    machine records metrics, and importing Ray takes most of a second)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    with _lock:
        obj = _ray_metrics.get(m.name)
        if obj is None:
            from ray.util import metrics as rm

            if m.kind == "gauge":
                obj = rm.Gauge(m.name, description=m.help, tag_keys=m.labels)
            elif m.kind == "counter":
                obj = rm.Counter(m.name, description=m.help, tag_keys=m.labels)
            else:
                obj = rm.Histogram(m.name, description=m.help, boundaries=list(m.boundaries), tag_keys=m.labels)
            _ray_metrics[m.name] = obj
        return obj


def snapshot(name: Optional[str] = None) -> Dict[Tuple, float]:
    """What this process recorded: ``{(name, ((label, value), ...)[, "count"|"sum"]): value}``, for one metric or
    all. Gauges hold their last value, counters their total, histograms their count and sum."""
    with _lock:
        return {k: v for k, v in _mirror.items() if name is None or k[0] == name}


# ------------------------------------------------------------------------------------------------ serving

SERVE_REPLICAS_WANTED = Metric(
    "raylane_serve_replicas_wanted", "gauge",
    "Replicas the serving driver's autoscaler wants for a deployment now (after its up/down-scale delays). "
    "Labels: app (serving workload name), team.",
    ("app", "team"))
SERVE_REPLICAS_RUNNING = Metric(
    "raylane_serve_replicas_running", "gauge",
    "Replicas of a deployment that Ray Serve reports RUNNING. Labels: app, team.",
    ("app", "team"))
SERVE_REPLICA_LEASES_PENDING = Metric(
    "raylane_serve_replica_leases_pending", "gauge",
    "Replica leases submitted to the control actor and not yet admitted: the shortfall of GPUs for a deployment. "
    "Labels: app, team.",
    ("app", "team"))
SERVE_ONGOING_REQUESTS = Metric(
    "raylane_serve_ongoing_requests", "gauge",
    "Requests accepted by a deployment's replicas and not yet answered, summed over its running replicas, as the "
    "autoscaler last read them. Labels: app, team.",
    ("app", "team"))
SERVE_RECLAIMS = Metric(
    "raylane_serve_reclaims_total", "counter",
    "Replica leases whose admission preempted other work (GPUs reclaimed from preemptible training). "
    "Labels: app, team (the serving team), victim_team (the team of the preempted work).",
    ("app", "team", "victim_team"))
SERVE_RECLAIMED_GPUS = Metric(
    "raylane_serve_reclaimed_gpus_total", "counter",
    "GPUs of the work preempted for a deployment's replicas (a whole gang stops even when the replica needs fewer). "
    "Labels: app, team, victim_team.",
    ("app", "team", "victim_team"))
SERVE_DEMAND_TO_SERVING = Metric(
    "raylane_serve_demand_to_serving_seconds", "histogram",
    "Seconds from a replica's demand (its lease submitted to the control actor) to the new replica RUNNING in Ray "
    "Serve (ready for requests). Labels: app, team, path (free: the GPU was free; reclaim: training was preempted "
    "for it).",
    ("app", "team", "path"),
    (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0, 120.0, 300.0))
SERVE_LATENCY_OBJECTIVE = Metric(
    "raylane_serve_latency_objective_seconds", "gauge",
    "The p99 request latency a deployment is sized for (its spec's latency_objective_ms), to plot beside Ray "
    "Serve's own request latency histograms. Labels: app, team.",
    ("app", "team"))

# ---------------------------------------------------------------------------------------- control plane
# Defined here, with the rest; the control actor records them.

QUEUE_LENGTH = Metric(
    "raylane_queue_length", "gauge",
    "Workloads waiting for admission. Labels: team, workload_class.",
    ("team", "workload_class"))
ADMISSIONS = Metric(
    "raylane_admissions_total", "counter",
    "Workloads admitted (a reservation made), counting each re-admission after a preemption. Labels: team, "
    "workload_class, borrowing ('true' when the admission borrowed quota from other teams).",
    ("team", "workload_class", "borrowing"))
PREEMPTIONS = Metric(
    "raylane_preemptions_total", "counter",
    "Leases preempted. Labels: team, workload_class (of the preempted workload), preemptor_class (class of the "
    "workload it made room for), outcome (graceful: yielded within the grace period; forced: stopped after it).",
    ("team", "workload_class", "preemptor_class", "outcome"))
RESIZES = Metric(
    "raylane_resizes_total", "counter",
    "Resizes of running elastic gangs the control actor carried out (each one a checkpoint and a restart at the "
    "new size). Labels: team, workload_class, direction (grow: into free capacity; shrink: to make room, instead "
    "of a preemption).",
    ("team", "workload_class", "direction"))
LEASES_RUNNING = Metric(
    "raylane_leases", "gauge",
    "Leases held (admitted, running or preempting). Labels: team, workload_class.",
    ("team", "workload_class"))
GPUS_HELD = Metric(
    "raylane_team_gpus", "gauge",
    "GPUs a team's leases hold, and its quota. Labels: team, what (held, nominal, ceiling).",
    ("team", "what"))
COHORT_GPUS = Metric(
    "raylane_cohort_gpus", "gauge",
    "A quota cohort's GPUs (policies with cohorts only). Labels: cohort, what (nominal: its subtree's nominal "
    "quota; used: what its teams hold; borrowed: held beyond its nominal; lendable: its idle nominal others may use).",
    ("cohort", "what"))
QUEUE_WAIT = Metric(
    "raylane_queue_wait_seconds", "histogram",
    "Seconds from submit (or requeue after a preemption) to admission. Labels: team, workload_class.",
    ("team", "workload_class"),
    (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0, 4 * 3600.0))
CYCLE_SECONDS = Metric(
    "raylane_cycle_seconds", "histogram",
    "Wall seconds of one scheduling cycle in the control actor (the pure core's cycle(); garbage collection is "
    "paused inside it).",
    (),
    (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))
QUEUE_ETA_WAIT = Metric(
    "raylane_queue_eta_wait_seconds", "gauge",
    "The longest forecast wait, from now to its estimated start, of a pending workload (raylane.forecast; -1: none "
    "pending, or the forecast was not run: more pending than it is run for). Labels: team, workload_class.",
    ("team", "workload_class"))
QUEUE_ETA_WAIT_LOW = Metric(
    "raylane_queue_eta_wait_low_seconds", "gauge",
    "The low end of the forecast waits' interval: the longest wait of a pending workload if all work runs for the "
    "10th percentile of its learned runtime (raylane.forecast.forecast_interval, Eta.start_low; -1: none pending, no "
    "forecast, or no runtime learned). Labels: team, workload_class.",
    ("team", "workload_class"))
QUEUE_ETA_WAIT_HIGH = Metric(
    "raylane_queue_eta_wait_high_seconds", "gauge",
    "The high end of the forecast waits' interval: the longest wait of a pending workload if all work runs for the "
    "90th percentile of its learned runtime (Eta.start_high; a start past the forecast's 7-day horizon counts as "
    "the horizon; -1: none pending, no forecast, or no runtime learned). Labels: team, workload_class.",
    ("team", "workload_class"))
ETA_SECONDS = Metric(
    "raylane_eta_forecast_seconds", "histogram",
    "Wall seconds of one queue forecast in the control actor (raylane.forecast; run at most every 10 s).",
    (),
    (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))

# ------------------------------------------------------------------------------------------------- nodes
NODE_STATE = Metric(
    "raylane_node_state", "gauge",
    "1 for a node's service state, 0 for the others (raylane.control.nodes). Labels: node (Ray node id), node_type, "
    "state (ready, cordoned, draining, drained, quarantined).",
    ("node", "node_type", "state"))
NODE_QUARANTINES = Metric(
    "raylane_node_quarantines_total", "counter",
    "Nodes taken out of service automatically (failed probes, or gangs of several workloads failing there). "
    "Labels: node_type.",
    ("node_type",))
NODE_PROBES = Metric(
    "raylane_node_probes_total", "counter",
    "Node probes run by the control plane. Labels: outcome (ok, failed).",
    ("outcome",))

# ------------------------------------------------------------------------------------------ fragmentation
STRANDED_GPUS = Metric(
    "raylane_stranded_gpus", "gauge",
    "Free GPUs on nodes in service that no waiting gang (one its team's quota would admit now) could use, counted "
    "while some waiting gang is blocked by where the free GPUs are rather than by their number "
    "(raylane.scheduling.fragmentation); 0 when nothing GPU-bound waits. Labels: node_type ('-' when unset).",
    ("node_type",))

# ---------------------------------------------------------------------------------------------------- cost
# The control actor records these from its journal (raylane.cost), every COST_EXPORT_TICKS ticks: the counters by
# the spend since its last export (from its own start: a restarted actor's counters start again at 0), the gauges
# from the whole journal.
COST = Metric(
    "raylane_cost_total", "counter",
    "Spend on leased GPUs: GPU-hours times the price of the node type (policy prices), in the prices' currency. "
    "Labels: team, workload_class, node_type (unpriced node types are not counted).",
    ("team", "workload_class", "node_type"))
IDLE_COST = Metric(
    "raylane_idle_cost_total", "counter",
    "What GPUs that no lease held cost (present nodes, cordoned and drained ones included), in the prices' "
    "currency. Labels: node_type.",
    ("node_type",))
TEAM_SPEND = Metric(
    "raylane_team_spend", "gauge",
    "A team's spend in the current calendar month (UTC), from the journal, in the prices' currency. Labels: team.",
    ("team",))
TEAM_BUDGET = Metric(
    "raylane_team_budget", "gauge",
    "A team's monthly budget (policy teams.<team>.budget) and the spend that raises the budget alert "
    "(budget_alert_share of it); -1 for a team with no budget. Labels: team, what (monthly, alert).",
    ("team", "what"))

ALL: Tuple[Metric, ...] = (
    SERVE_REPLICAS_WANTED, SERVE_REPLICAS_RUNNING, SERVE_REPLICA_LEASES_PENDING, SERVE_ONGOING_REQUESTS,
    SERVE_RECLAIMS, SERVE_RECLAIMED_GPUS, SERVE_DEMAND_TO_SERVING, SERVE_LATENCY_OBJECTIVE,
    QUEUE_LENGTH, ADMISSIONS, PREEMPTIONS, LEASES_RUNNING, GPUS_HELD, COHORT_GPUS, QUEUE_WAIT, CYCLE_SECONDS,
    QUEUE_ETA_WAIT, QUEUE_ETA_WAIT_LOW, QUEUE_ETA_WAIT_HIGH, ETA_SECONDS,
    NODE_STATE, NODE_QUARANTINES, NODE_PROBES, STRANDED_GPUS,
    COST, IDLE_COST, TEAM_SPEND, TEAM_BUDGET,
)
