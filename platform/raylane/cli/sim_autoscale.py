"""``raylane sim-autoscale``: one trace replayed on a fixed cluster and on autoscaled node groups, cost against JCT.

This module owns the command: its flags, the cluster files' checks (every file priced, the fixed one not growable),
the replays (``raylane sim``'s: ``raylane.cli.sim_runs``) and the table, JSON and plot it writes. The figures and
the goal they are held to are ``raylane.sim.costcompare``'s; the cost figures of each replay are
``raylane.sim.metrics.capacity``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import typer
from rich.console import Console
from rich.table import Table

from raylane.cli.common import exit_with_error
from raylane.cli.sim_args import SimArgs
from raylane.cli.sim_runs import jsonable, parse_flags, run_replays, trace_of
from raylane.errors import FatalError, ValidationError
from raylane.scheduling.types import SchedulerConfig
from raylane.sim.cluster import ClusterSpec, load_cluster
from raylane.sim.costcompare import GOAL_COST, GOAL_JCT, compare_rows, peak_gpus
from raylane.sim.engine import DEFAULT_CLASS, SimOptions, SimResult
from raylane.sim.generate import MIXES
from raylane.sim.metrics import summarize
from raylane.sim.presets import PRESETS, apply_preset, get_preset

__all__ = ["sim_autoscale", "register"]

_out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _table(rows: List[Dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("run", "GPU-h (window)", "cost (window)", "of it spot", "cost (replay)", "nodes avg", "nodes max",
                "reclaims", "util of bought", "JCT avg (h)", "JCT p50 (h)", "queue avg (min)", "cost / fixed",
                "JCT avg / fixed", "goal"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for r in rows:
        goal = "-" if r["goal_met"] is None else ("met" if r["goal_met"] else "not met")
        t.add_row(r["run"], f"{r['window_gpu_hours']:,.0f}", f"{r['window_cost']:,.0f}",
                  f"{r['window_cost_spot']:,.0f}", f"{r['cost']:,.0f}",
                  f"{r['nodes_mean']:,.1f}", f"{r['nodes_max']}", f"{r['reclaims']}",
                  f"{r['utilization_bought']:.1%}", f"{r['jct_mean'] / 3600:.2f}", f"{r['jct_p50'] / 3600:.2f}",
                  f"{r['queue_mean'] / 60:.1f}", f"{r['cost_ratio']:.2f}", f"{r['jct_ratio']:.3f}", goal)
    return t


def _priced(spec: ClusterSpec, path: Path) -> None:
    missing = [g.name for g in spec.node_groups if g.price is None]
    if missing:
        raise ValidationError(str(path), [(f"node_groups ({', '.join(missing)}).price", None,
                                           "a price per GPU-hour on every group: the comparison is of costs")])


def _clusters(fixed_path: Path, autoscaled_paths: List[Path]) -> List[Tuple[str, ClusterSpec]]:
    """(label, cluster) of the fixed file, then of each autoscaled one; every problem of every file is reported at
    once, each named with its file."""
    problems: List[Tuple[str, object, str]] = []
    out: List[Tuple[str, ClusterSpec]] = []
    for i, p in enumerate([fixed_path, *autoscaled_paths]):
        try:
            spec = load_cluster(p)
            _priced(spec, p)
        except ValidationError as exc:
            problems += [(f"{p}: {field}", value, allowed) for field, value, allowed in exc.errors]
            continue
        if i == 0 and spec.growable:
            problems.append((f"{p}: node_groups", "min/max", "fixed groups only (no min or max)"))
        out.append((p.stem, spec))
    if problems:
        raise ValidationError("cluster files", problems)
    return out


def sim_autoscale(
    trace_path: Optional[Path] = typer.Argument(None, metavar="[TRACE]", help="trace CSV; none with --generate"),
    fixed: Path = typer.Option(..., "--fixed", help="the fixed cluster file (priced), sized for the trace's peak"),
    autoscaled: List[Path] = typer.Option(..., "--autoscaled", help="an autoscaled cluster file (growable, priced "
                                          "groups); repeatable: one run each"),
    generate_mix: Optional[str] = typer.Option(None, "--generate", help="a generated trace of this mix instead of "
                                               "a file: " + ", ".join(MIXES)),
    jobs: int = typer.Option(2000, "--jobs", help="with --generate: how many jobs"),
    load: float = typer.Option(0.4, "--load", help="with --generate: GPU-time asked over the fixed cluster's"),
    seed: int = typer.Option(0, "--seed", help="seed of --generate and of the spot reclaims"),
    start: Optional[str] = typer.Option(None, help="keep jobs submitted from this date (or second) on"),
    end: Optional[str] = typer.Option(None, help="keep jobs submitted before this date (or second)"),
    limit: Optional[int] = typer.Option(None, help="keep only the first N jobs"),
    preset: str = typer.Option("greedy", "--preset", help="the policy of every run: " + ", ".join(PRESETS)),
    idle_timeout: Optional[str] = typer.Option(None, "--idle-timeout", help="as raylane sim's (default 5m)"),
    spot_reclaim_per_hour: Optional[float] = typer.Option(None, "--spot-reclaim-per-hour",
                                                          help="as raylane sim's (default 0.01)"),
    out: Optional[Path] = typer.Option(None, "--out", help="directory for compare.json and nodes.png"),
    as_json: bool = typer.Option(False, "--json", help="print the rows as JSON instead of the table"),
) -> None:
    """Replay one trace on a fixed cluster and on autoscaled node groups, and compare cost against JCT."""
    try:
        _compare(SimArgs(trace_path=trace_path, generate_mix=generate_mix, jobs=jobs, load=load, seed=seed,
                         start=start, end=end, limit=limit, idle_timeout=idle_timeout,
                         spot_reclaim_per_hour=spot_reclaim_per_hour, out=out, as_json=as_json),
                 fixed, autoscaled, preset)
    except FatalError as exc:
        exit_with_error(exc)


def _compare(a: SimArgs, fixed_path: Path, autoscaled_paths: List[Path], preset: str) -> None:
    errors = []
    if (a.trace_path is None) == (a.generate_mix is None):
        errors.append(("TRACE/--generate", a.trace_path or a.generate_mix, "exactly one of a trace file or "
                                                                         "--generate MIX"))
    if preset not in PRESETS:
        errors.append(("--preset", preset, "one of " + ", ".join(PRESETS)))
    if errors:
        raise ValidationError("flags", errors)
    flags = parse_flags(SimArgs(**{**a.__dict__, "nodes": 1}))  # the shared flags, checked as raylane sim checks them
    clusters = _clusters(fixed_path, autoscaled_paths)
    fixed = clusters[0][1]
    trace = trace_of(a, fixed)
    cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(admission="none"), SimOptions(seed=a.seed))
    from dataclasses import replace

    opts = replace(opts, **flags.options)
    peak = peak_gpus(trace)
    _err.print(f"trace {trace.source}: {len(trace.jobs)} jobs, {trace.gpu_seconds() / 3600:,.0f} GPU-hours over "
               f"{trace.span() / 3600:,.1f} h of submits; peak {peak:,.0f} GPUs (every job from its submit); "
               f"fixed cluster {fixed.describe()}", markup=False)
    results: List[Tuple[str, SimResult]] = []
    for label, spec in clusters:
        got = run_replays(trace, spec, [(label, cfg, opts)], teams={}, classes={}, default_class=DEFAULT_CLASS,
                          show_progress=sys.stderr.isatty())
        results += got
        if got[-1][1].partial:
            break
    summaries = [(label, summarize(r)) for label, r in results]
    rows = compare_rows(summaries)
    report = jsonable({"trace": trace.source, "jobs": len(trace.jobs), "peak_gpus": peak, "preset": preset,
                        "goal": {"cost": GOAL_COST, "jct": GOAL_JCT}, "rows": rows})
    if a.as_json:
        _out.print_json(json.dumps(report))
    else:
        _out.print(_table(rows, f"{trace.source}: {len(trace.jobs)} jobs, preset {preset}, peak {peak:,.0f} GPUs"))
    if a.out is not None:
        from raylane.sim.plots import plot_nodes

        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
        plot_nodes(results, a.out / "nodes.png")
        _err.print(f"wrote compare.json, nodes.png to {a.out}", markup=False)


def register(parent: typer.Typer) -> None:
    parent.command("sim-autoscale")(sim_autoscale)
