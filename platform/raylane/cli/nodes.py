"""``raylane node list | cordon | uncordon | drain``: the cluster's nodes as the control plane keeps them.

``list`` is for anyone; cordon, uncordon and drain are for operators (the control plane refuses and audits anyone
else). A node is named by its Ray node id or a unique prefix of it (6 characters or more), as ``list`` prints it.
States and what moves a node between them: ``raylane.control.nodes``.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List

import typer
from rich.table import Table

from raylane.cli.common import connect, console, err, exit_on_error
from raylane.render import cell, markup_safe

node_app = typer.Typer(help="Nodes: list them; cordon, uncordon and drain them (operators).", no_args_is_help=True)

_STYLE = {"ready": "green", "cordoned": "yellow", "draining": "yellow", "drained": "cyan", "quarantined": "red",
          "lost": "dim"}


def _ago(ts) -> str:
    if not ts:
        return "-"
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def node_table(rows: List[Dict[str, Any]]) -> Table:
    t = Table(title="nodes")
    for c in ("node", "type", "address", "state", "since", "GPUs free/total", "leases", "probe", "reason"):
        t.add_column(c, overflow="fold")
    for r in rows:
        probe = r["probe"]
        ptxt = "-" if probe["ok"] is None else ("ok" if probe["ok"] else f"failed x{probe['consecutive_failures']}")
        leases = ", ".join(f"{l['workload']} ({l['team']}, {l['gpus']:g} GPU)" for l in r["leases"]) or "-"
        state = cell(r["state"])
        if r["state"] in _STYLE:
            state.stylize(_STYLE[r["state"]])
        t.add_row(*(cell(c) for c in (r["id"][:12], r["node_type"] or "-", r["address"] or "-")), state,
                  *(cell(c) for c in (_ago(r["since"]), f"{r['gpus_free']:g}/{r['gpus_total']:g}", leases, ptxt,
                                      r["reason"] or "-")))
    return t


@node_app.command("list")
def node_list(all_: bool = typer.Option(False, "--all", "-a", help="Include lost nodes."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Every node: state (ready, cordoned, draining, drained, quarantined, lost), why, last probe, GPUs, leases."""
    with exit_on_error():
        rows = connect().nodes(include_lost=all_)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    console.print(node_table(rows))


def _show(out: Dict[str, Any]) -> None:
    console.print(cell(f"node {out['id'][:12]}: {out['state']}" + (f" ({out['reason']})" if out["reason"] else "")),
                  highlight=False)


@node_app.command("cordon")
def node_cordon(node: str = typer.Argument(..., help="Node id or a unique prefix (raylane node list)."),
                reason: str = typer.Option("", "--reason", help="Why; shown in node list and the journal.")):
    """No new leases on NODE; what runs there keeps running (operators)."""
    with exit_on_error():
        _show(connect().node_cordon(node, reason))


@node_app.command("uncordon")
def node_uncordon(node: str = typer.Argument(..., help="Node id or a unique prefix."),
                  reason: str = typer.Option("", "--reason", help="Why; shown in the journal.")):
    """Put NODE back in service, from cordoned, draining, drained or quarantined (operators)."""
    with exit_on_error():
        _show(connect().node_uncordon(node, reason))


@node_app.command("drain")
def node_drain(node: str = typer.Argument(..., help="Node id or a unique prefix."),
               reason: str = typer.Option("", "--reason", help="Why; shown in node list and the journal."),
               wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until the node holds no lease."),
               timeout: float = typer.Option(900.0, "--timeout", help="Seconds to wait with --wait.")):
    """Cordon NODE and preempt what runs there gracefully: each gang checkpoints, goes back to the queue and
    resumes elsewhere. With --wait (the default), returns when the node is empty (operators)."""
    with exit_on_error():
        ctl = connect()
        out = ctl.node_drain(node, reason)
        _show(out)
        if not wait:
            return
        deadline = time.time() + timeout
        while True:
            row = next((r for r in ctl.nodes(include_lost=True) if r["id"] == out["id"]), None)
            if row is None or row["state"] in ("drained", "lost"):
                console.print(cell(f"node {out['id'][:12]}: {row['state'] if row else 'gone'}; it holds no lease"),
                              highlight=False)
                return
            if row["state"] in ("ready", "cordoned"):
                err.print(cell(f"node {out['id'][:12]} is {row['state']} again: the drain was cancelled"))
                raise typer.Exit(1)
            if time.time() > deadline:
                left = ", ".join(l["workload"] for l in row["leases"])
                why = f"node {out['id'][:12]} still holds {left} after {timeout:g}s (state {row['state']})"
                err.print(f"[red]error:[/red] {markup_safe(why)}")
                raise typer.Exit(2)
            time.sleep(1.0)


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
