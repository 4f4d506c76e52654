"""``raylane policy check`` and ``raylane policy reload``: a cluster policy file checked alone, or put in force.

This module owns the ``policy`` command group. ``check`` reads files only (every error of each file, through
``raylane.config.loader``; with ``--cluster``, the node types its per-flavor quotas name); ``reload`` is an
operator's call to the running control plane, which refuses it, changing nothing, if the file is invalid or a queued
or running workload would not fit it. A file's errors are shown by ``raylane.cli.common.print_error``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from raylane.cli.common import connect, console, exit_on_error, print_error
from raylane.config.loader import load_policy
from raylane.config.models import ClusterPolicy
from raylane.errors import FatalError, ValidationError
from raylane.render import cell

policy_app = typer.Typer(help="Check cluster policy files (policies/*.yaml).", no_args_is_help=True)

# Resolved at print time, so tests that swap sys.stdout see the output.
_out = Console(highlight=False, soft_wrap=True)


def _n(items, one: str, many: str = "") -> str:
    return f"{len(items)} {one if len(items) == 1 else (many or one + 's')}"


def policy_summary(path: Path, p: ClusterPolicy) -> str:
    s = p.scheduler
    return (
        f"OK {path}: {_n(p.classes, 'class', 'classes')}, {_n(p.teams, 'team')} ({', '.join(p.teams)}),"
        f" {_n(p.node_features, 'node feature')}, {_n(p.prices, 'price')};"
        f" ordering={s.ordering} backfill={s.backfill} preemption={s.preemption} admission={s.admission}"
    )


@policy_app.command("check")
def policy_check(
    files: List[Path] = typer.Argument(..., help="Policy YAML files.", show_default=False),
    cluster: Optional[Path] = typer.Option(
        None, "--cluster", help="Also check the policy against this cluster file (deploy/clusters/*.yaml): the "
        "node types that per-flavor quotas (teams.NAME.flavors) name."),
) -> None:
    """Validate policy files; print every error of each file, exit 1 if any file is invalid."""
    failed = False
    node_types = None
    if cluster is not None:
        from raylane.config.cluster import load_cluster

        try:
            node_types = {g.node_type for g in load_cluster(cluster).nodes}
        except FatalError as exc:
            print_error(exc)
            raise typer.Exit(1)
    for f in files:
        try:
            policy = load_policy(f)
            if node_types is not None:
                _check_flavors(f, policy, node_types, cluster)
        except FatalError as exc:
            print_error(exc)
            failed = True
        else:
            _out.print(policy_summary(f, policy), markup=False)
    raise typer.Exit(1 if failed else 0)


def _check_flavors(path: Path, policy, node_types, cluster: Path) -> None:
    """``ValidationError`` naming each flavor quota of ``policy`` whose node type no group of the cluster has."""
    from raylane.scheduling.flavors import flavor_errors

    bad = flavor_errors(policy.core_teams(), node_types)
    if bad:
        raise ValidationError(f"{path} (against {cluster})", [
            (f"teams.{team}.flavors.{t}", t, allowed) for team, t, allowed in bad])


@policy_app.command("reload")
def policy_reload(path: Path = typer.Argument(..., help="The new policy file.")):
    """Replace the running control plane's policy (operators). Refused, changing nothing, if the file is invalid or
    a queued or running workload would not fit it."""
    from raylane.config.loader import read_yaml

    try:
        load_policy(path)
        data, _ = read_yaml(path, "policy file")
    except FatalError as exc:
        print_error(exc)
        raise typer.Exit(1)
    with exit_on_error():
        out = connect().reload_policy(data)
    console.print(cell(f"policy reloaded: teams {', '.join(out['teams'])}; classes {', '.join(out['classes'])}"),
                  highlight=False)


def register(app: typer.Typer) -> None:
    """``raylane policy ...``."""
    app.add_typer(policy_app, name="policy")


__all__ = ["register", "policy_app", "policy_check", "policy_reload", "policy_summary"]
