"""Commands that act on a running cluster: up, down, submit, queue, explain, cancel, and how each prints its reply.

They connect to Ray (the local cluster from ``raylane up``, or ``RAY_ADDRESS``) and call the control actor through
``raylane.control.client`` (``raylane.cli.common.connect``). Errors for users are printed without tracebacks
(``raylane.cli.common.exit_on_error``); exit status 1 means the input was wrong or refused, 2 that the control
plane could not be reached. Every value a reply carries (ids, reasons, details, journal notes: other users' input
among them) is printed through ``raylane.render``'s ``cell``, ``visible`` or ``markup_safe``; JSON output is the
data as it is, with every non-ASCII character escaped.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import typer
from rich.table import Table

from raylane.cli.common import connect, console, err, exit_on_error, print_error
from raylane.errors import FatalError, RetryableError, ValidationError
from raylane.ids import new_id
from raylane.render import cell, journal_lines, markup_safe, visible

# Kinds whose driver drives one workload that `submit` can queue before the job starts (``raylane.run
# --workload-id``); a sweep's or a service's driver registers what it runs itself, once started.
QUEUED_BY_SUBMIT = ("train", "eval", "batch")


def up(
    cluster: Optional[Path] = typer.Option(None, "--cluster", "-c", help="Cluster file (default: embedded)."),
    policy: Optional[Path] = typer.Option(None, "--policy", "-p", help="Policy file (default: policies/local.yaml)."),
    journal: Optional[str] = typer.Option(None, help="Journal path (default: ~/.raylane/journal.db)."),
    fresh: bool = typer.Option(False, help="Start with an empty journal."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Run the control plane without authentication "
                                 "(every caller is an operator; for a single-user laptop only)."),
    no_console: bool = typer.Option(False, "--no-console", help="Do not start the web console."),
    console_port: int = typer.Option(8780, "--console-port", help="The web console's port on 127.0.0.1."),
    mlflow_url: Optional[str] = typer.Option(None, "--mlflow-url", help="The MLflow UI the console links runs to "
                                             "(default: the tracking URI when it is an http(s) server)."),
):
    """Start a local Ray cluster with logical GPUs and feature-tagged nodes, the control actor and the web console.

    With authentication on (the default) an operator token is created and written to ~/.raylane/credentials (mode
    0600): this user is the cluster's operator and creates the other users' tokens with `raylane token create`.
    The web console (`raylane console`) runs in the background on http://127.0.0.1:8780 until `raylane down`."""
    from raylane import localcluster
    from raylane.config.cluster import load_cluster
    from raylane.config.loader import _REPO_ROOT, default_policy_path, load_policy
    from raylane.control.client import journal_path, start_control

    with exit_on_error():
        if not no_console:
            from raylane.console.server import check_options

            check_options(console_port, mlflow_url, 1.0, source="raylane up", port_flag="--console-port")
        spec = load_cluster(cluster)
        local = _REPO_ROOT / "policies" / "local.yaml"
        pol_path = policy or (local if local.is_file() else default_policy_path())
        load_policy(pol_path)  # refuse a bad policy before starting anything
        jpath = journal_path(journal)
        if fresh and os.path.exists(jpath):
            os.remove(jpath)
        t0 = time.time()
        st = localcluster.up(spec)
        localcluster.use_client_env()  # its Ray token, before this process first talks to it
        import ray

        ray.init(address=st["address"], namespace="raylane", logging_level="ERROR", log_to_driver=False)
        ops = start_control(pol_path, jpath, auth_enabled=not no_auth, operator=_os_user())
        if ops.credential is not None:
            from raylane import credentials

            where = credentials.save(ops.credential.token)
        from ray.job_submission import JobSubmissionClient

        from raylane.jobs import wait_ready

        wait_ready(JobSubmissionClient(st["dashboard"], headers=localcluster.auth_headers()))  # `ray job submit` works from here on
        console.print(f"Ray cluster [bold]{markup_safe(spec.name)}[/bold] up in {time.time() - t0:.1f}s: "
                      f"{1 + sum(g.count for g in spec.nodes)} nodes, {spec.total_gpus} GPUs; "
                      f"dashboard {st['dashboard']}; control actor ready (journal {jpath})")
        if no_auth:
            console.print("[yellow]authentication off:[/yellow] every caller acts as an operator")
        elif ops.credential is not None:
            console.print(f"operator token {ops.credential.token_id} written to {where} (mode 0600); create "
                          f"users' tokens with `raylane token create --user NAME --team TEAM`")
        if not no_console:
            _start_console(st, console_port, mlflow_url)
        from raylane.codecheck import checker_enabled, start_checker

        if checker_enabled():  # the first `raylane submit` is then warm too (raylane.codecheck)
            start_checker()


