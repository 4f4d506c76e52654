"""``raylane plan``: plan a pipeline offline, explain the plan, chart it, and check any plan file (docs/pipelines.md).

``plan`` is a group whose default command is the planner: ``raylane plan PIPELINE.yaml --cluster CLUSTER.yaml``
runs the hidden ``solve`` command (any first argument that is not a subcommand's name goes to it), and
``raylane plan check PIPELINE.yaml PLAN.yaml --cluster CLUSTER.yaml`` verifies a plan file. Exit status 2: bad
input (a named error on stderr); ``check`` exits 1 when the plan has violations.
"""
import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from raylane.errors import ValidationError
from raylane.planning import PLANNERS, BestPlanner, CpSatPlanner, PlanStatus, verify
from raylane.planning.explain import critical_path, explain
from raylane.planning.yamlio import LoadError, dump_plan, load_cluster, load_pipeline, load_plan
from raylane.render import cell

SOLVERS = ("best", "heft", "olb", "cpsat")
DEFAULT = "solve"


class _DefaultToSolve(TyperGroup):
    """A group that runs ``solve`` when the first argument is not one of its commands (nor --help)."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [DEFAULT, *args]
        return super().parse_args(ctx, args)


plan_app = typer.Typer(cls=_DefaultToSolve, no_args_is_help=True, help=(
    "Plan a pipeline: raylane plan PIPELINE.yaml --cluster CLUSTER.yaml [--solver best|heft|olb|cpsat] [--out PLAN.yaml] "
    "[--gantt CHART.png] [--json] [--describe]; check a plan: raylane plan check PIPELINE.yaml PLAN.yaml "
    "--cluster CLUSTER.yaml."))


def _fail(e) -> None:
    typer.echo(str(e), err=True)
    raise typer.Exit(2)


@plan_app.command(DEFAULT, hidden=True)
def plan(pipeline: Path = typer.Argument(..., help="pipeline YAML"),
         cluster: Path = typer.Option(..., "--cluster", help="planning cluster YAML"),
         solver: str = typer.Option("best", "--solver", help="best (the better of HEFT's, OLB's and CP-SAT's "
                                                                    "plans), heft, olb or cpsat"),
         time_limit: float = typer.Option(10.0, "--time-limit", help="the CP-SAT time limit of best and cpsat, in seconds"),
         out: Optional[Path] = typer.Option(None, "--out", help="write the plan YAML here"),
         gantt: Optional[Path] = typer.Option(None, "--gantt", help="write a Gantt chart of the plan here (PNG)"),
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
         describe: bool = typer.Option(False, "--describe", help="print the problem as plain text and stop")):
    """Plan a pipeline on a cluster; print the placements, makespan, critical path and why each stage is where it is."""
    if solver not in SOLVERS:
        typer.echo(f"--solver: got {solver!r}; allowed: {', '.join(SOLVERS)}", err=True)
        raise typer.Exit(2)
    try:
        nodes, net = load_cluster(cluster)
        p = load_any_pipeline(pipeline, nodes)
        planner = (CpSatPlanner(time_limit_s=time_limit) if solver == "cpsat" else
                   BestPlanner(time_limit_s=time_limit) if solver == "best" else PLANNERS.get(solver))
        if describe:
            typer.echo(describe_problem(p, nodes, net))
            return
        result = planner.plan(p, nodes, net)
    except (LoadError, ValidationError) as e:
        _fail(e)
    if out:
        out.write_text(dump_plan(result))
    if gantt:
        from raylane.planning.gantt import write_gantt

        write_gantt(gantt, p, result, title=f"{pipeline.stem} on {cluster.stem}", network=net)
    moved = verify(p, nodes, net, result).data_moved_gb
    why = explain(p, nodes, net, result)
    if as_json:
        typer.echo(json.dumps({"planner": result.planner, "status": result.status.name, "makespan_h": result.makespan_h,
                               "bound_h": result.bound_h, "note": result.note, "data_moved_gb": moved,
                               "stages": {x.stage: {"node": x.node, "start_h": x.start_h, "finish_h": x.finish_h}
                                          for x in result.placements},
                               "critical_path": why.to_dict()["critical_path"],
                               "explanations": why.to_dict()["stages"]}))
        return
    table = Table("stage", "node", "start (h)", "finish (h)")
    for x in sorted(result.placements, key=lambda x: (x.start_h, x.stage)):
        table.add_row(cell(x.stage), cell(x.node), f"{x.start_h:g}", f"{x.finish_h:g}")
    console = Console(emoji=False)
    console.print(table)
    console.print(f"data moved: {moved:g} GB")
    console.print(cell(f"makespan: {result.makespan_h:g} h ({result.planner}, {result.status.name.lower()}"
                       + (f", bound {result.bound_h:g} h" if result.bound_h is not None else "") + ")"
                       + (f"; {result.note}" if result.note else "")))
    typer.echo(why.render())  # not through rich: it would wrap the long lines
    if gantt:
        typer.echo(f"Gantt chart: {gantt}")


def _best_known(best) -> str:
    if best.status is PlanStatus.OPTIMAL:
        how = "proven optimal"
    elif best.bound_h is not None:
        how = f"the best found, not proven optimal; no plan is shorter than {best.bound_h:g} h (the solver's bound)"
    else:
        how = "the best found, not proven optimal (durations or transfers off its minute grid: no bound)"
    return f"best known {best.makespan_h:g} h: CP-SAT's plan, {how}" + (f"; {best.note}" if best.note else "")


def load_any_pipeline(path: Path, nodes):
    """A planning pipeline file, or a runnable ``kind: pipeline`` spec (stages with ``workload:``,
    ``raylane.config.pipeline``): its stages' demands are their gangs, their durations the estimates."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        data = None  # load_pipeline says what is wrong
    stages = data.get("stages") if isinstance(data, dict) else None
    if not (isinstance(stages, dict) and any(isinstance(v, dict) and "workload" in v for v in stages.values())):
        return load_pipeline(path)
    from raylane.config import pipeline as ps

    spec = ps.load_pipeline_spec(data, str(path))
    return ps.planning_problem(spec, ps.expand(spec, f"{spec.name}-plan", "."), nodes, 1.0)[0]


