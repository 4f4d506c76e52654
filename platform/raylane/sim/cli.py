"""``raylane sim``: replay a job trace on a simulated cluster under a policy, and report the figures.

This module owns the command line of the simulator: how a trace, a cluster, a policy, presets and flags combine
into replays, the table and JSON it prints, the files it writes, the progress bar and Ctrl-C. The policy is taken,
in this order, from the policy file (``--policy``, the format of ``policies/*.yaml``), then ``--preset`` (named
choices on the scheduler axes, ``raylane.sim.presets``), then the single-axis flags (``--ordering`` ...). Without a
policy file the trace's teams share one cluster with no quotas (admission ``none``).

Several ``--preset`` (or ``--preset compare``) replay the same trace once per preset and add the ratios of each
figure to the ``srtf-oracle`` and ``fifo`` runs when those are among them.

Instead of a trace file, ``--generate MIX`` draws a synthetic trace of a workload mix (``raylane.sim.generate``:
heavy-tail, shared-burst, big-gangs) from ``--seed``, sized by ``--jobs`` and ``--load`` against the chosen
cluster; ``--write-trace FILE`` also writes it as a generic CSV that replays as a file later.
"""
from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from raylane.config.models import parse_duration
from raylane.errors import FatalError, ValidationError
from raylane.scheduling.preemption import VICTIM_COSTS
from raylane.scheduling.types import SchedulerConfig, Team, WorkloadClass
from raylane.sim.cluster import ClusterSpec, cluster_from_flags, load_cluster
from raylane.sim.engine import (DEFAULT_CLASS, ELASTIC_SPEEDUP_ALLOWED, ESTIMATES, SimOptions, SimResult, Simulator,
                                speedup_table)
from raylane.sim.generate import MIXES, generate, write_csv
from raylane.sim.metrics import (CAPACITY_FIGURES, FIGURES, OUTAGE_FIGURES, RUN_LIMIT_FIGURES, USER_FIGURES, get,
                                 summarize)
from raylane.sim.outages import Outages, load_node_events, parse_outage
from raylane.sim.presets import COMPARISON, PRESETS, apply_preset, get_preset
from raylane.sim.traces import FORMATS, Trace, load_trace

__all__ = ["register", "sim", "SimArgs", "app", "run_replays", "comparison_rows"]

# Tables are wide: when the output is not a terminal, do not squeeze them into 80 columns.
_out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

# Ratios in the comparison table are taken against these runs when present.
REFERENCES = ("srtf-oracle", "fifo")


def _fail(exc: Exception) -> None:
    from raylane.cli_config import print_error

    print_error(exc)
    raise typer.Exit(1)


class _Interrupt:
    """First Ctrl-C: stop the replay at the next instant and keep its figures. Second: stop at once."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave the default (KeyboardInterrupt, also caught by the engine)
            self._old = None
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        _err.print("\ninterrupted: stopping the replay and keeping the partial figures (Ctrl-C again to abort)")

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


def _hours(s: float) -> str:
    return f"{s / 3600:.1f}h"


def run_replays(
    trace: Trace,
    cluster: ClusterSpec,
    runs: List[Tuple[str, SchedulerConfig, SimOptions]],
    *,
    teams: Dict[str, Team],
    classes: Dict[str, WorkloadClass],
    default_class: WorkloadClass,
    show_progress: bool = True,
) -> List[Tuple[str, SimResult]]:
    """Replay ``trace`` once per run, with a progress bar; stops after a run that Ctrl-C cut short."""
    results: List[Tuple[str, SimResult]] = []
    nodes = cluster.nodes()
    with _Interrupt() as intr, Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[jobs]}"), TextColumn("sim {task.fields[clock]}"), TimeElapsedColumn(),
        console=_err, disable=not show_progress, transient=False,
    ) as bar:
        for label, cfg, opts in runs:
            sim = Simulator(trace, nodes, teams, cfg, classes=classes, default_class=default_class, options=opts,
                            cluster_name=cluster.name, cluster=cluster if isinstance(cluster, ClusterSpec) else None)
            task = bar.add_task(label, total=len(sim.jobs) or 1, jobs="", clock="0.0h")

            def progress(now: float, done: int, total: int, task=task) -> None:
                bar.update(task, completed=done, jobs=f"{done}/{total} jobs", clock=_hours(now))

            result = sim.run(progress=progress, should_stop=lambda: intr.requested)
            bar.update(task, completed=sum(1 for f in result.finish if f >= 0),
                       description=label + (" [partial]" if result.partial else ""))
            results.append((label, result))
            if result.partial:
                break
    return results


# ---------------------------------------------------------------------------------------------------- output


def _fmt(key: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if key.startswith("utilization") or key == "capacity.utilization_bought":
        return f"{v:.1%}"
    if key == "capacity.nodes_mean":
        return f"{v:,.1f}"
    if key.startswith("fragmentation") or "gpu_hours" in key:
        return f"{v:,.1f}"
    if key.startswith(("preemptions", "fairness", "user_fairness.slowdown", "user_fairness.within")):
        return f"{v:.2f}"
    return f"{v:,.0f}"


def comparison_rows(summaries: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Per run, avg JCT, p95 queueing delay and average wait as ratios to each reference run present (NaN where the
    reference's figure is 0)."""
    out: Dict[str, Dict[str, float]] = {}
    for name, s in summaries.items():
        row: Dict[str, float] = {}
        for ref in REFERENCES:
            if ref in summaries:
                for key in ("jct.mean", "queueing.p95", "wait.mean"):
                    base = get(summaries[ref], key)
                    v = get(s, key)
                    row[f"{key}/{ref}"] = v / base if base else math.nan
        out[name] = row
    return out


