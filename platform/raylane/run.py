"""``python -m raylane.run SPEC.yaml``: the driver of one workload (or of a ``kind: pipeline`` spec's stages,
``raylane.pipelines.driver``), run as a plain Ray job.

    ray job submit --working-dir ./my-project -- python -m raylane.run spec.yaml
    ray job submit --working-dir ./my-project -- python -m raylane.run --team T --class C train.py ARGS...

The second form is script mode (``raylane.script``): the user's own Ray Train script runs unchanged as the driver,
and each trainer ``fit()`` it calls becomes a workload of team T and class C, driven as below.

The driver checks the spec's code before anything queues (``raylane.launchers.check``: the entrypoint or command
is there, fits the kind, the config fits the entrypoint's declared schema, the datasets are there), then hands the
workload to the launcher of its kind (``raylane.launchers``). Every launcher registers the workload with the control
actor (with its Ray job id, so stopping the job cancels the workload and cancelling the workload stops the job),
prints its queue position and reason while it waits, and starts only once admitted. For training
(``raylane.launchers.train``):
- the gang yields when the control actor preempts it (graceful: at its next report with a checkpoint, or at once
  for a loop that asks ``raylane.train.should_yield()``), the driver releases the lease and waits again; admitted
  again, it resumes from the latest checkpoint;
- a gang stopped by force after the grace period is treated the same way (it resumes from its last checkpoint);
- a crash is retried on the same lease from the latest checkpoint with exponential backoff, up to the class's
  retry budget; then the workload fails with the reason. An error no retry fixes (a ``FatalError``, a pydantic
  ``ValidationError``, any exception whose class says ``fatal = True``) fails it at once.
One MLflow run follows the logical workload across all of that (``raylane.tracking``).

``run_workload`` is the same driver from Python; ``train_fn`` runs a function object instead of the entrypoint.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, Dict, Optional

from raylane.launchers.driver import connect_driver, init_ray, ray_job_id, say

log = logging.getLogger("raylane.run")


def run_workload(spec: Dict[str, Any], *, train_fn: Optional[Callable] = None, storage_path: Optional[str] = None,
                 tracking_uri: Optional[str] = None, poll_s: float = 2.0,
                 working_dir: Optional[str] = None, workload_id: Optional[str] = None) -> Dict[str, Any]:
    """Check ``spec``'s code, then run it to the end with its kind's launcher; returns the final record.

    ``working_dir``: where the user's code is (default: the job's working directory, which Ray puts on the path).
    ``workload_id``: drive that workload, queued already with this job's id (``raylane submit`` queues it before
    it submits the job; kinds train, eval and batch), instead of submitting the spec."""
    from raylane import entrypoints
    from raylane.launchers import launcher_for
    from raylane.launchers.check import check_code

    kind = spec.get("kind", "train") if isinstance(spec, dict) else None
    from raylane.config.loader import load_spec_from_dict

    kwargs: Dict[str, Any] = {}
    if kind != "serve":  # a store MLflow refuses is named now, before anything queues (raylane.locations)
        from raylane.locations import tracking_uri as resolve_tracking_uri

        resolve_tracking_uri(tracking_uri)
    if kind == "train":  # MLflow's import and store open beside the rest of the start-up, on spare CPUs
        from raylane.runstart import RunStarter, use_child

        if use_child():
            kwargs["run_starter"] = RunStarter(team=spec.get("team"), tracking_uri=tracking_uri)
    try:
        import ray

        load_spec_from_dict(spec, "spec")  # its shape first: every problem named, before any code is imported
        if train_fn is None:
            with entrypoints.on_path(working_dir):
                check_code(spec)
        if not ray.is_initialized():
            init_ray()
        launcher = launcher_for(kind)
        ctl, who = connect_driver()
    except BaseException:
        if "run_starter" in kwargs:
            kwargs["run_starter"].close()
        raise
    if who.get("auth"):  # MLflow records the caller as the owner, not what the spec claims
        spec = {**spec, "run": {**(spec.get("run") or {}), "owner": who["user"]}}
    kwargs.update(ctl=ctl, job_id=ray_job_id())
    if kind != "serve":
        kwargs.update(storage_path=storage_path, tracking_uri=tracking_uri, poll_s=poll_s)
    if train_fn is not None:
        kwargs["train_fn"] = train_fn
    if workload_id is not None:
        kwargs["workload_id"] = workload_id
    return launcher(spec, **kwargs)


def spec_of(workload_id: str) -> Dict[str, Any]:
    """The spec of ``workload_id``, queued already (``raylane submit``), read from the control plane with this
    driver's credential: the spec is passed by reference, never on the job's command line."""
    from raylane.errors import FatalError

    init_ray()
    ctl, _ = connect_driver()
    spec = ctl.status(workload_id).get("spec")
    if not isinstance(spec, dict):
        raise FatalError(f"the control plane shows this driver no spec of {workload_id}")
    return spec


def _parser(*, script: bool):
    """The driver's options; ``script``: what follows the script is its own arguments, passed unread."""
    p = argparse.ArgumentParser(prog="python -m raylane.run", description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="?", help="workload spec (YAML); with --team and --class, the script to run")
    if script:
        p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                       help="script mode: the script's own arguments, passed unread")
    p.add_argument("--team", default=None, help="script mode: the team every fit() of the script is queued under")
    p.add_argument("--class", dest="class_name", default=None, help="script mode: the class of its workloads")
    p.add_argument("--name", default=None, help="script mode: the workloads' name (default: the trainer's "
                                                "RunConfig name, else the script's stem)")
    p.add_argument("--storage-path", default=None, help="where checkpoints go (default ~/.raylane/runs)")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default sqlite ~/.raylane/mlflow.db)")
    p.add_argument("--workload-id", default=None, help="drive this workload, queued already with this job's id "
                                                       "(what `raylane submit` passes)")
    return p


