"""Commands for identity and its trail: ``raylane token ...``, ``raylane whoami``, ``raylane audit``.

Token management and the audit trail are for operators; the control plane refuses them to anyone else (and audits
the refusal). A token is printed once, when it is created or rotated, and never again. (``raylane policy reload``,
an operator's call too, is ``raylane.cli.policy``'s.)
"""
from __future__ import annotations

import json
import time
from typing import List, Optional

import typer
from rich.table import Table

from raylane.cli.common import connect, console, err, exit_on_error, parse_duration
from raylane.render import cell, markup_safe

token_app = typer.Typer(help="API tokens: create, list, rotate, revoke (operators); use one (anyone).",
                        no_args_is_help=True)


def _when(ts: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


@token_app.command("create")
def token_create(
    user: str = typer.Option(..., "--user", help="Who holds the token."),
    team: List[str] = typer.Option([], "--team", help="A team the user acts for (repeat for several)."),
    role: str = typer.Option("member", "--role", help="member, team-admin or operator."),
    ttl: Optional[str] = typer.Option(None, "--ttl", help="Expires after this long (e.g. 30d); default never."),
    note: str = typer.Option("", "--note", help="What the token is for."),
):
    """Create a token (operators). It is printed once: hand it to its user, who runs `raylane token use`."""
    with exit_on_error():
        out = connect().token_create(user, team, role, ttl_s=parse_duration(ttl, "--ttl"), note=note)
    console.print(cell(f"token {out['id']} for {out['user']} ({out['role']}; teams {', '.join(out['teams']) or '-'}; "
                       f"expires {_when(out['expires'])}). It is shown once:"), highlight=False)
    print(out["token"])


@token_app.command("list")
def token_list(all_: bool = typer.Option(False, "--all", "-a", help="Include revoked and expired tokens."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Tokens known to the control plane (operators): ids, users, teams, roles, expiry. Never a secret."""
    with exit_on_error():
        rows = connect().token_list(all_)
    if as_json:
        console.print_json(json.dumps(rows), ensure_ascii=True)
        return
    console.print(token_table(rows))


def token_table(rows) -> Table:
    """``raylane token list``'s table; every cell a ``cell`` (a note is whatever its creator typed)."""
    t = Table(title="raylane tokens")
    for col in ("ID", "USER", "TEAMS", "ROLE", "STATUS", "CREATED", "EXPIRES", "BY", "NOTE"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(*(cell(c) for c in (
            r["id"], r["user"], ", ".join(r["teams"]) or "-", r["role"], r["status"], _when(r["created"]),
            _when(r["expires"]), r["created_by"], r["note"] or ("job token of " + r["parent"]
                                                                if r.get("parent") else ""))))
    return t


@token_app.command("rotate")
def token_rotate(token_id: str = typer.Argument(..., help="The token's id (from `raylane token list`).")):
    """Replace a token with a new one of the same user, teams and role; the old one stops working (operators)."""
    with exit_on_error():
        out = connect().token_rotate(token_id)
    console.print(cell(f"token {token_id} revoked; its replacement {out['id']} for {out['user']} is shown once:"),
                  highlight=False)
    print(out["token"])


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="The token's id (from `raylane token list`).")):
    """Revoke a token at once, and every job token made from it (operators)."""
    with exit_on_error():
        out = connect().token_revoke(token_id)
    console.print(cell(f"token {out['id']} of {out['user']}: {out['status']}"), highlight=False)


@token_app.command("use")
def token_use(token: Optional[str] = typer.Argument(None, help="The token (read from standard input if left "
                                                               "out, so it stays out of the shell history).")):
    """Keep a token in ~/.raylane/credentials (mode 0600), where the CLI finds it."""
    from raylane import auth, credentials
    from raylane.errors import AuthenticationError

    token = (token if token is not None else typer.get_text_stream("stdin").read()).strip()
    try:
        auth.parse_token(token)
    except AuthenticationError as exc:
        err.print(f"[red]error:[/red] {markup_safe(exc, newlines=True)}", highlight=False)
        raise typer.Exit(1)
    path = credentials.save(token)
    console.print(f"token {credentials.Credential(token).token_id} saved to {path} (mode 0600)", highlight=False)


@token_app.command("for-job")
def token_for_job(ttl: str = typer.Option("7d", "--ttl", help="How long the job token lives (at most 7d)."),
                  note: str = typer.Option("", "--note", help="What the job is.")):
    """Make a job token (your rights, expiring, revoked with your token) for a plain `ray job submit`, and print the
    folder to pass as a py_modules entry; its driver finds the token there. The token is good for one job: its
    driver's first submit binds it to that workload, which alone it may then act on, and it expires a minute after
    that workload ends:

    ray job submit --runtime-env-json "{\"py_modules\": [\"$(raylane token for-job)\"]}" ... -- python -m raylane.run spec.yaml"""
    from raylane import credentials

    with exit_on_error():
        tok = connect().job_token(ttl_s=parse_duration(ttl, "--ttl"), note=note or "raylane token for-job")
    if tok is None:
        err.print("authentication is off on this control plane: a job needs no credential")
        raise typer.Exit(1)
    root = credentials.default_file().parent / "job-credentials" / credentials.Credential(tok).token_id
    print(credentials.job_credential_dir(tok, root))


def whoami():
    """Who the control plane takes you for: user, teams, role and token id."""
    with exit_on_error():
        out = connect().whoami()
    if not out.get("auth"):
        console.print("authentication is off on this control plane: every caller acts as an operator")
        return
    console.print(cell(f"{out['user']} ({out['role']}; teams {', '.join(out['teams']) or '-'}; token "
                       f"{out['token_id']}{', a job token' if out.get('job') else ''})"), highlight=False)


def audit(
    since: Optional[str] = typer.Option(None, "--since", help="Only entries newer than this (e.g. 1h, 2d)."),
    user: Optional[str] = typer.Option(None, "--user", help="Only this user's calls."),
    team: Optional[str] = typer.Option(None, "--team", help="Only calls by the team's members or on its workloads."),
    limit: int = typer.Option(1000, "--limit", help="At most this many (the newest)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The audit trail (operators): every privileged call and every refusal, with who, what, on what and why."""
    age = parse_duration(since, "--since")
    with exit_on_error():
        rows = connect().audit(since=time.time() - age if age else None, user=user, team=team, limit=limit)
    if as_json:
        console.print_json(json.dumps(rows), ensure_ascii=True)
        return
    console.print(audit_table(rows))


def audit_table(rows) -> Table:
    """``raylane audit``'s table. Every cell is a ``cell``: a refused call's target and reason hold what its
    caller sent, authenticated or not (an ``explain`` of a made-up id)."""
    t = Table(title="raylane audit")
    for col in ("TIME", "USER", "ROLE", "TOKEN", "ACTION", "TARGET", "OUTCOME", "COUNT", "REASON"):
        t.add_column(col, overflow="fold", justify="right" if col == "COUNT" else "left")
    for r in rows:  # COUNT: identical refusals that share the row (raylane.control.gate.Refusals)
        count = r.get("count", 1)
        t.add_row(*(cell(c) for c in (
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["ts"])), r.get("user") or "-",
            r.get("role") or "-", r.get("token_id") or "-", r["action"], r.get("target") or "-",
            r["outcome"], str(count) if isinstance(count, int) else "?", r.get("reason") or "")))
    return t


def register(app: typer.Typer) -> None:
    """``raylane token ...``, ``whoami`` and ``audit``."""
    app.add_typer(token_app, name="token")
    app.command("whoami")(whoami)
    app.command("audit")(audit)
