"""The ``raylane`` command line: one typer ``app`` that command groups register onto.

This module owns only the top-level app. Each group of commands lives in its own ``raylane/cli_*.py`` module as a
``typer.Typer`` (or plain functions) and is attached below with one line; add yours the same way rather than
editing another group's module. Errors for users go to stderr; exit status 1 means "your input is wrong".
"""
from __future__ import annotations

import typer

from raylane import cli_auth, cli_cluster, cli_config, cli_nodes

app = typer.Typer(
    name="raylane",
    help="Raylane: queues, team quotas, gang admission and preemption inside one Ray cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Command groups, one line each.
app.add_typer(cli_config.policy_app, name="policy")
app.add_typer(cli_config.spec_app, name="spec")
cli_cluster.register(app)
cli_auth.register(app, cli_config.policy_app)
cli_nodes.register(app)
from raylane.sim.cli import register as _register_sim; _register_sim(app)  # noqa: E402,E702
from raylane.cli_plan import register as _register_plan; _register_plan(app)  # noqa: E402,E702
from raylane.cli_console import register as _register_console; _register_console(app)  # noqa: E402,E702
from raylane.cli_cost import register as _register_cost; _register_cost(app)  # noqa: E402,E702


if __name__ == "__main__":  # pragma: no cover
    app()