def render_table(summaries: Dict[str, Dict[str, Any]]) -> Table:
    """One column per run, one row per figure (a comparison of nine runs stays readable in a terminal), then the
    ratios to the reference runs."""
    table = Table(title="replay figures (seconds unless noted)", show_lines=False)
    table.add_column("figure", style="bold")
    for name, s in summaries.items():
        table.add_column(name + (" (partial)" if s["partial"] else ""), justify="right")
    outages = any(s["outages"]["failures"] or s["outages"]["drains"] for s in summaries.values())
    capacity = any("capacity" in s for s in summaries.values())
    limits = any("run_limits" in s for s in summaries.values())
    users = any("user_fairness" in s for s in summaries.values())
    for key, label, _ in (FIGURES + (OUTAGE_FIGURES if outages else ()) + (CAPACITY_FIGURES if capacity else ())
                          + (RUN_LIMIT_FIGURES if limits else ()) + (USER_FIGURES if users else ())):
        section = key.split(".", 1)[0]
        table.add_row(label, *[_fmt(key, get(s, key)) if section in s or section not in ("capacity", "run_limits",
                                                                                          "user_fairness")
                               else "-" for s in summaries.values()])
    ratios = comparison_rows(summaries)
    names = {"jct.mean": "JCT avg", "queueing.p95": "queue p95", "wait.mean": "wait avg"}
    keys = list(next(iter(ratios.values()), {}) or {})
    for k in keys:
        what, ref = k.split("/")
        cells = [f"{ratios[n][k]:.2f}x" if not math.isnan(ratios[n][k]) else "-" for n in summaries]
        table.add_row(f"{names[what]} / {ref}", *cells)
    return table