def _start_console(st, port: int, mlflow_url: Optional[str]) -> None:
    """The web console in the background, stopped by `raylane down` with the cluster (it carries its marker). A
    console that does not start is reported; the cluster stays up."""
    from raylane.console.server import LOG_FILE, default_mlflow_url, start_background

    try:
        url = start_background(st, port, mlflow_url or default_mlflow_url())
    except RetryableError as exc:
        err.print(f"[yellow]web console not started[/yellow] (start it with `raylane console --port PORT`): "
                  f"{markup_safe(exc, newlines=True)}",
                  highlight=False)
        return
    console.print(f"web console {url} (log in with a Raylane token; log {LOG_FILE})")


def down():
    """Stop the local Ray cluster (and with it the control actor and the web console)."""
    from raylane import localcluster
    from raylane.codecheck import stop_checker

    localcluster.down()
    stop_checker()  # the warm code checker `raylane submit` started (raylane.codecheck)
    console.print("local Ray cluster stopped")


def submit(
    spec_arg: Optional[str] = typer.Argument(None, metavar="SPEC", help="Workload spec (YAML); not with --script."),
    script_args: Optional[List[str]] = typer.Argument(None, metavar="[-- ARGS]", show_default=False,
                                                      help="With --script: the script's own arguments, after --."),
    wait: bool = typer.Option(False, help="Wait until admitted."),
    reserve_only: bool = typer.Option(False, "--reserve-only",
                                      help="Only reserve the gang's resources (no Ray job, no driver)."),
    python: str = typer.Option(sys.executable, help="Python on the cluster that has raylane installed."),
    no_code: bool = typer.Option(False, "--no-code", help="Do not import the spec's user code before submitting "
                                 "(check only the form of entrypoint and command; the driver still checks it)."),
    working_dir: Path = typer.Option(
        Path("."), "--working-dir", exists=True, file_okay=False,
        help="The project's folder: the spec's code is checked from it and it is uploaded as the job's working "
             "directory, as `ray job submit --working-dir` does (files its .gitignore names are left out)."),
    script: Optional[Path] = typer.Option(None, "--script", help="Run this Ray Train script unchanged (script "
                                          "mode): each trainer.fit() in it is queued as a workload of --team and "
                                          "--class. A file in --working-dir; its arguments follow `--`."),
    team: Optional[str] = typer.Option(None, "--team", help="With --script: the team its workloads queue under."),
    class_name: Optional[str] = typer.Option(None, "--class", help="With --script: the class of its workloads."),
    name: Optional[str] = typer.Option(None, "--name", help="With --script: the workloads' name (default: the "
                                       "trainer's RunConfig name, else the script's stem)."),
):
    """Submit a workload: a Ray job running `python -m raylane.run` (as `ray job submit` would), or a bare
    reservation with --reserve-only. Prints the workload id, its state and queue position.

    Before anything is submitted the spec gets every check `raylane spec check` runs (its user code imported from
    --working-dir, unless --no-code or --reserve-only); a spec that fails them is not submitted. The code is
    checked by a warm checker process that keeps the libraries it imports (torch, Ray Train) loaded between
    submissions (raylane.codecheck; RAYLANE_CODECHECK_SERVER=0 turns it off)."""
    from raylane.config.loader import read_yaml
    from raylane.launchers.check import check_spec_dict

    if script is not None:  # script mode: the script's arguments are every positional after `--`
        args = ([spec_arg] if spec_arg is not None else []) + list(script_args or [])
        _submit_script(script, args, team=team, class_name=class_name, name=name, working_dir=working_dir,
                       python=python, reserve_only=reserve_only)
        return
    if spec_arg is None or script_args or team or class_name or name:
        err.print("[red]error:[/red] give a spec file, or --script with --team and --class (and the script's "
                  "arguments after --)", highlight=False)
        raise typer.Exit(1)
    spec = Path(spec_arg)
    code_check = None
    wd = str(working_dir)
    try:  # the cluster's policy is checked by the control plane; everything else here, before submitting
        data, dups = read_yaml(spec, "spec file")
        pipeline = isinstance(data, dict) and data.get("kind") == "pipeline"
        if pipeline:  # raylane.pipelines: every stage checked; one driver job runs them all
            from raylane.launchers.train import DEFAULT_STORAGE
            from raylane.pipelines.driver import check

            if reserve_only:
                raise ValidationError(str(spec), [("--reserve-only", True, "not for kind: pipeline (its stages run "
                                                                           "in one driver job)")])
            check(data, storage_path=DEFAULT_STORAGE, working_dir=wd, load_code=not no_code)
        else:
            # The form now; the user's code in a child process while this one connects (raylane.codecheck).
            check_spec_dict(data, str(spec), working_dir=wd, load_code=False, _extra=dups)
            if not (no_code or reserve_only):
                from raylane.codecheck import CodeCheck

                code_check = CodeCheck(data, str(spec), working_dir=wd, extra=dups)
    except FatalError as exc:
        print_error(exc)
        raise typer.Exit(1)

    def code_checked() -> None:
        """Nothing is submitted before the code passed; its errors are shown as ``spec check`` shows them."""
        nonlocal code_check
        if code_check is None:
            return
        check, code_check = code_check, None
        try:
            check.result()
        except FatalError as exc:
            print_error(exc)
            raise typer.Exit(1)

    with exit_on_error():
        try:
            h = connect()
        except BaseException:
            code_checked()  # a spec that fails its checks says so, even when the cluster cannot be reached
            raise
        code_checked()
        if reserve_only:
            rec = h.submit(data)
        else:
            from ray.job_submission import JobSubmissionClient

            from raylane import localcluster
            from raylane.jobs import submit_job, with_credential

            client = JobSubmissionClient(localcluster.dashboard(), headers=localcluster.auth_headers())
            # The driver gets a token of its own (the caller's rights, expiring, revoked with the caller's and once
            # its workload ends), sent as a py_modules package: never on the command line, in the env or in the
            # job's info.
            job_token = h.job_token(note=f"ray job for {data.get('name', '?')}") if h.credential else None
            # Neither is the spec on the command line (`ray job list` shows every job's entrypoint to everyone):
            # the driver reads it by reference, from the control plane (a queued kind) or from the job's package.
            entrypoint = f"{python} -m raylane.run"
            # A one-lease kind is queued here, under the job id it is about to get, and its driver adopts it: the
            # workload is in the queue when this command returns, not once the driver has started (Python, the
            # user's code and Ray imported again on the cluster: most of the 24 s this command used to take). It is
            # queued with the job token: that is the token's one submit, which binds it to this workload alone
            # (raylane.control.gate, job scopes), before the token leaves this machine.
            queued, submission_id = None, None
            if data.get("kind", "train") in QUEUED_BY_SUBMIT:
                submission_id = f"raylane-{new_id(data.get('name', 'job'), kind='job')}"
                queued = (h.as_user(job_token) if job_token else h).submit(data, job_id=submission_id)
                entrypoint += f" --workload-id {shlex.quote(queued.id)}"
            try:
                job_id = submit_job(
                    client,
                    entrypoint=entrypoint,
                    submission_id=submission_id,
                    # `ray job stop` sends SIGTERM; the driver then cancels its workload, drains and releases its
                    # leases, which takes longer than Ray's default 3 s before SIGKILL.
                    runtime_env=with_credential({"working_dir": wd, "env_vars": {
                        "RAY_JOB_STOP_WAIT_TIME_S": "60",
                        **{k: v for k, v in os.environ.items() if k in ("RAYLANE_MLFLOW_URI", "MLFLOW_TRACKING_URI")}}},
                        job_token, spec=data if queued is None else None),
                    metadata={"raylane.spec": data.get("name", "")},
                )
            except BaseException:
                if queued is not None:  # no driver will ever run it
                    h.cancel(queued.id)
                raise
            console.print(cell(f"ray job {job_id} submitted"))
            rec = queued if queued is not None else _workload_of_job(h, client, job_id)
            if rec.get("kind") == "pipeline":
                console.print(cell(f"pipeline {rec['id']}: {rec['state']}, {len(rec.get('stages') or [])} stages; "
                                   f"`raylane queue` lists them"), highlight=False)
                return
        if wait:
            from raylane.control.client import State

            while rec.state is State.PENDING:
                rec = h.wait_admission(rec.id, 5.0)
        pos = f" at position {rec['position']}" if rec.get("position") else ""
        reason = f": {rec['reason']}" if rec.get("reason") else ""
        console.print(cell(f"{rec['id']}: {rec['state']}{pos}{reason}"), highlight=False)


