"""Commands for identity and its trail: ``raylane token ...``, ``raylane whoami``, ``raylane audit``,
``raylane policy reload``.

Token management, the audit trail and policy reload are for operators; the control plane refuses them to anyone
else (and audits the refusal). A token is printed once, when it is created or rotated, and never again.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from raylane.cli_cluster import _errors, connect, console, err
from raylane.render import cell, markup_safe

token_app = typer.Typer(help="API tokens: create, list, rotate, revoke (operators); use one (anyone).",
                        no_args_is_help=True)

DURATION_FLAG_ALLOWED = "a positive duration such as 90s, 30m, 12h, 30d, 2w or 1h30m"


def parse_duration(text: Optional[str], field: str) -> Optional[float]:
    """'90s', '30m', '12h', '30d', '2w', '1h30m' -> seconds (the grammar of ``raylane.config.fields``, that of specs
    and policies); None stays None. Anything else, or zero, is an error naming the flag, the value and what is
    allowed."""
    # Imported here: ``raylane token`` and ``raylane audit`` load the config package only when a flag needs it.
    from raylane.config.fields import parse_duration as seconds_of

    if text is None:
        return None
    try:
        value = seconds_of(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        err.print(f"[red]error:[/red] {field}: got {markup_safe(repr(text))}; {DURATION_FLAG_ALLOWED}",
                  highlight=False)
        raise typer.Exit(1)
    return value


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
    with _errors():
        out = connect().token_create(user, team, role, ttl_s=parse_duration(ttl, "--ttl"), note=note)
    console.print(cell(f"token {out['id']} for {out['user']} ({out['role']}; teams {', '.join(out['teams']) or '-'}; "
                       f"expires {_when(out['expires'])}). It is shown once:"), highlight=False)
    print(out["token"])


@token_app.command("list")
def token_list(all_: bool = typer.Option(False, "--all", "-a", help="Include revoked and expired tokens."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Tokens known to the control plane (operators): ids, users, teams, roles, expiry. Never a secret."""
    with _errors():
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
    with _errors():
        out = connect().token_rotate(token_id)
    console.print(cell(f"token {token_id} revoked; its replacement {out['id']} for {out['user']} is shown once:"),
                  highlight=False)
    print(out["token"])


@token_app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="The token's id (from `raylane token list`).")):
    """Revoke a token at once, and every job token made from it (operators)."""
    with _errors():
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

    with _errors():
        tok = connect().job_token(ttl_s=parse_duration(ttl, "--ttl"), note=note or "raylane token for-job")
    if tok is None:
        err.print("authentication is off on this control plane: a job needs no credential")
        raise typer.Exit(1)
    root = credentials.default_file().parent / "job-credentials" / credentials.Credential(tok).token_id
    print(credentials.job_credential_dir(tok, root))


def whoami():
    """Who the control plane takes you for: user, teams, role and token id."""
    with _errors():
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
    with _errors():
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


def policy_reload(path: Path = typer.Argument(..., help="The new policy file.")):
    """Replace the running control plane's policy (operators). Refused, changing nothing, if the file is invalid or
    a queued or running workload would not fit it."""
    from raylane.cli_config import print_error
    from raylane.config.loader import load_policy, read_yaml
    from raylane.errors import FatalError

    try:
        load_policy(path)
        data, _ = read_yaml(path, "policy file")
    except FatalError as exc:
        print_error(exc)
        raise typer.Exit(1)
    with _errors():
        out = connect().reload_policy(data)
    console.print(cell(f"policy reloaded: teams {', '.join(out['teams'])}; classes {', '.join(out['classes'])}"),
                  highlight=False)


def register(app: typer.Typer) -> None:
    """``raylane token ...``, ``whoami``, ``audit``, and the ``raylane policy ...`` group: its ``check`` is
    ``raylane.cli_config``'s (files alone), its ``reload`` this module's (an operator's call to the running control
    plane); this module imports that one, not the reverse."""
    from raylane.cli_config import policy_app

    app.add_typer(token_app, name="token")
    app.command("whoami")(whoami)
    app.command("audit")(audit)
    if not any(c.name == "reload" for c in policy_app.registered_commands):
        policy_app.command("reload")(policy_reload)
    app.add_typer(policy_app, name="policy")
