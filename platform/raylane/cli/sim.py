"""``raylane sim``: replay a job trace on a simulated cluster under a policy, and report the figures.

This module owns the ``sim`` command of the simulator (``raylane.sim``): the table and JSON it prints and the files
it writes. Its flags are ``SimArgs`` (``raylane.cli.sim_args``), from which its typer signature is built. How the
flags combine a trace, a cluster, a policy and presets into replays, and the progress bar and Ctrl-C while they
run, are ``raylane.cli.sim_runs`` (shared with ``sim-autoscale``). The policy is taken, in this order, from the
policy file (``--policy``, the format of ``policies/*.yaml``), then ``--preset`` (named choices on the scheduler
axes, ``raylane.sim.presets``), then the single-axis flags (``--ordering`` ...). Without a policy file the trace's
teams share one cluster with no quotas (admission ``none``).

Several ``--preset`` (or ``--preset compare``) replay the same trace once per preset and add the ratios of each
figure to the ``srtf-oracle`` and ``fifo`` runs when those are among them.

Instead of a trace file, ``--generate MIX`` draws a synthetic trace of a workload mix (``raylane.sim.generate``:
heavy-tail, shared-burst, big-gangs) from ``--seed``, sized by ``--jobs`` and ``--load`` against the chosen
cluster; ``--write-trace FILE`` also writes it as a generic CSV that replays as a file later.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from typing import Any, Dict, List, Tuple

import typer
from rich.console import Console
from rich.table import Table

from raylane.cli.common import exit_with_error
from raylane.cli.sim_args import SimArgs, command
from raylane.cli.sim_runs import (hours, journal_of, jsonable, outages_of, parse_flags, policy_of, run_replays,
                                  runs_of, split_list, trace_of)
from raylane.errors import FatalError
from raylane.sim.cluster import ClusterSpec, cluster_from_flags, load_cluster
from raylane.sim.engine import SimOptions, SimResult
from raylane.sim.metrics import (CAPACITY_FIGURES, FIGURES, OUTAGE_FIGURES, RUN_LIMIT_FIGURES, USER_FIGURES, get,
                                 summarize)
from raylane.sim.traces import Trace

__all__ = ["register", "sim", "app", "comparison_rows", "render_table", "report_json"]

# Tables are wide: when the output is not a terminal, do not squeeze them into 80 columns.
_out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

# Ratios in the comparison table are taken against these runs when present.
REFERENCES = ("srtf-oracle", "fifo")


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


def report_json(summaries: Dict[str, Dict[str, Any]], meta: Dict[str, Any]) -> Dict[str, Any]:
    return jsonable({
        "partial": any(s["partial"] for s in summaries.values()),
        **meta,
        "runs": summaries,
        "ratios": comparison_rows(summaries),
    })


# ------------------------------------------------------------------------------------------------------- CLI


def _run(a: SimArgs) -> None:
    try:
        _sim(a)
    except FatalError as exc:
        exit_with_error(exc)


# The command: one parameter per field of SimArgs, with its flag, default and help (raylane.cli.sim_args).
sim = command(
    SimArgs, _run, name="sim",
    doc="""Replay a job trace through the scheduling core on a simulated cluster and report JCT, queueing delay,
    makespan, utilization, fairness and preemptions. Ctrl-C stops a long replay and keeps its partial figures.""")


def _sim(a: SimArgs) -> None:
    # 1. Check every flag (all errors at once), 2. the cluster, the trace and the outages, 3. the policy,
    # 4. one run per preset and placement, 5. replay them and report.
    flags = parse_flags(a)
    journal = journal_of(a) if a.from_journal is not None else None
    if journal is not None and a.cluster is None and a.nodes is None:
        spec = journal.cluster()
    else:
        spec = load_cluster(a.cluster) if a.cluster is not None else cluster_from_flags(
            a.nodes, a.gpus_per_node, cpus_per_node=a.cpus_per_node, memory_per_node=a.memory_per_node,
            features=split_list(a.features))
    outages = outages_of(a, flags, spec, journal.outages if journal is not None else None)
    trace = journal.trace if journal is not None else trace_of(a, spec)
    base, teams, classes, default_class = policy_of(a, trace, flags.checkpoint_s,
                                                  journal.policy if journal is not None else None)
    base_opts = SimOptions(seed=a.seed, outages=outages)
    if journal is not None:
        # What the live plane ran: its fidelity, and the gangs' hand-over and stop delay as the journal measured them
        # (a resize restarts its gang: a hand-over again); flags override each.
        handover = journal.handover_s or 0.0
        # Runtimes as the control plane knew them: learned from what ended before each instant, declared estimates
        # folded in (raylane.control.learned).
        base_opts = replace(base_opts, fidelity="live", handover_s=handover, stop_delay_s=journal.stop_delay_s or 0.0,
                            estimates="predicted-declared",
                            **({"resize_overhead_s": handover} if journal.handover_s is not None else {}))
    runs = runs_of(a, flags, base, base_opts)
    _err.print(f"trace {trace.source}: {len(trace.jobs)} jobs, {len(trace.teams)} team(s), "
               f"{trace.gpu_seconds() / 3600:,.0f} GPU-hours over {hours(trace.span())}; "
               f"load {trace.gpu_seconds() / max(trace.span() * spec.total_gpus, 1e-9):.2f} on {spec.describe()}",
               markup=False)
    t0 = time.perf_counter()
    results = run_replays(trace, spec, runs, teams=teams, classes=classes, default_class=default_class,
                          show_progress=a.progress and sys.stderr.isatty())
    _report(a, trace, spec, results, t0, journal)
    if any(r.partial for _, r in results):
        raise typer.Exit(130)


def _report(a: SimArgs, trace: Trace, spec: ClusterSpec, results: List[Tuple[str, SimResult]], t0: float,
            journal=None) -> None:
    """The table (or the JSON report with ``--json``) on stdout, what was left out on stderr, the files of
    ``--out``. ``t0``: when the replays began (the report's wall time counts from it). ``journal``: a replayed
    journal, whose live figures are shown beside the replays' (and are the report's ``live``)."""
    summaries = {label: summarize(r) for label, r in results}
    meta = {"trace": trace.source, "format": trace.format, "window": {"start": a.start, "end": a.end,
                                                                      "limit": a.limit},
            "cluster": spec.describe(), "wall_s": time.perf_counter() - t0}
    report = report_json(summaries, meta)
    live = journal.live_summary() if journal is not None else None
    if live is not None:
        report["live"] = jsonable(live)
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
        if live is not None:
            _print_live(live, summaries)
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


def _print_live(live: Dict[str, Any], summaries: Dict[str, Dict[str, Any]]) -> None:
    """The live plane's figures (the journal's) beside each replay's: what a what-if is measured against."""
    from raylane.runtimes.dist import human_s

    def span(x: float) -> str:
        return "-" if x != x else human_s(x)  # (NaN: nothing measured)

    def row(label: str, s: Dict[str, Any]) -> str:
        j, q = s["jct"], s["queueing"]
        return (f"{label:<32} {s['jobs']['finished']:>6} {span(j['mean']):>9} {span(j['p50']):>9} "
                f"{span(j['p95']):>9} {span(q['mean']):>9} {s['preemptions']['total']:>6}")

    _out.print(f"{'':<32} {'ended':>6} {'JCT mean':>9} {'JCT p50':>9} {'JCT p95':>9} {'wait':>9} {'preempt':>6}",
               markup=False)
    _out.print(row("live (the journal)", live), markup=False)
    for label, s in summaries.items():
        _out.print(row(f"replay: {label}", s), markup=False)
    h, d = live.get("handover_s"), live.get("stop_delay_s")
    _out.print("live gangs: hand-over " + (f"{h:.1f}s" if h is not None else "not recorded") + ", stop delay "
               + (f"{d:.1f}s" if d is not None else "none measured") + " (medians; the replay plays them)",
               markup=False)


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


# ``sim`` alone, its arguments straight after the program's name (the tests'; ``raylane sim`` is ``raylane.cli``'s).
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("sim")(sim)


def register(parent: typer.Typer) -> None:
    """Attach ``sim`` to the ``raylane`` command line."""
    parent.command("sim")(sim)