def script_entrypoint(python: str, script: str, args: List[str], *, team: str, class_name: str,
                      name: Optional[str] = None) -> str:
    """The job's command line for a script (``python -m raylane.run --team T --class C SCRIPT ARGS``), quoted."""
    named = ["--name", name] if name else []
    return " ".join(shlex.quote(a) for a in [python, "-m", "raylane.run", "--team", team, "--class", class_name,
                                             *named, script, *args])


def _submit_script(script: Path, args: List[str], *, team: Optional[str], class_name: Optional[str],
                   name: Optional[str], working_dir: Path, python: str, reserve_only: bool) -> None:
    """``raylane submit --script``: a Ray job running the script in script mode (``raylane.script``) from the
    uploaded working directory, with a job token of its own as every job gets. Its workloads are queued by its
    driver, one per ``fit()``, so nothing is queued here."""
    missing = [(f, v, why) for f, v, why in (
        ("--team", team, "the team the script's workloads queue under"),
        ("--class", class_name, "the class of the script's workloads"),
    ) if not v]
    if reserve_only:
        missing.append(("--reserve-only", True, "not with --script (the script's driver queues its own workloads)"))
    wd = working_dir.resolve()
    path = script if script.is_absolute() else (wd / script)
    path = path.resolve()
    if not path.is_file() or wd not in path.parents:
        missing.append(("--script", str(script), f"a Python file in --working-dir {working_dir} (it is uploaded "
                                                 "with it)"))
    with exit_on_error():
        if missing:
            raise ValidationError("raylane submit", missing)
        rel = path.relative_to(wd).as_posix()
        from ray.job_submission import JobSubmissionClient

        from raylane import localcluster
        from raylane.jobs import submit_job, with_credential

        h = connect()
        h.class_info(class_name)  # an unknown class is named here, before a job starts
        client = JobSubmissionClient(localcluster.dashboard(), headers=localcluster.auth_headers())
        job_token = h.job_token(note=f"ray job for script {rel}", script=True) if h.credential else None
        job_id = submit_job(
            client,
            entrypoint=script_entrypoint(python, rel, args, team=team, class_name=class_name, name=name),
            runtime_env=with_credential({"working_dir": str(working_dir), "env_vars": {
                "RAY_JOB_STOP_WAIT_TIME_S": "60",
                **{k: v for k, v in os.environ.items() if k in ("RAYLANE_MLFLOW_URI", "MLFLOW_TRACKING_URI")}}},
                job_token),
            metadata={"raylane.script": rel},
        )
        console.print(cell(f"ray job {job_id} submitted: {rel} in script mode; each trainer.fit() in it queues as a "
                           f"workload of team {team}, class {class_name} (`raylane queue` lists them)"),
                      highlight=False)


