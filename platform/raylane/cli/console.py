"""``raylane console``: serve the read-only web console (``raylane.console``) in the foreground."""
from __future__ import annotations

from typing import Optional

import typer

from raylane.console.server import check_options, default_mlflow_url


def console(
    port: int = typer.Option(8780, help="Port on 127.0.0.1 (the console listens on loopback only)."),
    mlflow_url: Optional[str] = typer.Option(None, "--mlflow-url", help="The MLflow UI that workload pages link "
                                             "runs to (default: the tracking URI when it is an http(s) server)."),
    refresh: float = typer.Option(1.0, help="Seconds between two updates of a live page."),
):
    """Serve the read-only web console on http://127.0.0.1:PORT: the queue, teams, nodes, workloads and cost, live.

    With authentication on, each user logs in with their own token (`raylane token create`); every page is read
    with that token, so a user sees what `raylane queue` and `raylane explain` show them. Stop it with Ctrl-C."""
    from raylane.cli.common import exit_on_error
    from raylane.console.server import serve

    with exit_on_error():
        check_options(port, mlflow_url, refresh)
        serve(port, mlflow_url or default_mlflow_url(), refresh)


def main() -> None:
    typer.run(console)


def register(app: typer.Typer) -> None:
    app.command("console")(console)
