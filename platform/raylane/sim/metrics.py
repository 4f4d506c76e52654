"""The figures of a replay, computed from a ``SimResult``: JCT, queueing delay, makespan, utilization, fairness.

This module owns the definitions (they are what ``docs/simulator.md`` and the JSON report promise):
- *JCT*: finish minus submit, of the jobs that finished. Average and p50/p95/p99.
- *queueing delay*: first start minus submit (time to first GPU), of the jobs that started. p50/p95/p99 and mean.
  A preemptive policy can start every job at once and stop it later, so beside it:
- *wait*: JCT minus duration, of the jobs that finished: all the time a job was not doing useful work (queued
  first, queued again after preemptions, and redoing work lost to them).
- *makespan*: last finish minus first submit.
- *utilization*: GPUs held by leases over GPUs in the cluster, time-weighted, from the first submit to the last
  finish; *goodput* is the part of it that was not lost to preemptions.
- *share*: a team's part of all GPU-seconds used; its *entitlement* is its part of the nominal GPU quotas, or of
  the team weights where no team has a GPU quota; *demand* is its part of the trace's GPU-seconds.
- *finish-time fairness*: per team, the mean of JCT / duration over its jobs (1: as if each job had the cluster to
  itself; Themis' rho with the whole cluster as the isolated share); the spread is the worst team's over the best's.
- *preemptions per job*: mean over finished jobs, the largest, and the fraction of jobs preempted at least once.
  Only the scheduler's preemptions: drains and failures are counted apart (``outages``).
- *GPU-hours lost to preemption*: the work the scheduler's preemptions threw away (each victim's GPUs times its
  progress since its last checkpoint, or its start), ``outages.lost_gpu_hours.preemption``; a headline figure, as
  it is what the victim cost (``SchedulerConfig.victim_cost``) spends less of.
- *preemptions per job-hour* (thrash): per finished job, its preemptions over the hours it ran (its *runtime*:
  the time its leases held GPUs, i.e. its duration plus the work it lost and had to redo); the mean over finished
  jobs, the largest (the worst-thrashed job, named in ``worst``) and how many jobs exceed 1 per hour.
- *stranded GPUs*: free GPUs that no waiting gang could use because of how they are spread
  (``raylane.scheduling.fragmentation``), after each instant; time-weighted mean, p95 and largest, first submit
  to last finish, and the mean as a share of the cluster's GPUs. Compares placement policies.
- *outages*: node failures and drains played; requeues and GPU-hours of work lost by cause (preemption, drain,
  failure); drain time (drain start to the node empty; mean and largest, over drains that emptied); GPU-hours of
  capacity down (failed nodes until repaired).
- *resizes*: the resizes of elastic jobs (the core's ``Resize`` decisions): in all, per finished job, how many
  jobs were resized, and the GPU-hours their restart overheads held without progress.
- *capacity* (only for a cluster with growable, priced or spot groups; ``raylane.sim.autoscaled``): GPU-hours
  bought (each node's node-hours from launch to removal times its GPUs), their cost (times the group's price per
  GPU-hour) split spot and on-demand, *bought utilization* (GPU-hours held by leases over GPU-hours bought), nodes
  joined (time-weighted mean and largest), and per group its launches, cancellations, idle removals, reclaims and
  cost; and the same bought GPU-hours and cost over the *submit window* (first to last submit), where a trace that
  is a slice of a steady stream is comparable across clusters (after it, a fixed cluster idles while the last long
  jobs run, which the whole replay's figures charge it for). A fixed cluster's report has no such section, so it
  reads as it always has.
- *run limits* (only when a class has a ``max_runtime``; ``raylane.scheduling.runlimit``): requeues at the limit
  (``on_max_runtime: requeue``; also under ``outages.requeues.run_limit``), the GPU-hours of work they lost (past
  the last checkpoint), and jobs ended unfinished by ``on_max_runtime: stop``. A replay without limits has no such
  section, so it reads as it always has.
A partial replay (stopped early) reports these over what finished, counts the rest, and says ``partial: true``.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

from raylane.sim.engine import SimResult

__all__ = ["summarize", "dist", "capacity", "run_limits", "RUN_LIMIT_FIGURES", "thrash", "cycle_latency", "percentile", "binned", "time_weighted_quantile", "FIGURES", "OUTAGE_FIGURES", "CAPACITY_FIGURES"]

# The headline figures, in table order: (key in the summary, label, unit).
FIGURES: Tuple[Tuple[str, str, str], ...] = (
    ("jct.mean", "JCT avg", "s"),
    ("jct.p50", "JCT p50", "s"),
    ("jct.p95", "JCT p95", "s"),
    ("jct.p99", "JCT p99", "s"),
    ("queueing.mean", "queue avg", "s"),
    ("queueing.p50", "queue p50", "s"),
    ("queueing.p95", "queue p95", "s"),
    ("queueing.p99", "queue p99", "s"),
    ("wait.mean", "wait avg", "s"),
    ("wait.p99", "wait p99", "s"),
    ("makespan_s", "makespan", "s"),
    ("utilization.mean", "GPU util", ""),
    ("preemptions.per_job", "preempt/job", ""),
    ("preemptions.per_hour.mean", "preempt/job-h avg", ""),
    ("preemptions.per_hour.max", "preempt/job-h max", ""),
    ("outages.lost_gpu_hours.preemption", "lost GPU-h (preempt)", "GPU-h"),
    ("fairness.ftf_spread", "FTF spread", ""),
    ("fragmentation.stranded_mean", "stranded GPUs avg", "GPUs"),
    ("fragmentation.stranded_p95", "stranded GPUs p95", "GPUs"),
)

# Shown when a run played outages (node failures or drains).
OUTAGE_FIGURES: Tuple[Tuple[str, str, str], ...] = (
    ("outages.failures", "node failures", ""),
    ("outages.requeues.failure", "requeues (failures)", ""),
    ("outages.lost_gpu_hours.failure", "lost GPU-h (failures)", "GPU-h"),
    ("outages.drains", "drains", ""),
    ("outages.requeues.drain", "requeues (drains)", ""),
    ("outages.lost_gpu_hours.drain", "lost GPU-h (drains)", "GPU-h"),
    ("outages.drain_time.mean", "drain time avg", "s"),
    ("outages.drain_time.max", "drain time max", "s"),
    ("outages.down_gpu_hours", "GPU-h down", "GPU-h"),
)

# Shown when a run's cluster has growable, priced or spot groups (its summary has a ``capacity`` section).
CAPACITY_FIGURES: Tuple[Tuple[str, str, str], ...] = (
    ("capacity.gpu_hours", "GPU-h bought", "GPU-h"),
    ("capacity.cost", "cost", ""),
    ("capacity.cost_spot", "cost (spot)", ""),
    ("capacity.utilization_bought", "util of bought", ""),
    ("capacity.nodes_mean", "nodes avg", ""),
    ("capacity.nodes_max", "nodes max", ""),
    ("capacity.reclaims", "spot reclaims", ""),
)


# Shown when the trace names users (its summary has a ``user_fairness`` section).
USER_FIGURES: Tuple[Tuple[str, str, str], ...] = (
    ("user_fairness.users", "users", ""),
    ("user_fairness.slowdown_spread", "user slowdown spread", ""),
    ("user_fairness.within_team_spread", "user spread in team avg", ""),
    ("user_fairness.slowdown_jain", "user slowdown Jain", ""),
)


# Shown when a run's policy gives a class a ``max_runtime`` (its summary has a ``run_limits`` section).
RUN_LIMIT_FIGURES: Tuple[Tuple[str, str, str], ...] = (
    ("run_limits.requeues", "run-limit requeues", ""),
    ("run_limits.stops", "run-limit stops", ""),
    ("run_limits.lost_gpu_hours", "lost GPU-h (run limit)", "GPU-h"),
)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    k = (n - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def dist(values: List[float]) -> Dict[str, float]:
    values.sort()
    n = len(values)
    return {
        "count": n,
        "mean": sum(values) / n if n else math.nan,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": values[-1] if n else math.nan,
    }


def _integral(times: Sequence[float], values: Sequence[float], t0: float, t1: float) -> float:
    """Integral of the step function (value holds from one sample's time to the next) over [t0, t1]."""
    total = 0.0
    for k in range(len(times)):
        a = max(times[k], t0)
        b = min(times[k + 1] if k + 1 < len(times) else t1, t1)
        if b > a:
            total += values[k] * (b - a)
    return total


def time_weighted_quantile(times: Sequence[float], values: Sequence[float], t0: float, t1: float,
                           q: float) -> float:
    """The ``q`` quantile (0..100) of a step function over [t0, t1], each value weighted by how long it held (the
    smallest value that held at least q% of the time, or longer); NaN when no time passed."""
    spans: Dict[float, float] = {}
    for k in range(len(times)):
        a = max(times[k], t0)
        b = min(times[k + 1] if k + 1 < len(times) else t1, t1)
        if b > a:
            spans[values[k]] = spans.get(values[k], 0.0) + (b - a)
    total = sum(spans.values())
    if total <= 0:
        return math.nan
    acc = 0.0
    for v in sorted(spans):
        acc += spans[v]
        if acc >= total * q / 100.0 - 1e-9 * total:
            return v
    return max(spans)  # pragma: no cover - float rounding only


def binned(times: Sequence[float], values: Sequence[float], t0: float, t1: float, bins: int) -> Tuple[List[float],
                                                                                                    List[float]]:
    """Time-weighted means of a step function over ``bins`` equal intervals of [t0, t1] (for plots)."""
    if t1 <= t0 or not times:
        return [], []
    width = (t1 - t0) / bins
    sums = [0.0] * bins
    for k in range(len(times)):
        a = max(times[k], t0)
        b = min(times[k + 1] if k + 1 < len(times) else t1, t1)
        v = values[k]
        while b > a:
            i = min(int((a - t0) / width), bins - 1)
            while i < bins - 1 and t0 + (i + 1) * width <= a:  # float rounding put a at the end of bin i
                i += 1
            edge = b if i == bins - 1 else min(b, t0 + (i + 1) * width)
            sums[i] += v * (edge - a)
            a = edge
    return [t0 + (i + 0.5) * width for i in range(bins)], [s / width for s in sums]


def thrash(r: SimResult, done: Sequence[int]) -> Dict[str, Any]:
    """Preemptions per hour of runtime over the finished jobs ``done``: mean, largest, the job with the largest
    (id, preemptions, runtime hours; None when no job was preempted) and how many exceed one per hour. A job's
    runtime is its duration plus the work it lost (both run on its GPUs); a job of zero runtime counts 0."""
    rates: List[float] = []
    worst, worst_rate, over = None, -1.0, 0
    for j in done:
        hours = (r.jobs[j].duration + r.lost_work[j]) / 3600.0
        rate = r.preemptions[j] / hours if hours > 0 else 0.0
        rates.append(rate)
        if rate > 1.0 + 1e-9:
            over += 1
        if r.preemptions[j] and rate > worst_rate:
            worst_rate = rate
            worst = {"id": r.jobs[j].id, "preemptions": r.preemptions[j], "runtime_h": hours}
    return {
        "mean": sum(rates) / len(rates) if rates else math.nan,
        "max": max(rates, default=math.nan),
        "over_one": over,
        "worst": worst,
    }


def summarize(r: SimResult) -> Dict[str, Any]:
    """Every figure of the replay as a JSON-ready dict (NaN where nothing was measured)."""
    jobs = r.jobs
    n = len(jobs)
    done = [j for j in range(n) if r.finish[j] >= 0]
    started = [j for j in range(n) if r.first_start[j] >= 0]
    jct = [r.finish[j] - jobs[j].submit for j in done]
    queueing = [r.first_start[j] - jobs[j].submit for j in started]
    wait = [max(0.0, r.finish[j] - jobs[j].submit - jobs[j].duration) for j in done]
    t0 = min((job.submit for job in jobs), default=0.0)
    t1 = max((r.finish[j] for j in done), default=t0) if not r.partial else r.end_time
    t1 = max(t1, t0)
    span = t1 - t0
    gpu_s_used = _integral(r.times, r.busy, t0, t1)
    lost_gpu_s = sum(r.lost_work[j] * jobs[j].gpus for j in range(n))
    util = gpu_s_used / (r.total_gpus * span) if span > 0 and r.total_gpus else math.nan
    pre = [r.preemptions[j] for j in done]
    return {
        "partial": r.partial,
        "trace": r.trace_source,
        "cluster": r.cluster_name,
        "total_gpus": r.total_gpus,
        **_setup(r),
        "jobs": {
            "total": n, "finished": len(done), "started": len(started), "unfinished": n - len(done),
            "rejected": len(r.rejected),
        },
        "jct": dist(jct),
        "queueing": dist(queueing),
        "wait": dist(wait),
        "makespan_s": span,
        "end_time_s": r.end_time,
        "utilization": {"mean": util, "goodput": (gpu_s_used - lost_gpu_s) / (r.total_gpus * span)
                        if span > 0 and r.total_gpus else math.nan,
                        "gpu_s_used": gpu_s_used, "gpu_s_lost": lost_gpu_s},
        "preemptions": {
            "total": sum(r.preemptions),
            "per_job": sum(pre) / len(pre) if pre else math.nan,
            "max": max(pre, default=0),
            "fraction_preempted": sum(1 for p in pre if p) / len(pre) if pre else math.nan,
            "per_hour": thrash(r, done),
        },
        "resizes": {
            "total": sum(r.resizes),
            "per_job": sum(r.resizes[j] for j in done) / len(done) if done and r.resizes else math.nan,
            "jobs_resized": sum(1 for k in r.resizes if k),
            "overhead_gpu_hours": r.resize_overhead_gpu_s / 3600.0,
        },
        "fairness": _fairness(r, done),
        "fragmentation": _fragmentation(r, t0, t1),
        "outages": _outages(r),
        "replay": {"cycles": r.cycles, "instants": r.instants, "wall_s": r.wall_s, **cycle_latency(r)},
        **({"capacity": capacity(r, gpu_s_used, t0, t1)} if r.capacity is not None else {}),
        **({"run_limits": run_limits(r)} if r.run_limit_stops is not None else {}),
        **({"user_fairness": user_fairness(r, done)} if any(job.user is not None for job in jobs) else {}),
    }


def user_fairness(r: SimResult, done: Sequence[int]) -> Dict[str, Any]:
    """Per user (``team/user``; a job with no user is its team's ``(none)``): jobs, finished jobs and mean slowdown
    (JCT / duration over its finished jobs, as ``ftf`` per team); then across users the spread (worst mean over
    best), Jain's index of the means, and the mean over teams of two or more users of the spread inside each."""
    jobs = r.jobs
    slow: Dict[Tuple[str, str], List[float]] = {}
    count: Dict[Tuple[str, str], int] = {}
    for job in jobs:
        k = (job.team, job.user if job.user is not None else "(none)")
        count[k] = count.get(k, 0) + 1
        slow.setdefault(k, [])
    for j in done:
        job = jobs[j]
        slow[(job.team, job.user if job.user is not None else "(none)")].append(
            (r.finish[j] - job.submit) / job.duration)
    per_user = {f"{t}/{u}": {"jobs": count[(t, u)], "finished": len(v), "slowdown": sum(v) / len(v) if v else math.nan}
                for (t, u), v in sorted(slow.items())}
    means = [v["slowdown"] for v in per_user.values() if not math.isnan(v["slowdown"])]
    by_team: Dict[str, List[float]] = {}
    for (t, _), v in slow.items():
        if v:
            by_team.setdefault(t, []).append(sum(v) / len(v))
    inside = [max(m) / min(m) for m in by_team.values() if len(m) > 1]
    return {
        "users": len(per_user),
        "per_user": per_user,
        "slowdown_max": max(means, default=math.nan),
        "slowdown_spread": max(means) / min(means) if means else math.nan,
        "slowdown_jain": sum(means) ** 2 / (len(means) * sum(x * x for x in means)) if means else math.nan,
        "within_team_spread": sum(inside) / len(inside) if inside else math.nan,
    }


def run_limits(r: SimResult) -> Dict[str, Any]:
    """The *run limits* figures: requeues at a class's ``max_runtime``, the work they lost, the jobs it ended."""
    return {"requeues": r.requeues.get("run_limit", 0), "stops": r.run_limit_stops,
            "lost_gpu_hours": r.lost_gpu_s.get("run_limit", 0.0) / 3600.0}


def capacity(r: SimResult, gpu_s_used: float, t0: float, t1: float) -> Dict[str, Any]:
    """The *capacity* figures of a replay with a ``CapacityLog`` (see the module's words)."""
    log = r.capacity
    groups: Dict[str, Any] = {}
    cost = {"spot": 0.0, "on_demand": 0.0}
    gpu_h = {"spot": 0.0, "on_demand": 0.0}
    unpriced = 0.0
    for g in log.groups:
        kind = "spot" if g.spot else "on_demand"
        gpu_h[kind] += g.gpu_hours
        if g.cost is None:
            unpriced += g.gpu_hours
        else:
            cost[kind] += g.cost
        groups[g.name] = {
            "node_type": g.node_type, "gpus_per_node": g.gpus, "price": g.price, "spot": g.spot,
            "min": g.lo, "max": g.hi, "start": g.start, "peak": g.peak, "startup_s": g.startup_s,
            "launched": g.launched, "cancelled": g.cancelled, "removed_idle": g.removed_idle,
            "reclaimed": g.reclaimed, "node_hours": g.node_s / 3600.0, "gpu_hours": g.gpu_hours, "cost": g.cost,
        }
    bought = gpu_h["spot"] + gpu_h["on_demand"]
    span = t1 - t0
    w1 = max((job.submit for job in r.jobs), default=t0)
    window = {"start_s": t0, "end_s": w1, "gpu_hours": 0.0, "cost": 0.0, "cost_spot": 0.0}
    in_window = log.billed(t0, w1)
    for g in log.groups:
        hours = in_window[g.name] / 3600.0
        window["gpu_hours"] += hours * g.gpus
        if g.price is not None:
            c = g.price * (hours * g.gpus if g.gpus else hours)
            window["cost"] += c
            window["cost_spot"] += c if g.spot else 0.0
    return {
        "gpu_hours": bought,
        "gpu_hours_spot": gpu_h["spot"],
        "gpu_hours_on_demand": gpu_h["on_demand"],
        "gpu_hours_unpriced": unpriced,
        "cost": cost["spot"] + cost["on_demand"],
        "cost_spot": cost["spot"],
        "cost_on_demand": cost["on_demand"],
        "utilization_bought": gpu_s_used / 3600.0 / bought if bought else math.nan,
        "nodes_mean": _integral(r.times, log.nodes, t0, t1) / span if span > 0 and log.nodes else math.nan,
        "nodes_max": max(log.nodes, default=0),
        "reclaims": sum(g.reclaimed for g in log.groups),
        "idle_timeout_s": log.idle_timeout_s,
        "spot_reclaim_per_hour": log.spot_reclaim_per_hour,
        "submit_window": window,
        "groups": groups,
    }


def _setup(r: SimResult) -> Dict[str, Any]:
    """The policy and the options the replay ran with."""
    cfg, opts = r.config, r.options
    return {
        "policy": {
            "ordering": cfg.ordering, "admission": cfg.admission, "backfill": cfg.backfill,
            "preemption": cfg.preemption, "victim_cost": cfg.victim_cost,
            "las_thresholds": list(cfg.las_thresholds),
            "max_admissions_per_cycle": cfg.max_admissions_per_cycle,
            "hysteresis_min_run_s": cfg.hysteresis_min_run_s,
            "hysteresis_service_fraction": cfg.hysteresis_service_fraction,
        },
        "options": {
            "estimates": opts.estimates, "noise_sigma": opts.noise_sigma, "seed": opts.seed,
            "stop_delay_s": opts.stop_delay_s, "tick_s": r.tick_s, "max_examined": opts.max_examined,
            "placement": opts.placement,
            "elastic_speedup": opts.elastic_speedup, "resize_overhead_s": opts.resize_overhead_s,
            "outages": {"failures": len(opts.outages.failures), "drains": len(opts.outages.drains),
                        "mtbf_s": opts.outages.mtbf_s, "repair_s": opts.outages.repair_s,
                        "drain_deadline_s": opts.outages.drain_deadline_s},
        },
    }


def _fairness(r: SimResult, done: Sequence[int]) -> Dict[str, Any]:
    """Per team: jobs, GPU-seconds used, its share of them, of the demand and of the entitlement (nominal GPU quotas,
    else team weights), and finish-time fairness over its finished jobs ``done``; then the spread of the latter."""
    jobs = r.jobs
    teams = sorted({job.team for job in jobs})
    demand = {t: 0.0 for t in teams}
    slow: Dict[str, List[float]] = {t: [] for t in teams}
    for job in jobs:
        demand[job.team] += job.duration * job.gpus
    for j in done:
        slow[jobs[j].team].append((r.finish[j] - jobs[j].submit) / jobs[j].duration)
    quota = {t: (r.teams[t].quotas.get("gpu").nominal if t in r.teams and "gpu" in r.teams[t].quotas else 0.0)
             for t in teams}
    if sum(quota.values()) > 0:
        ent_basis, ent_total = quota, sum(quota.values())
    else:
        ent_basis = {t: (r.teams[t].weight if t in r.teams else 1.0) for t in teams}
        ent_total = sum(ent_basis.values())
    used_total = sum(r.team_gpu_s.get(t, 0.0) for t in teams) or math.nan
    demand_total = sum(demand.values()) or math.nan
    per_team = {}
    for t in teams:
        share = r.team_gpu_s.get(t, 0.0) / used_total
        ent = ent_basis[t] / ent_total if ent_total else math.nan
        ftf = sum(slow[t]) / len(slow[t]) if slow[t] else math.nan
        per_team[t] = {
            "jobs": sum(1 for job in jobs if job.team == t),
            "gpu_s": r.team_gpu_s.get(t, 0.0),
            "share": share,
            "demand_share": demand[t] / demand_total,
            "entitlement": ent,
            "share_over_entitlement": share / ent if ent else math.nan,
            "ftf": ftf,
        }
    ftfs = [v["ftf"] for v in per_team.values() if not math.isnan(v["ftf"])]
    jain = (sum(ftfs) ** 2 / (len(ftfs) * sum(x * x for x in ftfs))) if ftfs else math.nan
    return {
        "teams": per_team,
        "ftf_max": max(ftfs, default=math.nan),
        "ftf_spread": (max(ftfs) / min(ftfs)) if ftfs else math.nan,
        "ftf_jain": jain,
    }


def _fragmentation(r: SimResult, t0: float, t1: float) -> Dict[str, Any]:
    """Stranded GPUs over ``[t0, t1]``: time-weighted mean and p95, the largest, the mean's share of the cluster."""
    span = t1 - t0
    stranded_mean = _integral(r.times, r.stranded, t0, t1) / span if span > 0 and r.stranded else math.nan
    return {
        "stranded_mean": stranded_mean,
        "stranded_p95": time_weighted_quantile(r.times, r.stranded, t0, t1, 95) if r.stranded else math.nan,
        "stranded_max": max(r.stranded, default=math.nan),
        "stranded_share": stranded_mean / r.total_gpus if r.total_gpus else math.nan,
    }


def _outages(r: SimResult) -> Dict[str, Any]:
    """Failures and drains played, requeues and work lost by cause, drain times, capacity down."""
    drain_times = [end - start for _, start, end in r.drains if end is not None]
    return {
        "failures": len(r.failures),
        "drains": len(r.drains),
        "drains_unfinished": sum(1 for d in r.drains if d[2] is None),
        "requeues": dict(r.requeues),
        "lost_gpu_hours": {c: v / 3600.0 for c, v in r.lost_gpu_s.items()},
        "drain_time": {"mean": sum(drain_times) / len(drain_times) if drain_times else math.nan,
                       "max": max(drain_times, default=math.nan)},
        "down_gpu_hours": r.down_gpu_s / 3600.0,
    }


def cycle_latency(r) -> Dict[str, Any]:
    """The scheduling cycle's wall time as the replay ran it (milliseconds: p50, p99, max), and the most workloads
    pending at a cycle. The control actor exports the same measure as ``raylane_cycle_seconds``."""
    walls = sorted(w * 1000.0 for w in r.cycle_wall)
    return {"cycle_ms": {"p50": percentile(walls, 50), "p99": percentile(walls, 99),
                         "max": walls[-1] if walls else math.nan},
            "pending_max": max(r.cycle_pending, default=0)}


def get(summary: Dict[str, Any], dotted: str) -> Any:
    """``get(s, "jct.mean")``: a figure by its dotted key."""
    v: Any = summary
    for part in dotted.split("."):
        v = v[part]
    return v
