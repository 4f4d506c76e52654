"""``raylane spec check``: checking workload spec files (a pipeline's too) without a cluster.

This module owns the ``spec`` command group: every check submission runs, on files, before anything is submitted.
A file's errors are shown by ``raylane.cli.common.print_error`` (one line per error, ``path: got VALUE; ALLOWED``,
on stderr, exit status 1). It reads files through ``raylane.config.loader`` and ``raylane.launchers.check`` only.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from raylane.cli.common import print_error
from raylane.config.loader import load_policy
from raylane.config.models import WorkloadSpec
from raylane.errors import FatalError, NotFoundError

spec_app = typer.Typer(help="Check workload spec files.", no_args_is_help=True)

# Resolved at print time, so tests that swap sys.stdout see the output.
_out = Console(highlight=False, soft_wrap=True)


def spec_summary(path: Path, s: WorkloadSpec, policy_path: Optional[Path], *, code: bool = True) -> str:
    g = s.gang
    res = g.resources.to_core()
    size = f"{g.lo}..{g.hi} (elastic)" if g.elastic else f"{g.lo}"
    placement = g.placement or "class default"
    checked = f"against {policy_path}" if policy_path else "alone (pass --policy to check team, class and features)"
    runs = f"; runs {s.entrypoint}" if s.entrypoint else (f"; runs command {s.command[0]}" if s.command else "")
    if runs and not code:
        runs += " (code not imported: --no-code)"
    return (
        f"OK {path}: {s.name} ({s.kind}, class {s.class_}, team {s.team}): {size} x ({res}),"
        f" placement {placement}{runs}; checked {checked}"
    )


@spec_app.command("check")
def spec_check(
    files: List[Path] = typer.Argument(..., help="Workload spec YAML files.", show_default=False),
    policy: Optional[Path] = typer.Option(
        None, "--policy", "-p", help="Also check teams, classes and node features against this policy file."
    ),
    working_dir: Path = typer.Option(
        Path("."), "--working-dir", "-w", help="Where the specs' user code is imported from: the folder you would "
        "pass to `ray job submit --working-dir`.", file_okay=False, dir_okay=True),
    no_code: bool = typer.Option(
        False, "--no-code", help="Do not import the user's code (for a machine without their project): check only "
        "the form of entrypoint and command."),
) -> None:
    """Validate workload specs with every check submission runs: the spec's fields, its team, class and features
    against a policy when given, and its user code (the entrypoint exists and fits the kind, the config fits the
    entrypoint's declared schema). Prints every error; exits 1 if any file is invalid."""
    pol = None
    if policy is not None:
        try:
            pol = load_policy(policy)
        except FatalError as exc:
            print_error(exc)
            raise typer.Exit(1)
    if not working_dir.is_dir():
        print_error(NotFoundError(f"working directory {working_dir} not found"))
        raise typer.Exit(1)
    from raylane.launchers.check import check_spec_file

    failed = False
    for f in files:
        try:
            if _is_pipeline(f):  # raylane.pipelines: the DAG and every stage's workload and code
                _check_pipeline(f, pol, working_dir, not no_code)
                continue
            spec = check_spec_file(f, pol, working_dir=working_dir, load_code=not no_code)
        except FatalError as exc:
            print_error(exc)
            failed = True
        else:
            _out.print(spec_summary(f, spec, policy, code=not no_code), markup=False)
    raise typer.Exit(1 if failed else 0)


def _is_pipeline(path: Path) -> bool:
    from raylane.config.loader import read_yaml

    try:
        data, _ = read_yaml(path, "spec file")
    except FatalError:
        return False  # check_spec_file reports it
    return isinstance(data, dict) and data.get("kind") == "pipeline"


def _check_pipeline(path: Path, pol, working_dir: Path, load_code: bool) -> None:
    from raylane.config import pipeline as ps
    from raylane.config.loader import read_yaml
    from raylane.launchers.train import DEFAULT_STORAGE
    from raylane.pipelines.driver import check

    data, _ = read_yaml(path, "pipeline file")
    spec = check(data, storage_path=DEFAULT_STORAGE, working_dir=str(working_dir), load_code=load_code)
    if pol is not None:
        from raylane.config.loader import load_spec_from_dict
        from raylane.errors import ValidationError

        errors = []
        for stage, s in ps.expand(spec, f"{spec.name}-check", DEFAULT_STORAGE).items():
            try:
                load_spec_from_dict(s, f"stage {stage}", policy=pol)
            except ValidationError as exc:
                errors += [(f"stages.{stage}.workload.{f}", v, a) for f, v, a in exc.errors]
        if errors:
            raise ValidationError(str(path), errors)
    order = " -> ".join(f"{n}" + (f" (after {', '.join(st.needs)})" if st.needs else "")
                        for n, st in spec.stages.items())
    _out.print(f"{path}: OK: pipeline {spec.name}, team {spec.team}, {len(spec.stages)} stages: {order}",
               markup=False)


def register(app: typer.Typer) -> None:
    """``raylane spec ...``."""
    app.add_typer(spec_app, name="spec")


__all__ = ["register", "spec_app", "spec_check", "spec_summary"]
