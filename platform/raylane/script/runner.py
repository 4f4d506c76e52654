"""Runs a user's script as the job's driver, ``__main__`` as ``python SCRIPT ARGS`` would, with script mode's hooks
installed (``raylane.script.install``) for as long as it runs, and removed after, whatever the script did.

The script sees ``sys.argv == [SCRIPT, *ARGS]`` and its own folder first on ``sys.path``. The driver is connected to
the cluster and the control plane before the script starts (a missing credential or an unknown class stops it
there, before any of the user's code runs), so the script's own ``ray.init(...)`` keeps that connection, as
``ray.init(ignore_reinit_error=True)`` would, instead of failing on a second connect.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import sys
from typing import Iterator, List, Optional

from raylane.errors import ValidationError
from raylane.script.context import ScriptContext

__all__ = ["run_script", "script_context", "run_in_main", "script_mode"]


def script_context(script: str, argv: List[str], *, team: str, class_name: str, name: Optional[str] = None,
                   storage_path: Optional[str] = None, tracking_uri: Optional[str] = None,
                   poll_s: float = 2.0) -> ScriptContext:
    """Connect this driver (Ray, then the control plane as the job's caller) and describe the script's run."""
    import ray

    from raylane.launchers.driver import connect_driver, init_ray, ray_job_id
    from raylane.locations import tracking_uri as resolve_tracking_uri

    if not os.path.isfile(script):
        raise ValidationError("python -m raylane.run", [("SCRIPT", script, "a Python file (the script to run)")])
    resolve_tracking_uri(tracking_uri)  # a store MLflow refuses is named now, before the script runs
    if not ray.is_initialized():
        init_ray()
    ctl, who = connect_driver()
    ctl.class_info(class_name)  # an unknown class is named now, not at the script's first fit()
    return ScriptContext(team=team, class_name=class_name, name=name, script=script, argv=list(argv), ctl=ctl,
                         job_id=ray_job_id(), storage_path=storage_path, tracking_uri=tracking_uri, poll_s=poll_s,
                         owner=who["user"] if who.get("auth") else None)


@contextlib.contextmanager
def script_mode(ctx: ScriptContext) -> Iterator[None]:
    """The hooks installed, and the script's ``ray.init`` kept on this driver's connection, within the block."""
    import ray

    from raylane import script

    original_init = ray.init

    def init(*args, **kwargs):
        if ray.is_initialized():
            kwargs["ignore_reinit_error"] = True
        return original_init(*args, **kwargs)

    init.__wrapped__ = original_init
    script.install(ctx)
    ray.init = init
    try:
        yield
    finally:
        ray.init = original_init
        script.uninstall()


def run_in_main(script: str, argv: List[str]) -> int:
    """Run ``script`` as ``__main__`` with ``argv``; its exit status (0 unless it raised ``SystemExit``)."""
    path = os.path.abspath(script)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def run_script(script: str, argv: List[str], *, team: str, class_name: str, name: Optional[str] = None,
               storage_path: Optional[str] = None, tracking_uri: Optional[str] = None, poll_s: float = 2.0) -> int:
    """``python -m raylane.run --team T --class C SCRIPT ARGS``: the script's exit status."""
    ctx = script_context(script, argv, team=team, class_name=class_name, name=name, storage_path=storage_path,
                         tracking_uri=tracking_uri, poll_s=poll_s)
    with script_mode(ctx):
        return run_in_main(script, argv)
