"""``raylane plan PIPELINE.yaml --cluster CLUSTER.yaml``: plan a pipeline offline (see docs/pipelines.md)."""
import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from raylane.errors import ValidationError
from raylane.planning import PLANNERS
from raylane.planning.yamlio import LoadError, dump_plan, load_cluster, load_pipeline

SOLVERS = ("heft", "olb", "cpsat")


def plan(pipeline: Path = typer.Argument(..., help="pipeline YAML"),
         cluster: Path = typer.Option(..., "--cluster", help="planning cluster YAML"),
         solver: str = typer.Option("heft", "--solver", help="heft, olb or cpsat"),
         time_limit: float = typer.Option(10.0, "--time-limit", help="cpsat time limit in seconds"),
         out: Optional[Path] = typer.Option(None, "--out", help="write the plan YAML here"),
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
         describe: bool = typer.Option(False, "--describe", help="print the problem as plain text and stop")):
    """Plan a pipeline on a cluster and print the placements and makespan."""
    if solver not in SOLVERS:
        typer.echo(f"--solver: got {solver!r}; allowed: {', '.join(SOLVERS)}", err=True)
        raise typer.Exit(2)
    try:
        p = load_pipeline(pipeline)
        nodes, net = load_cluster(cluster)
        planner = PLANNERS.get("cpsat").__class__(time_limit_s=time_limit) if solver == "cpsat" else PLANNERS.get(solver)
        if describe:
            typer.echo(describe_problem(p, nodes, net))
            return
        result = planner.plan(p, nodes, net)
    except (LoadError, ValidationError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2)
    if out:
        out.write_text(dump_plan(result))
    where = {x.stage: x.node for x in result.placements}
    moved = sum(d.output_gb for st in p.stages for d in p.stages if d.name in st.needs and where[d.name] != where[st.name])
    if as_json:
        typer.echo(json.dumps({"planner": result.planner, "status": result.status.name, "makespan_h": result.makespan_h,
                               "bound_h": result.bound_h, "data_moved_gb": moved,
                               "stages": {x.stage: {"node": x.node, "start_h": x.start_h, "finish_h": x.finish_h}
                                          for x in result.placements}}))
        return
    table = Table("stage", "node", "start (h)", "finish (h)")
    for x in sorted(result.placements, key=lambda x: (x.start_h, x.stage)):
        table.add_row(x.stage, x.node, f"{x.start_h:g}", f"{x.finish_h:g}")
    console = Console()
    console.print(table)
    console.print(f"data moved: {moved:g} GB")
    console.print(f"makespan: {result.makespan_h:g} h ({result.planner}, {result.status.name.lower()}"
                  + (f", bound {result.bound_h:g} h" if result.bound_h is not None else "") + ")")


def describe_problem(p, nodes, net) -> str:
    """The problem as plain text a person or an LLM can draft a plan from."""
    lines = ["Pipeline stages (memory and output in GB, durations in hours):"]
    for s in p.stages:
        per = "".join(f", on {t}: {h:g} h" for t, h in sorted(s.durations_h.items()))
        lines.append(f"- {s.name}: needs [{', '.join(s.needs)}]; cpu {s.cpu:g}, memory {s.memory_gb:g}, gpu {s.gpu:g}, "
                     f"features [{', '.join(sorted(s.features))}]; duration {s.duration_h:g} h{per}; output {s.output_gb:g}")
    lines.append("Nodes:")
    for n in nodes:
        lines.append(f"- {n.name} (type {n.node_type}): cpu {n.cpu:g}, memory {n.memory_gb:g}, gpu {n.gpu:g}, "
                     f"features [{', '.join(sorted(n.features))}]")
    lines.append(f"Network: {net.default_gb_per_h:g} GB/h between nodes unless listed; same node: no transfer.")
    for (a, b), bw in dict(net.links).items():
        lines.append(f"- {a} <-> {b}: {bw:g} GB/h")
    lines += ["A stage starts after every stage it needs has finished and its output has arrived (output / bandwidth).",
              "Stages on one node run at once while cpu, memory and gpu fit. Minimise the makespan.",
              "Answer in this YAML format (hours):",
              "kind: plan", "makespan: 9.25", "stages:", "  T1: {node: gpu-1, start: 0, finish: 3}"]
    return "\n".join(lines)


def register(parent: typer.Typer) -> None:
    """Attach ``plan`` to the ``raylane`` command line."""
    parent.command("plan")(plan)
