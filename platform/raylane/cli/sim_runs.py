"""How the flags of ``raylane sim`` become replays, and running them: the checked flags, the trace, the policy, one
run per preset and placement, the replays with their progress bar and Ctrl-C.

This module owns what is derived from ``SimArgs`` (``raylane.cli.sim_args``: the flags themselves); the ``sim``
command (``raylane.cli.sim``: what it prints) and ``sim-autoscale`` (``raylane.cli.sim_autoscale``) both build on
it, so neither imports the other's command. The replays themselves are the simulator's (``raylane.sim``).

Words
- *flags*: ``SimArgs`` as the user gave them; ``Flags``: the same once checked (every bad flag reported at once).
- *run*: one (label, scheduler config, replay options) to replay the trace under.
"""
from __future__ import annotations

import math
import signal
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from raylane.cli.sim_args import SimArgs
from raylane.config.fields import parse_duration
from raylane.errors import FatalError, ValidationError
from raylane.scheduling.preemption import VICTIM_COSTS
from raylane.scheduling.types import SchedulerConfig, Team, WorkloadClass
from raylane.sim.cluster import ClusterSpec
from raylane.sim.engine import (DEFAULT_CLASS, ELASTIC_SPEEDUP_ALLOWED, ESTIMATES, SimOptions, SimResult, Simulator,
                                speedup_table)
from raylane.sim.generate import MIXES, generate, write_csv
from raylane.sim.outages import Outages, load_node_events, parse_outage
from raylane.sim.presets import COMPARISON, PRESETS, apply_preset, get_preset
from raylane.sim.traces import FORMATS, Trace, load_trace
from raylane.sim.types import FIDELITIES

__all__ = ["Flags", "parse_flags", "journal_of", "outages_of", "trace_of", "policy_of", "runs_of", "run_replays",
           "jsonable", "split_list", "hours"]

_err = Console(stderr=True, highlight=False, soft_wrap=True)


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


def hours(s: float) -> str:
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
                bar.update(task, completed=done, jobs=f"{done}/{total} jobs", clock=hours(now))

            result = sim.run(progress=progress, should_stop=lambda: intr.requested)
            bar.update(task, completed=sum(1 for f in result.finish if f >= 0),
                       description=label + (" [partial]" if result.partial else ""))
            results.append((label, result))
            if result.partial:
                break
    return results


def jsonable(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def split_list(value: Optional[str]) -> List[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@dataclass
class Flags:
    """What the flags say once checked: the presets to run, the overrides of the policy and of the replay options,
    the checkpoint interval and the outages (``Outages`` fields)."""

    names: List[str]
    config: Dict[str, Any]
    options: Dict[str, Any]
    checkpoint_s: Optional[float]
    outages: Dict[str, Any]


def parse_flags(a: SimArgs) -> Flags:
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
            thresholds = tuple(parse_duration(v) for v in split_list(a.las_thresholds))
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
    handover = None
    if a.handover is not None:
        try:
            handover = parse_duration(a.handover)
        except ValueError:
            errors.append(("--handover", a.handover, "a duration >= 0 like 0, 30 or 30s"))
    if a.fidelity is not None and a.fidelity not in FIDELITIES:
        errors.append(("--fidelity", a.fidelity, "one of " + ", ".join(FIDELITIES)))
    elif handover and (a.fidelity or ("live" if a.from_journal else "trace")) != "live":
        errors.append(("--handover", a.handover, "only with --fidelity live (the trace fidelity models none)"))
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
                                     resize_overhead_s=overhead, idle_timeout_s=idle, fidelity=a.fidelity,
                                     handover_s=handover,
                                     spot_reclaim_per_hour=reclaim).items() if v is not None}
    return Flags(names, config, options, ckpt, outage_kw)


def journal_of(a: SimArgs):
    """``--from-journal``: the journal's trace, nodes, outages and (without ``--policy``) its last policy."""
    from raylane.config.loader import load_policy
    from raylane.sim.journal import trace_from_journal

    return trace_from_journal(str(a.from_journal), load_policy(a.policy) if a.policy is not None else None)


def outages_of(a: SimArgs, flags: Flags, spec: ClusterSpec, journal: Optional[Outages] = None) -> Outages:
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


def trace_of(a: SimArgs, spec: ClusterSpec) -> Trace:
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


def policy_of(a: SimArgs, trace: Trace, checkpoint_s: Optional[float], journal_policy=None):
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


def runs_of(a: SimArgs, flags: Flags, base: SchedulerConfig,
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
