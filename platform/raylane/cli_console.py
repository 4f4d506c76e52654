"""``raylane console``: serve the read-only web console (``raylane.console``) in the foreground."""
from __future__ import annotations

import re
from typing import Optional

import typer

from raylane.errors import ValidationError


def check_options(port: int, mlflow_url: Optional[str], refresh: float, *, source: str = "raylane console",
                  port_flag: str = "--port") -> None:
    """Every problem with the console's options at once (``ValidationError`` naming option, value, allowed)."""
    errors = []
    if not 1 <= port <= 65535:
        errors.append((port_flag, port, "a TCP port from 1 to 65535"))
    if mlflow_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", mlflow_url):
        errors.append(("--mlflow-url", mlflow_url, "the MLflow UI's http(s) URL, like http://127.0.0.1:5000"))
    if not 0.2 <= refresh <= 60:
        errors.append(("--refresh", refresh, "seconds from 0.2 to 60"))
    if errors:
        raise ValidationError(source, errors)


def default_mlflow_url() -> Optional[str]:
    """The MLflow server runs are tracked on, when it is one (an http(s) tracking URI): its UI is on the same URL."""
    from raylane.locations import _env_uri

    uri = _env_uri() or ""
    return uri.rstrip("/") if re.match(r"https?://", uri) else None


def console(
    port: int = typer.Option(8780, help="Port on 127.0.0.1 (the console listens on loopback only)."),
    mlflow_url: Optional[str] = typer.Option(None, "--mlflow-url", help="The MLflow UI that workload pages link "
                                             "runs to (default: the tracking URI when it is an http(s) server)."),
    refresh: float = typer.Option(1.0, help="Seconds between two updates of a live page."),
):
    """Serve the read-only web console on http://127.0.0.1:PORT: the queue, teams, nodes, workloads and cost, live.

    With authentication on, each user logs in with their own token (`raylane token create`); every page is read
    with that token, so a user sees what `raylane queue` and `raylane explain` show them. Stop it with Ctrl-C."""
    from raylane.cli_cluster import _errors
    from raylane.console.server import serve

    with _errors():
        check_options(port, mlflow_url, refresh)
        serve(port, mlflow_url or default_mlflow_url(), refresh)


def main() -> None:
    typer.run(console)


def register(app: typer.Typer) -> None:
    app.command("console")(console)