def _workload_of_job(h, client, job_id, timeout: float = 120.0):
    """The workload the job's driver registered; its logs are shown if the driver fails first."""

    deadline = time.time() + timeout
    while time.time() < deadline:
        rec = h.find_job(job_id)
        if rec is not None:
            return rec
        status = str(client.get_job_status(job_id))
        if status.endswith(("FAILED", "STOPPED")):
            raise FatalError(f"ray job {job_id} ended ({status}) before registering:\n"
                             + client.get_job_logs(job_id)[-3000:])
        time.sleep(0.5)
    raise RetryableError(f"ray job {job_id} has not registered a workload after {timeout:g}s")


def queue(
    all_: bool = typer.Option(False, "--all", "-a", help="Include finished, cancelled and rejected workloads."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
):
    """The queue: id, team, class, state, resources, waited, position, reason."""

    with exit_on_error():
        h = connect()
        rows = h.queue(all_)
        info = {} if as_json else h.info()
        cohorts = [] if as_json else _cohorts_or_none(h)
    if as_json:
        if len(rows) > QUEUE_TABLE_ROWS:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        else:
            console.print_json(json.dumps(rows), ensure_ascii=True)
        return
    if len(rows) > QUEUE_TABLE_ROWS:
        sys.stdout.write(queue_text(rows) + "\n")
        sys.stdout.flush()
    else:
        console.print(queue_table(rows))
    footer = stranded_footer(info)
    if footer:
        console.print(cell(footer), highlight=False)
    if cohorts:
        console.print(cell(cohorts_footer(cohorts)), highlight=False)


def _cohorts_or_none(h) -> list:
    """The quota tree's cohorts, or none from a control plane that predates the call."""
    try:
        return h.cohorts()
    except ValidationError:  # an unknown call: an older control plane
        return []


def cohorts_footer(cohorts) -> str:
    """The queue's footer line for a quota tree (``cohorts`` reply, top-down): each cohort's GPUs held of its
    subtree's nominal quota, what it borrows from outside it, and what of its idle quota it may lend."""
    parts = [f"{c['cohort']} {c['used']['gpu']:g}/{c['nominal']['gpu']:g}"
             + (f" (+{c['borrowed']['gpu']:g} borrowed)" if c["borrowed"]["gpu"] else "")
             + (f" (lends {c['lendable']['gpu']:g})" if c["lendable"]["gpu"] else "") for c in cohorts]
    return "cohorts, GPUs held/nominal: " + " · ".join(parts)


def stranded_footer(info) -> str:
    """The queue's footer line from the ``info`` reply: free GPUs that no waiting gang can use (fragmentation)."""
    stranded, free = info.get("stranded_gpus"), info.get("free_gpus") or {}
    if stranded is None:
        return ""  # a control actor from before the figure existed
    total = sum(stranded.values())
    parts = ", ".join(f"{t}: {v:g}" for t, v in sorted(stranded.items()) if v > 0)
    return (f"stranded GPUs: {total:g} of {sum(free.values()):g} free" + (f" ({parts})" if parts else "")
            + " — free but unusable by any waiting gang")


QUEUE_COLUMNS = ("ID", "TEAM", "CLASS", "STATE", "RESOURCES", "WAITED", "POS", "ETA", "REASON")
# Up to this many rows `raylane queue` draws a table; past it, plain aligned columns (drawing a table measures and
# wraps every cell: 7 s for 10,000 rows here, against 0.03 s for the columns).
QUEUE_TABLE_ROWS = 500


def queue_cells(rows) -> List[Tuple[str, ...]]:
    """One tuple of ``QUEUE_COLUMNS`` cells per row; a pipeline's stages under it, each marked with its stage name
    (raylane.pipelines). Each cell is ``visible``: no control character of a member's detail or note reaches the
    terminal of whoever lists the queue."""
    stages: Dict[str, list] = {}
    for r in rows:
        if r.get("pipeline"):
            stages.setdefault(r["pipeline"], []).append(r)
    pipelines = {r["id"] for r in rows if r.get("kind") == "pipeline"}

    now = time.time()

    def cells(r, name: str) -> Tuple[str, ...]:
        return tuple(visible(c) for c in (
            name, r["team"], r["class"], r["state"], r["resources"], f"{r['waited_s']:.0f}s",
            str(r["position"] or "-"), eta_cell(r.get("eta_start"), now, r.get("eta_start_low"),
                                                r.get("eta_start_high", r.get("eta_start"))),
            "; ".join(str(x) for x in (r["reason"], r.get("detail")) if x)))

    out = []
    for r in rows:
        if r.get("pipeline") in pipelines:
            continue
        out.append(cells(r, r["id"]))
        for s in stages.get(r["id"], []) if r.get("kind") == "pipeline" else []:
            out.append(cells(s, f" └ {s['stage']} ({s['id']})"))
    return out


def eta_cell(start: Optional[float], now: float, low: Optional[float] = None,
             high: Optional[float] = None) -> str:
    """A pending workload's estimated start (raylane.forecast) as the queue shows it: ``-`` when none was
    forecast, ``now``, else in how long (``~12m``, ``~1.5h``, ``~2.0d``), with the interval where runtimes are
    learned (``~40m (20m-1.5h)``; ``?`` for a high end past the forecast's horizon)."""
    if start is None:
        return "-"
    text = "now" if start - now < 60 else "~" + _span(start - now)
    if low is not None:
        lo, hi = _span(low - now), "?" if high is None else _span(high - now)
        if lo != hi:
            text += f" ({lo}-{hi})"
    return text


def _span(s: float) -> str:
    if s < 60:
        return "now"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def end_text(out, now: Optional[float] = None) -> str:
    """A running workload's expected end, as ``explain`` says it: "expected to end in ~40m (20m-1.5h); its runtime:
    14 runs of alice/pretrain-x: median 2.1h"."""
    now = time.time() if now is None else now
    text = "expected to end in " + eta_cell(out["predicted_end"], now, out.get("predicted_end_low"),
                                             out.get("predicted_end_high", out["predicted_end"]))
    if out.get("predicted_basis"):
        text += f"; its runtime: {out['predicted_basis']}"
    return text


def queue_table(rows) -> Table:
    t = Table(title="raylane queue", show_lines=False)
    for col in QUEUE_COLUMNS:
        t.add_column(col, overflow="fold")
    for c in queue_cells(rows):
        t.add_row(*(cell(x) for x in c))  # Text: a cell's "[/x]" is shown, not parsed as markup
    return t


def queue_text(rows) -> str:
    """The queue as plain aligned columns (the reason last, never cut), as ``squeue`` and ``kubectl get`` print."""
    cells = [QUEUE_COLUMNS] + queue_cells(rows)
    widths = [max(len(c[i]) for c in cells) for i in range(len(QUEUE_COLUMNS) - 1)]
    return "\n".join("  ".join([*(c[i].ljust(widths[i]) for i in range(len(widths))), c[-1]]).rstrip()
                     for c in cells)


def explain(workload_id: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")):
    """Why a workload is where it is: state, reason with numbers, team quota, and its journal."""

    with exit_on_error():
        out = connect().explain(workload_id)
    if as_json:
        console.print_json(json.dumps(out, default=str), ensure_ascii=True)
        return
    for line in explain_lines(out):
        console.print(line, highlight=False)


def explain_lines(out) -> list:
    """``raylane explain``'s lines (rich ``Text``, from ``cell``) for an ``explain`` reply."""
    lines = []

    def say(text: str) -> None:
        lines.append(cell(text))

    owner = f" owner={out['owner']}" if out.get("owner") else ""
    head = cell(out["id"])
    head.stylize("bold")
    lines.append(head.append_text(cell(f" team={out['team']} class={out['class']} state={out['state']}{owner}")))
    if out.get("redacted"):
        say("  (another team's workload: its spec, config, owner and journal are shown to its team only)")
    if out.get("reason"):
        say(f"  reason: {out['reason']}   position: {out.get('position') or '-'}")
    if out.get("eta_text"):
        say(f"  forecast: {out['eta_text']}")
    if out.get("predicted_end") is not None:
        say("  " + end_text(out))
    quotas = list((out.get("team_quota") or {}).items())
    quotas += [(f"gpu on {t}", q) for t, q in (out.get("team_flavors") or {}).items()]  # per-flavor GPU quotas
    for what, q in quotas:
        say(f"  quota {what}: used {q['used']:g} of nominal {q['nominal']:g}, borrowing limit "
            f"{q['borrowing_limit'] if q['borrowing_limit'] is not None else 'none'}")
    for c in out.get("team_cohorts") or []:  # the quota tree above its team, top-down
        say(f"  cohort {c['cohort']}: GPUs used {c['used']['gpu']:g} of nominal {c['nominal']['gpu']:g}, "
            f"borrowed {c['borrowed']['gpu']:g}, idle {c['idle']['gpu']:g} (lendable {c['lendable']['gpu']:g})")
    workers = f" workers={out['workers']}" if out.get("workers") else ""
    resizes = f" resizes={out['resizes']}" if out.get("resizes") else ""
    limits = f" run_limits={out['run_limits']}" if out.get("run_limits") else ""  # its class's max_runtime reached
    say(f"  preemptions={out['preemptions']}{resizes}{limits} restarts={out['restarts']} "
        f"step={out.get('step')}{workers}")
    rz = out.get("resize")
    if rz:
        say(f"  resizing from {rz['from_workers']} to {rz['to_workers']} workers: {rz['reason']}")
    if out.get("detail"):
        say(f"  now: {out['detail']}")
    for e in journal_lines(out.get("journal") or []):
        ts = time.strftime("%H:%M:%S", time.localtime(e["ts"]))
        say(f"  {ts} {e['kind']:<13} {e.get('note', '')}")
    return lines


def cancel(workload_id: str = typer.Argument(...)):
    """Cancel a workload: dequeue it, or stop it and release its resources."""

    with exit_on_error():
        rec = connect().cancel(workload_id)
    console.print(cell(f"{rec['id']}: {rec['state']}"))


def _os_user() -> str:
    import getpass
    import re

    try:
        name = re.sub(r"[^a-z0-9._@-]", "-", getpass.getuser().lower()) or "operator"
    except Exception:  # noqa: BLE001 - no user name in this environment
        name = "operator"
    return name if name[0].isalnum() else "operator"


def register(app: typer.Typer) -> None:
    for fn in (up, down, submit, queue, explain, cancel):
        app.command(fn.__name__)(fn)
