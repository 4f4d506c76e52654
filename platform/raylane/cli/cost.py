"""``raylane cost``: what the cluster's GPUs cost, from the control plane's journal (``raylane.cost``).

One table of spend by workload, sweep, pipeline, team or class (``--by``), one per node type (capacity, leased and
idle GPU-hours and their cost), the total, and each team's spend this calendar month (UTC) against its budget.
Operators see every team; anyone else sees their own teams (``--team``: one of them) and the cluster's idle cost.
"""
from __future__ import annotations

import json
import time
from typing import List, Optional

import typer
from rich.table import Table

from raylane.cli.common import connect, console, err, exit_on_error, parse_duration
from raylane.cost import GROUPS, CostReport
from raylane.render import cell, markup_safe

BY_HELP = "Sum by one of: " + ", ".join(GROUPS) + "."


def _money(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _hours(x: float) -> str:
    return f"{x:,.2f}"


def cost_tables(rep: CostReport, by: str) -> List:
    """The report as rich renderables: the group's rows, node types, totals, budgets. Names (workloads, sweeps,
    pipelines, node types, teams) are ``cell``s: a workload's name is whatever its submitter chose."""
    window = ("all of the journal" if rep.since is None else
              f"since {time.strftime('%Y-%m-%d %H:%M', time.localtime(rep.since))}")
    scope = "all teams" if rep.teams is None else "teams " + (", ".join(rep.teams) or "-")
    out = []
    t = Table(title=cell(f"raylane cost by {by} ({window}; {scope})"))
    cols = [by.upper()] + (["TEAM", "CLASS", "KIND"] if by == "workload" else []) + ["GPU-HOURS", "COST"]
    unpriced_rows = any(r.unpriced_gpu_hours for r in rep.groups.get(by, []))
    if unpriced_rows:
        cols.append("UNPRICED GPU-H")
    for c in cols:
        t.add_column(c, overflow="fold", justify="right" if c in ("GPU-HOURS", "COST", "UNPRICED GPU-H") else "left")
    for r in rep.groups.get(by, []):
        row = [r.key] + ([r.team or "-", r.cls or "-", r.kind or "-"] if by == "workload" else [])
        row += [_hours(r.gpu_hours), _money(r.cost)]
        if unpriced_rows:
            row.append(_hours(r.unpriced_gpu_hours) if r.unpriced_gpu_hours else "")
        t.add_row(*(cell(c) for c in row))
    out.append(t)
    n = Table(title="node types (idle: GPUs no lease held, on every node present, in service or not)")
    for c in ("NODE TYPE", "PRICE", "NODES", "GPU-H", "LEASED GPU-H", "IDLE GPU-H", "LEASED COST", "IDLE COST"):
        n.add_column(c, justify="left" if c == "NODE TYPE" else "right")
    for nt in rep.node_types:
        if nt.capacity_gpu_hours or nt.leased_gpu_hours:
            n.add_row(cell(nt.node_type), _money(nt.price) if nt.price is not None else "[yellow]unpriced[/yellow]",
                      str(nt.nodes), _hours(nt.capacity_gpu_hours), _hours(nt.leased_gpu_hours),
                      _hours(nt.idle_gpu_hours), _money(nt.leased_cost), _money(nt.idle_cost))
    out.append(n)
    total = f"total: leased {_money(rep.leased_cost)} + idle {_money(rep.idle_cost)}"
    if rep.cpu_node_cost:
        total += f" + CPU nodes {_money(rep.cpu_node_cost)}"
    out.append(markup_safe(total + f" = {_money(rep.total_cost)}"))
    markets = rep.by_market()
    if "spot" in markets:  # a cluster with spot nodes: what each market cost
        out.append(markup_safe("by market: " + "; ".join(
            f"{m} {_money(v['cost'])} ({_hours(v['gpu_hours'])} GPU-h)" for m, v in sorted(markets.items()))))
    if rep.unpriced:
        out.append(f"[yellow]unpriced node types: {markup_safe(', '.join(rep.unpriced))}[/yellow] (their GPU-hours are "
                   f"counted at no cost; give them a price in the policy's prices)")
    if rep.budgets:
        b = Table(title="this month (UTC) against the monthly budget")
        for c in ("TEAM", "SPENT", "BUDGET", "SHARE"):
            b.add_column(c, justify="left" if c == "TEAM" else "right")
        for tb in rep.budgets:
            share = "-" if tb.share is None else f"{tb.share:.0%}"
            if tb.alerting:
                share = f"[red]{share}[/red]"
            b.add_row(cell(tb.team), _money(tb.spent), _money(tb.budget), share)
        out.append(b)
    return out


def cost(
    since: Optional[str] = typer.Option(None, "--since", help="Only spend newer than this (e.g. 1h, 7d); default: "
                                                              "all of the journal."),
    team: Optional[str] = typer.Option(None, "--team", help="Only this team's leases (yours, unless an operator)."),
    by: str = typer.Option("team", "--by", help=BY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the whole report as JSON (every group)."),
):
    """What leased and idle GPUs cost: GPU-hours times the node type's price (the policy's prices), by workload,
    sweep, pipeline, team or class; per node type; and each team's month against its budget."""
    if by not in GROUPS:
        err.print(f"[red]error:[/red] --by: got {markup_safe(repr(by))}; one of {', '.join(GROUPS)}", highlight=False)
        raise typer.Exit(1)
    age = parse_duration(since, "--since")
    with exit_on_error():
        rep = connect().cost(since=time.time() - age if age else None, team=team, by=None if as_json else by)
    if as_json:
        print(json.dumps(rep.to_dict(), indent=2))
        return
    for part in cost_tables(rep, by):
        console.print(part, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)