def main(argv=None) -> int:
    from raylane.config.loader import read_yaml
    from raylane.control.records import State
    from raylane.errors import FatalError

    argv = sys.argv[1:] if argv is None else list(argv)
    p = _parser(script=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.team is not None or args.class_name is not None or args.name is not None:
        if not (args.team and args.class_name and args.spec):
            p.error("script mode needs --team, --class and the script: --team T --class C SCRIPT [ARGS...]")
        if args.workload_id:
            p.error("--workload-id drives a queued spec; script mode queues each fit() itself")
        return _run_script(args)
    p = _parser(script=False)  # a spec's driver: its options may follow the spec
    args = p.parse_args(argv)
    try:
        if args.spec:
            data, _ = read_yaml(args.spec, "spec file")
        elif args.workload_id:
            data = spec_of(args.workload_id)
        else:
            from raylane.credentials import job_spec

            data = job_spec()
            if data is None:
                p.error("give a spec file, --workload-id, or a script with --team and --class")
        if isinstance(data, dict) and data.get("kind") == "pipeline":  # raylane.pipelines
            from raylane.pipelines.driver import run_pipeline

            view = run_pipeline(data, storage_path=args.storage_path, tracking_uri=args.tracking_uri)
            return 0 if view["state"] == State.SUCCEEDED else 1
        rec = run_workload(data, storage_path=args.storage_path, tracking_uri=args.tracking_uri,
                           workload_id=args.workload_id)
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    say(f"{rec['id']}: {rec['state']} (preemptions {rec['preemptions']}, restarts {rec['restarts']})")
    return 0 if rec["state"] == State.SUCCEEDED else 1


def _run_script(args) -> int:
    """Script mode (``raylane.script.runner``): the script's exit status; 1 if the platform refused it."""
    from raylane.errors import FatalError
    from raylane.script.runner import run_script

    try:
        return run_script(args.spec, args.script_args, team=args.team, class_name=args.class_name, name=args.name,
                          storage_path=args.storage_path, tracking_uri=args.tracking_uri)
    except FatalError as exc:  # refused before or at a fit(): the script's own traceback is not the point
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
