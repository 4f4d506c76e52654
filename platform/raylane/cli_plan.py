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
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")):
    """Plan a pipeline on a cluster and print the placements and makespan."""
    if solver not in SOLVERS:
        typer.echo(f"--solver: got {solver!r}; allowed: {', '.join(SOLVERS)}", err=True)
        raise typer.Exit(2)
    try:
        p = load_pipeline(pipeline)
        nodes, net = load_cluster(cluster)
        planner = PLANNERS.get("cpsat").__class__(time_limit_s=time_limit) if solver == "cpsat" else PLANNERS.get(solver)
        result = planner.plan(p, nodes, net)
    except (LoadError, ValidationError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2)
    if out:
        out.write_text(dump_plan(result))
    if as_json:
        typer.echo(json.dumps({"planner": result.planner, "status": result.status.name, "makespan_h": result.makespan_h,
                               "bound_h": result.bound_h,
                               "stages": {x.stage: {"node": x.node, "start_h": x.start_h, "finish_h": x.finish_h}
                                          for x in result.placements}}))
        return
    table = Table("stage", "node", "start (h)", "finish (h)")
    for x in sorted(result.placements, key=lambda x: (x.start_h, x.stage)):
        table.add_row(x.stage, x.node, f"{x.start_h:g}", f"{x.finish_h:g}")
    console = Console()
    console.print(table)
    console.print(f"makespan: {result.makespan_h:g} h ({result.planner}, {result.status.name.lower()}"
                  + (f", bound {result.bound_h:g} h" if result.bound_h is not None else "") + ")")


def register(parent: typer.Typer) -> None:
    """Attach ``plan`` to the ``raylane`` command line."""
    parent.command("plan")(plan)