@plan_app.command("check")
def check(pipeline: Path = typer.Argument(..., help="pipeline YAML"),
          plan_file: Path = typer.Argument(..., metavar="PLAN", help="plan YAML (the format of --out)"),
          cluster: Path = typer.Option(..., "--cluster", help="planning cluster YAML"),
          time_limit: float = typer.Option(10.0, "--time-limit", help="seconds for CP-SAT to find the best known plan"),
          as_json: bool = typer.Option(False, "--json", help="print the report as JSON")):
    """Verify a plan file: each violation with its numbers, the makespan, data moved and the gap to the best known.

    Exit 0: valid; 1: violations; 2: bad input."""
    try:
        nodes, net = load_cluster(cluster)
        p = load_any_pipeline(pipeline, nodes)
        proposed = load_plan(plan_file)
        best = CpSatPlanner(time_limit_s=time_limit).plan(p, nodes, net)
    except (LoadError, ValidationError) as e:
        _fail(e)
    report = verify(p, nodes, net, proposed, best_known_h=best.makespan_h)
    path = critical_path(p, nodes, net, proposed) if report.ok else ()
    if as_json:
        typer.echo(json.dumps({
            "valid": report.ok, "makespan_h": report.makespan_h, "claimed_makespan_h": report.claimed_makespan_h,
            "data_moved_gb": report.data_moved_gb, "gap": report.gap,
            "violations": [{"kind": v.kind.value, "stage": v.stage, "node": v.node, "amount": v.amount,
                            "message": v.message} for v in report.violations],
            "best_known": {"makespan_h": best.makespan_h, "status": best.status.name, "bound_h": best.bound_h,
                           "note": best.note},
            "critical_path": [str(x) for x in path]}))
    else:
        typer.echo(report.render())
        typer.echo(_best_known(best))
        if report.ok and report.gap < -1e-9:
            typer.echo("this plan is shorter than the best CP-SAT found within the time limit")
        if path:
            typer.echo(f"critical path ({report.makespan_h:g} h):\n" + "\n".join(f"  {x}" for x in path))
    raise typer.Exit(0 if report.ok else 1)


def describe_problem(p, nodes, net) -> str:
    """The problem as plain text a person or an LLM can draft a plan from."""
    net = net.with_storage(nodes)
    lines = ["Pipeline stages (memory and output in GB, durations in hours):"]
    for s in p.stages:
        per = "".join(f", on {t}: {h:g} h" for t, h in sorted(s.durations_h.items()))
        lines.append(f"- {s.name}: needs [{', '.join(s.needs)}]; cpu {s.cpu:g}, memory {s.memory_gb:g}, gpu {s.gpu:g}, "
                     f"features [{', '.join(sorted(s.features))}]; duration {s.duration_h:g} h{per}; output {s.output_gb:g}")
    lines.append("Nodes:")
    for n in nodes:
        storage = (f"storage {n.storage_gbps:g} GB/s = {n.storage_gb_per_h:g} GB/h" if n.storage_gbps > 0
                   else "storage: no limit")
        lines.append(f"- {n.name} (type {n.node_type}): cpu {n.cpu:g}, memory {n.memory_gb:g}, gpu {n.gpu:g}, "
                     f"features [{', '.join(sorted(n.features))}]; {storage}")
    lines.append(f"Network: {net.default_gb_per_h:g} GB/h between nodes unless listed; same node: no transfer.")
    for (a, b), bw in dict(net.links).items():
        if a < b:
            lines.append(f"- {a} <-> {b}: {bw:g} GB/h")
    lines += ["A transfer runs at the lowest of the link's bandwidth and the storage rates of its two nodes.",
              "A stage starts after every stage it needs has finished and its output has arrived (output / rate).",
              "Stages on one node run at once while cpu, memory and gpu fit. Minimise the makespan.",
              "Answer in this YAML format (hours):",
              "kind: plan", "makespan: 9.25", "stages:", "  T1: {node: gpu-1, start: 0, finish: 3}"]
    return "\n".join(lines)


def register(parent: typer.Typer) -> None:
    """Attach the ``plan`` group to the ``raylane`` command line."""
    parent.add_typer(plan_app, name="plan")