def _jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def report_json(summaries: Dict[str, Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    return _jsonable({
        "partial": any(s["partial"] for s in summaries.values()),
        **meta,
        "runs": summaries,
        "ratios": comparison_rows(summaries),
    })


# ------------------------------------------------------------------------------------------------------- CLI


def _split(value: Optional[str]) -> List[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@dataclass(frozen=True)
class SimArgs:
    """The options of ``raylane sim``, one field per flag as ``sim`` names them (its typer signature takes its
    defaults from here). A field left None leaves the choice to the policy file, the preset or the simulator."""

    trace_path: Optional[Path] = None
    generate_mix: Optional[str] = None
    from_journal: Optional[Path] = None
    jobs: int = 2000
    load: float = 0.9
    users: int = 0
    write_trace: Optional[Path] = None
    format: Optional[str] = None
    team_column: Optional[str] = None
    user_column: Optional[str] = None
    start: Optional[str] = None
    end: Optional[str] = None
    limit: Optional[int] = None
    cluster: Optional[Path] = None
    nodes: Optional[int] = None
    gpus_per_node: int = 8
    cpus_per_node: float = 0.0
    memory_per_node: float = 0.0
    features: Optional[str] = None
    policy: Optional[Path] = None
    preset: Optional[List[str]] = None
    ordering: Optional[str] = None
    backfill: Optional[str] = None
    preemption: Optional[str] = None
    victim_cost: Optional[str] = None
    admission: Optional[str] = None
    las_thresholds: Optional[str] = None
    hysteresis_min_run: Optional[str] = None
    hysteresis_fraction: Optional[float] = None
    job_class: Optional[str] = None
    checkpoint_every: Optional[str] = None
    estimates: Optional[str] = None
    noise_sigma: Optional[float] = None
    seed: int = 0
    stop_delay: Optional[float] = None
    tick: Optional[float] = None
    max_examined: Optional[int] = None
    placement: Optional[List[str]] = None
    fail: Optional[List[str]] = None
    drain: Optional[List[str]] = None
    node_events: Optional[Path] = None
    mtbf: Optional[str] = None
    repair: str = "1h"
    drain_deadline: str = "0"
    elastic_speedup: Optional[str] = None
    resize_overhead: Optional[str] = None
    idle_timeout: Optional[str] = None
    spot_reclaim_per_hour: Optional[float] = None
    out: Optional[Path] = None
    as_json: bool = False
    plots: bool = True
    progress: bool = True


_D = SimArgs  # the defaults of ``sim``'s flags


def sim(
    trace_path: Optional[Path] = typer.Argument(_D.trace_path, metavar="[TRACE]",
                                                help="trace CSV (Philly, Tiresias or generic format); none with "
                                                     "--generate"),
    generate_mix: Optional[str] = typer.Option(_D.generate_mix, "--generate", help="replay a generated trace of "
                                               "this workload mix instead of a file: " + ", ".join(MIXES)
                                               + " (drawn from --seed)"),
    from_journal: Optional[Path] = typer.Option(_D.from_journal, "--from-journal", help="replay a Raylane control "
                                                "plane's own journal (its submissions, nodes and node losses) "
                                                "instead of a trace file; --policy: the policy to try on it"),
    jobs: int = typer.Option(_D.jobs, "--jobs", help="with --generate: how many jobs"),
    load: float = typer.Option(_D.load, "--load", help="with --generate: GPU-time asked over the cluster's, over "
                                                       "the submit span"),
    users: int = typer.Option(_D.users, "--users", help="with --generate: give the jobs this many users and job "
                                                        "names, each user's jobs of a typical length (0: none)"),
    write_trace: Optional[Path] = typer.Option(_D.write_trace, "--write-trace", help="with --generate: also write "
                                               "the trace as a generic CSV"),
    format: Optional[str] = typer.Option(_D.format, "--format", help="trace format: " + ", ".join(FORMATS)
                                         + " (default: recognised from the header)"),
    team_column: Optional[str] = typer.Option(_D.team_column, "--team-column",
                                              help="column whose value is the job's team ('none': one team); "
                                                   "default: Philly's cluster, generic team or user"),
    user_column: Optional[str] = typer.Option(_D.user_column, "--user-column",
                                              help="column whose value is the job's user (a team's user rule reads "
                                                   "it; 'none': no users); default: a 'user' column if present"),
    start: Optional[str] = typer.Option(_D.start, help="keep jobs submitted from this date (or second) on"),
    end: Optional[str] = typer.Option(_D.end, help="keep jobs submitted before this date (or second)"),
    limit: Optional[int] = typer.Option(_D.limit, help="keep only the first N jobs (after --start/--end)"),
    cluster: Optional[Path] = typer.Option(_D.cluster, "--cluster", help="cluster YAML (node groups)"),
    nodes: Optional[int] = typer.Option(_D.nodes, "--nodes", help="cluster from flags: number of nodes"),
    gpus_per_node: int = typer.Option(_D.gpus_per_node, "--gpus-per-node"),
    cpus_per_node: float = typer.Option(_D.cpus_per_node, "--cpus-per-node", help="0: CPUs not modelled"),
    memory_per_node: float = typer.Option(_D.memory_per_node, "--memory-per-node", help="GiB; 0: not modelled"),
    features: Optional[str] = typer.Option(_D.features, "--features", help="comma-separated node tags"),
    policy: Optional[Path] = typer.Option(_D.policy, "--policy", help="policy YAML (policies/*.yaml format)"),
    preset: Optional[List[str]] = typer.Option(
        _D.preset, "--preset", help="named policy (repeatable; 'compare' for all): " + ", ".join(PRESETS)),
    ordering: Optional[str] = typer.Option(_D.ordering, help="override the ordering policy"),
    backfill: Optional[str] = typer.Option(_D.backfill, help="override the backfill policy"),
    preemption: Optional[str] = typer.Option(_D.preemption, help="override the preemption policy"),
    victim_cost: Optional[str] = typer.Option(
        _D.victim_cost, "--victim-cost", help="how victims of one class priority are priced: "
                                              + ", ".join(VICTIM_COSTS.names()) + " (default lost_work)"),
    admission: Optional[str] = typer.Option(_D.admission, help="override the admission policy (quota | none)"),
    las_thresholds: Optional[str] = typer.Option(_D.las_thresholds,
                                                 help="LAS queue thresholds in GPU-time, e.g. '1h,10h'"),
    hysteresis_min_run: Optional[str] = typer.Option(
        _D.hysteresis_min_run, help="ordering preemption (LAS, SRTF) stops no lease that ran less than this since "
                                    "its (re)start, e.g. 1h (0: off)"),
    hysteresis_fraction: Optional[float] = typer.Option(
        _D.hysteresis_fraction, help="... nor one that ran less than this fraction of the time it had run before "
                                     "its (re)start"),
    job_class: Optional[str] = typer.Option(_D.job_class, "--class",
                                            help="policy class of jobs whose trace names none"),
    checkpoint_every: Optional[str] = typer.Option(_D.checkpoint_every,
                                                   help="override the class's checkpoint interval, e.g. 5m"),
    estimates: Optional[str] = typer.Option(_D.estimates, help="runtime estimates the policy sees: "
                                                               + ", ".join(ESTIMATES)),
    noise_sigma: Optional[float] = typer.Option(_D.noise_sigma, help="log-normal sigma of noisy estimates"),
    seed: int = typer.Option(_D.seed, help="seed of the noisy estimates, the drawn failures and --generate"),
    stop_delay: Optional[float] = typer.Option(_D.stop_delay,
                                               help="seconds from a preemption to the resources being free"),
    tick: Optional[float] = typer.Option(_D.tick, help="seconds between clock-triggered cycles (default: 300 when "
                                                       "preemption is on, else none)"),
    max_examined: Optional[int] = typer.Option(_D.max_examined, help="workloads a cycle looks at, at most"),
    placement: Optional[List[str]] = typer.Option(
        _D.placement, "--placement", help="placement of jobs whose trace names none (default pack); repeatable: one "
                                          "run per placement, to compare them (e.g. on stranded GPUs)"),
    fail: Optional[List[str]] = typer.Option(_D.fail, "--fail", help="a node failure, NODE@TIME[+DOWN], e.g. "
                                             "node-003@2h+30m (repeatable; without +DOWN it never comes back)"),
    drain: Optional[List[str]] = typer.Option(_D.drain, "--drain", help="a drain, NODE@TIME[+FOR]: no new leases "
                                              "from TIME, its leases preempted, back in service after FOR "
                                              "(repeatable)"),
    node_events: Optional[Path] = typer.Option(_D.node_events, "--node-events",
                                               help="CSV of outages: time,node,event (fail|drain),duration"),
    mtbf: Optional[str] = typer.Option(_D.mtbf, "--mtbf", help="mean time between failures of each node, e.g. 30d "
                                       "(failures drawn with --seed)"),
    repair: str = typer.Option(_D.repair, "--repair", help="time a node drawn to fail by --mtbf stays down"),
    drain_deadline: str = typer.Option(_D.drain_deadline, "--drain-deadline", help="how long a drain lets leases "
                                       "run before preempting them (0: at once; none: wait for them to end)"),
    elastic_speedup: Optional[str] = typer.Option(
        _D.elastic_speedup, "--elastic-speedup", help="speedup curve of elastic jobs whose trace names none: linear "
                                                      "or amdahl:P (serial fraction P), for all classes or per "
                                                      "class, e.g. 'pretrain=amdahl:0.05,linear' (default linear)"),
    resize_overhead: Optional[str] = typer.Option(
        _D.resize_overhead, "--resize-overhead", help="time an elastic job makes no progress after each resize (its "
                                                      "restart), e.g. 1m (default 60s)"),
    idle_timeout: Optional[str] = typer.Option(
        _D.idle_timeout, "--idle-timeout", help="growable node groups: how long a node holds no lease before it is "
                                                "removed, e.g. 10m (default 5m, Ray's autoscaler's)"),
    spot_reclaim_per_hour: Optional[float] = typer.Option(
        _D.spot_reclaim_per_hour, "--spot-reclaim-per-hour", help="spot node groups: reclaims per node-hour, drawn "
                                                                  "per node with --seed (default 0.01; 0: none)"),
    out: Optional[Path] = typer.Option(_D.out, "--out", help="directory for summary.json, table.txt and PNG plots"),
    as_json: bool = typer.Option(_D.as_json, "--json", help="print the JSON report instead of the table"),
    plots: bool = typer.Option(_D.plots, "--plots/--no-plots", help="write PNG plots into --out"),
    progress: bool = typer.Option(_D.progress, "--progress/--no-progress", help="show a progress bar (on stderr)"),
) -> None:
    """Replay a job trace through the scheduling core on a simulated cluster and report JCT, queueing delay,
    makespan, utilization, fairness and preemptions. Ctrl-C stops a long replay and keeps its partial figures."""
    try:
        _sim(SimArgs(**locals()))
    except FatalError as exc:
        _fail(exc)


@dataclass
class _Parsed:
    """What the flags say once checked: the presets to run, the overrides of the policy and of the replay options,
    the checkpoint interval and the outages (``Outages`` fields)."""

    names: List[str]
    config: Dict[str, Any]
    options: Dict[str, Any]
    checkpoint_s: Optional[float]
    outages: Dict[str, Any]


def _sim(a: SimArgs) -> None:
    # 1. Check every flag (all errors at once), 2. the cluster, the trace and the outages, 3. the policy,
    # 4. one run per preset and placement, 5. replay them and report.
    flags = _parse(a)
    journal = _journal(a) if a.from_journal is not None else None
    if journal is not None and a.cluster is None and a.nodes is None:
        spec = journal.cluster()
    else:
        spec = load_cluster(a.cluster) if a.cluster is not None else cluster_from_flags(
            a.nodes, a.gpus_per_node, cpus_per_node=a.cpus_per_node, memory_per_node=a.memory_per_node,
            features=_split(a.features))
    outages = _outages(a, flags, spec, journal.outages if journal is not None else None)
    trace = journal.trace if journal is not None else _trace(a, spec)
    base, teams, classes, default_class = _policy(a, trace, flags.checkpoint_s,
                                                  journal.policy if journal is not None else None)
    runs = _runs(a, flags, base, SimOptions(seed=a.seed, outages=outages))
    _err.print(f"trace {trace.source}: {len(trace.jobs)} jobs, {len(trace.teams)} team(s), "
               f"{trace.gpu_seconds() / 3600:,.0f} GPU-hours over {_hours(trace.span())}; "
               f"load {trace.gpu_seconds() / max(trace.span() * spec.total_gpus, 1e-9):.2f} on {spec.describe()}",
               markup=False)
    t0 = time.perf_counter()
    results = run_replays(trace, spec, runs, teams=teams, classes=classes, default_class=default_class,
                          show_progress=a.progress and sys.stderr.isatty())
    _report(a, trace, spec, results, t0)
    if any(r.partial for _, r in results):
        raise typer.Exit(130)


def _parse(a: SimArgs) -> _Parsed:
    """The flags checked and parsed; ValidationError naming every bad one with what is allowed."""
    errors = []
    if a.format is not None and a.format not in FORMATS:
        errors.append(("--format", a.format, "one of " + ", ".join(FORMATS)))
    if a.estimates is not None and a.estimates not in ESTIMATES:
        errors.append(("--estimates", a.estimates, "one of " + ", ".join(ESTIMATES)))
    if a.cluster is not None and a.nodes is not None or a.cluster is None and a.nodes is None and not a.from_journal:
        errors.append(("--cluster/--nodes", a.cluster or a.nodes, "exactly one of --cluster FILE or --nodes N (with "
                                                                  "--from-journal: the journal's nodes by default)"))
    if sum(x is not None for x in (a.trace_path, a.generate_mix, a.from_journal)) != 1:
        errors.append(("TRACE/--generate/--from-journal", a.trace_path or a.generate_mix or a.from_journal,
                       "exactly one of a trace file, --generate MIX or --from-journal JOURNAL"))
    if a.generate_mix is not None and a.generate_mix not in MIXES:
        errors.append(("--generate", a.generate_mix, "one of " + ", ".join(MIXES)))
    if a.generate_mix is not None and a.jobs < 1:
        errors.append(("--jobs", a.jobs, "an integer >= 1"))
    if a.users < 0:
        errors.append(("--users", a.users, "an integer >= 0 (0: no users)"))
    if a.generate_mix is None and a.users:
        errors.append(("--users", a.users, "only with --generate"))
    if a.generate_mix is not None and not (math.isfinite(a.load) and 0 < a.load <= 10):
        errors.append(("--load", a.load, "a number > 0 and <= 10"))
    if a.generate_mix is None and a.write_trace is not None:
        errors.append(("--write-trace", str(a.write_trace), "only with --generate MIX"))
    config: Dict[str, Any] = {}
    if a.victim_cost is not None:
        if a.victim_cost in VICTIM_COSTS:
            config["victim_cost"] = a.victim_cost
        else:
            errors.append(("--victim-cost", a.victim_cost, "one of " + ", ".join(VICTIM_COSTS.names())))
    if a.hysteresis_min_run is not None:
        try:
            config["hysteresis_min_run_s"] = parse_duration(a.hysteresis_min_run)
        except ValueError:
            errors.append(("--hysteresis-min-run", a.hysteresis_min_run, "a duration >= 0 like 0, 30m or 1h"))
    if a.hysteresis_fraction is not None:
        if not (math.isfinite(a.hysteresis_fraction) and 0 <= a.hysteresis_fraction <= 100):
            errors.append(("--hysteresis-fraction", a.hysteresis_fraction, "a number >= 0 and <= 100, like 0.5"))
        else:
            config["hysteresis_service_fraction"] = a.hysteresis_fraction
    names: List[str] = []
    for p in a.preset or []:
        names += COMPARISON if p == "compare" else [p]
    for p in names:
        if p not in PRESETS:
            errors.append(("--preset", p, "one of " + ", ".join(PRESETS) + ", or compare"))
    thresholds = None
    if a.las_thresholds is not None:
        try:
            thresholds = tuple(parse_duration(v) for v in _split(a.las_thresholds))
        except ValueError:
            errors.append(("--las-thresholds", a.las_thresholds, "comma-separated durations like 1h,10h"))
    ckpt = None
    if a.checkpoint_every is not None:
        try:
            ckpt = parse_duration(a.checkpoint_every)
        except ValueError:
            errors.append(("--checkpoint-every", a.checkpoint_every, "a duration like 300, 5m or 1h"))
    from raylane.scheduling import PLACEMENTS

    for p in a.placement or []:
        if p not in PLACEMENTS:
            errors.append(("--placement", p, "one of " + ", ".join(PLACEMENTS.names())))
    outage_kw = _outage_flags(a.fail, a.drain, a.mtbf, a.repair, a.drain_deadline, errors)
    overhead = None
    if a.resize_overhead is not None:
        try:
            overhead = parse_duration(a.resize_overhead)
        except ValueError:
            errors.append(("--resize-overhead", a.resize_overhead, "a duration >= 0 like 0, 60 or 2m"))
    idle = None
    if a.idle_timeout is not None:
        try:
            idle = parse_duration(a.idle_timeout)
        except ValueError:
            errors.append(("--idle-timeout", a.idle_timeout, "a duration >= 0 like 300, 5m or 10m"))
    reclaim = a.spot_reclaim_per_hour
    if reclaim is not None and not (math.isfinite(reclaim) and reclaim >= 0):
        errors.append(("--spot-reclaim-per-hour", reclaim, "a number >= 0: reclaims per spot node-hour, like 0.01"))
    if a.elastic_speedup is not None:
        try:
            speedup_table(a.elastic_speedup)
        except FatalError:
            errors.append(("--elastic-speedup", a.elastic_speedup, ELASTIC_SPEEDUP_ALLOWED))
    if errors:
        raise ValidationError("flags", errors)
    config = {**{k: v for k, v in dict(ordering=a.ordering, backfill=a.backfill, preemption=a.preemption,
                                       admission=a.admission, las_thresholds=thresholds).items() if v is not None},
              **config}
    options = {k: v for k, v in dict(estimates=a.estimates, noise_sigma=a.noise_sigma, stop_delay_s=a.stop_delay,
                                     tick_s=a.tick, max_examined=a.max_examined, elastic_speedup=a.elastic_speedup,
                                     resize_overhead_s=overhead, idle_timeout_s=idle,
                                     spot_reclaim_per_hour=reclaim).items() if v is not None}
    return _Parsed(names, config, options, ckpt, outage_kw)


def _journal(a: SimArgs):
    """``--from-journal``: the journal's trace, nodes, outages and (without ``--policy``) its last policy."""
    from raylane.config.loader import load_policy
    from raylane.sim.journal import trace_from_journal

    return trace_from_journal(str(a.from_journal), load_policy(a.policy) if a.policy is not None else None)


def _outages(a: SimArgs, flags: _Parsed, spec: ClusterSpec, journal: Optional[Outages] = None) -> Outages:
    """The outages of the flags, of ``--node-events`` and of the journal replayed, checked against the cluster's
    node ids."""
    kw = flags.outages
    if journal is not None:
        kw["failures"] += list(journal.failures)
        kw["drains"] += list(journal.drains)
    if a.node_events is not None:
        more_failures, more_drains = load_node_events(a.node_events)
        kw["failures"] += more_failures
        kw["drains"] += more_drains
    outages = Outages(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
    outages.check_nodes(n.id for n in spec.nodes())
    return outages


def _trace(a: SimArgs, spec: ClusterSpec) -> Trace:
    """The trace file's jobs in the window, or a generated mix sized against ``spec`` (also written, if asked)."""
    if a.generate_mix is not None:
        trace = generate(a.generate_mix, seed=a.seed, jobs=a.jobs, cluster_gpus=spec.total_gpus, load=a.load,
                         users=a.users)
        if a.write_trace is not None:
            write_csv(trace, a.write_trace)
            _err.print(f"wrote the generated trace to {a.write_trace}", markup=False)
    else:
        trace = load_trace(a.trace_path, format=a.format, team_column=a.team_column, user_column=a.user_column,
                           start=a.start, end=a.end, limit=a.limit)
    if not trace.jobs:
        raise ValidationError(str(a.trace_path), [("(rows)", 0, "at least one job in the chosen window")])
    return trace


def _policy(a: SimArgs, trace: Trace, checkpoint_s: Optional[float], journal_policy=None):
    """(scheduler config, teams, classes, default class) from ``--policy`` (or the replayed journal's policy), or one
    shared cluster with no quotas; ``--class`` and ``--checkpoint-every`` applied."""
    teams: Dict[str, Team] = {}
    classes: Dict[str, WorkloadClass] = {}
    default_class = DEFAULT_CLASS
    if a.policy is not None or journal_policy is not None:
        from raylane.config.loader import load_policy, load_policy_from_dict

        pol = load_policy(a.policy) if a.policy is not None else load_policy_from_dict(journal_policy,
                                                                                       "the journal's policy")
        base = pol.to_scheduler_config()
        teams = pol.core_teams()
        classes = {name: pol.workload_class(name) for name in pol.classes}
        missing = [t for t in trace.teams if t not in teams]
        if missing:
            _err.print(f"note: {len(missing)} trace team(s) not in {a.policy} run with no quota: "
                       + ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""), markup=False)
        if a.job_class is not None:
            default_class = pol.workload_class(a.job_class)
    else:
        base = SchedulerConfig(admission="none")
        if a.job_class is not None:
            raise ValidationError("flags", [("--class", a.job_class, "a class of the --policy file (no policy given)")])
    if checkpoint_s is not None:
        default_class = replace(default_class, checkpoint_interval_s=checkpoint_s)
        classes = {k: replace(c, checkpoint_interval_s=checkpoint_s) for k, c in classes.items()}
    return base, teams, classes, default_class


def _runs(a: SimArgs, flags: _Parsed, base: SchedulerConfig,
          base_opts: SimOptions) -> List[Tuple[str, SchedulerConfig, SimOptions]]:
    """One (label, config, options) per preset (or the policy alone) and per ``--placement``; the policy names
    checked."""
    runs: List[Tuple[str, SchedulerConfig, SimOptions]] = []
    for name in flags.names or [None]:
        for place in a.placement or [None]:
            cfg, opts = (base, base_opts) if name is None else apply_preset(get_preset(name), base, base_opts)
            cfg, opts = replace(cfg, **flags.config), replace(opts, **flags.options)
            label = name or (f"{cfg.ordering}/{cfg.backfill}/{cfg.preemption}" if a.policy is None else a.policy.stem)
            if place is not None:
                opts = replace(opts, placement=place)
                if len(a.placement) > 1:
                    label += f" {place}"
            runs.append((label, cfg, opts))
    _check_names(runs)
    return runs


def _report(a: SimArgs, trace: Trace, spec: ClusterSpec, results: List[Tuple[str, SimResult]], t0: float) -> None:
    """The table (or the JSON report with ``--json``) on stdout, what was left out on stderr, the files of
    ``--out``. ``t0``: when the replays began (the report's wall time counts from it)."""
    summaries = {label: summarize(r) for label, r in results}
    meta = {"trace": trace.source, "format": trace.format, "window": {"start": a.start, "end": a.end,
                                                                      "limit": a.limit},
            "cluster": spec.describe(), "wall_s": time.perf_counter() - t0}
    report = report_json(summaries, meta)
    table = render_table(summaries)
    for label, r in results:
        if r.rejected:
            _err.print(f"{label}: {len(r.rejected)} job(s) can never run on this cluster and were left out; "
                       f"first: {r.rejected[0][0].id}: {r.rejected[0][1]}", markup=False)
    if a.as_json:
        _out.print_json(json.dumps(report))
    else:
        _out.print(table)
        for label, r in results:
            _print_run_lines(label, r, summaries[label])
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
        with (a.out / "table.txt").open("w") as f:
            Console(file=f, width=240, highlight=False).print(table)
        written = ["summary.json", "table.txt"]
        if a.plots:
            from raylane.sim.plots import write_plots

            written += [p.name for p in write_plots(results, a.out)]
        _err.print(f"wrote {', '.join(written)} to {a.out}", markup=False)


def _print_run_lines(label: str, r: SimResult, s: Dict[str, Any]) -> None:
    """Under the table: the run's replay and cycle times, and its job preempted most per hour of runtime."""
    lat = s["replay"]
    _out.print(f"{label}: replayed {len(r.jobs)} jobs in {r.wall_s:.1f}s wall ({r.cycles} cycles; each "
               f"p50 {lat['cycle_ms']['p50']:.2f} ms, p99 {lat['cycle_ms']['p99']:.2f} ms, max "
               f"{lat['cycle_ms']['max']:.2f} ms wall; up to {lat['pending_max']} pending)"
               + (" [partial: stopped early]" if r.partial else ""), markup=False)
    worst = s["preemptions"]["per_hour"]["worst"]
    if worst is not None:
        _out.print(f"{label}: most preempted per hour of runtime: job {worst['id']}, "
                   f"{worst['preemptions']} preemption(s) in {worst['runtime_h']:.2f} h "
                   f"({worst['preemptions'] / worst['runtime_h']:.2f}/h)", markup=False)


def _outage_flags(fail, drain, mtbf, repair, drain_deadline, errors: list) -> Dict[str, Any]:
    """The outage flags as ``Outages`` fields; each bad flag appended to ``errors``."""
    kw: Dict[str, Any] = {"failures": [], "drains": []}
    for kind, values in (("fail", fail), ("drain", drain)):
        for v in values or []:
            try:
                kw["failures" if kind == "fail" else "drains"].append(parse_outage(kind, v))
            except ValidationError as exc:
                errors.extend(exc.errors)
    for flag, key, value, none_ok in (("--mtbf", "mtbf_s", mtbf, False), ("--repair", "repair_s", repair, False),
                                      ("--drain-deadline", "drain_deadline_s", drain_deadline, True)):
        if value is None:
            continue
        if none_ok and value.strip().lower() == "none":
            kw[key] = None
            continue
        try:
            kw[key] = parse_duration(value)
        except ValueError:
            errors.append((flag, value, "a duration like 90, 30m, 2h or 30d" + (", or none" if none_ok else "")))
            continue
        if key == "mtbf_s" and kw[key] <= 0:
            errors.append((flag, value, "a duration > 0"))
    return kw


def _check_names(runs) -> None:
    from raylane.scheduling import ADMISSIONS, BACKFILLS, ORDERINGS, PREEMPTIONS

    errors = []
    for label, cfg, _ in runs:
        for axis, reg in (("ordering", ORDERINGS), ("backfill", BACKFILLS), ("preemption", PREEMPTIONS),
                          ("admission", ADMISSIONS)):
            name = getattr(cfg, axis)
            if name not in reg:
                errors.append((f"{label}: {axis}", name, "one of " + ", ".join(reg.names())))
    if errors:
        raise ValidationError("policy", errors)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("sim")(sim)


def register(parent: typer.Typer) -> None:
    """Attach ``sim`` and ``sim-autoscale`` (``raylane.sim.costcompare``) to the ``raylane`` command line."""
    from raylane.sim.costcompare import register as register_compare

    parent.command("sim")(sim)
    register_compare(parent)
