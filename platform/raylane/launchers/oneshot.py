"""The one-shot launcher: kinds ``eval`` (an evaluation of a checkpoint) and ``batch`` (batch inference with Ray
Data), each run once on its lease, to the end, through restarts and preemptions.

It owns one workload's attempts from submission to its end: the spec's one-shot config (checked before the
workload queues, every problem named ``config.<key>``), the *run group* each attempt runs in, the *runner* that
runs the user's code there, and what the workload's MLflow run records about the result. The control actor owns
the lease; ``raylane.entrypoints`` finds and checks the user's code.

Words:
- *lease*: the gang's capacity the control actor admitted, on the nodes the core chose (``placement``, one node id
  per worker slot). The actor holds it as its reservation until the driver reports ``running``; the reservation is
  then dropped (the hand-over, as for training) and the ledger keeps the capacity counted.
- *run group*: the placement group ``raylane-<workload id>-run`` of the lease's shape, every bundle pinned to its
  node with a ``ray.io/node-id`` bundle label selector (as Ray Train's workers are), created by each attempt and
  removed at its end. Removing it stops whatever still runs in it.
- *runner*: one actor per attempt, in bundle 0 of the run group. For ``eval`` (and for a ``command`` of either
  kind) it holds the slot's resources and runs the code itself; for ``batch`` it asks for nothing and drives Ray
  Data, whose tasks and map workers are scheduled into the run group (``DataContext.scheduling_strategy``, which
  every Ray Data operator reads when it starts tasks or actors: ``map_operator._get_dynamic_ray_remote_args``,
  ``actor_pool_map_operator._apply_default_remote_args``). The runner is registered with the control actor
  (``register_workers``), so a preemption past the class's grace period stops it by force.
- *attempt*: one run on a lease. It ends done, stopped (preempted or cancelled: the driver removes the run group
  at once, since a one-shot attempt has nothing to checkpoint; the workload goes back to the queue and reruns from
  the start), or failed: a crash is retried with backoff up to the class's retry budget, an error no retry fixes
  (``FatalError``, a pydantic ``ValidationError``, an exception class with ``fatal = True``) fails the workload at
  once (``raylane.launchers.driver.fatal_cause``).

The config keys the platform reads (every other key is the user's, passed on unread):

- ``checkpoint``: ``{workload: NAME_OR_ID, step: latest | N}`` (resolved when an attempt starts, pinned against
  the source's retention, exactly as a training gang's ``init_from``) or a directory. The user's code sees the
  directory.
- batch: ``input`` (a parquet, csv or json file, a directory of them, a glob, or a URI; a relative path is taken
  from the job's working directory), ``input_format`` (when the names do not say), ``output`` (a directory the
  predictions are written to as parquet; a relative path is taken under the storage path; a URI is written in
  place), ``overwrite`` (replace an existing output; default false), ``batch_size``, ``batch_format`` (numpy,
  pandas or pyarrow; default numpy).
- ``fault`` (a test drill): ``crash_times: N``: the first N attempts crash in the runner before the code runs.

What the workload's MLflow run (``raylane.tracking``, one per workload) gets: an evaluation's metrics (at the
evaluated checkpoint's step), ``rows_in``/``rows_out`` of a batch job and the tag ``raylane.output``, ``wall_s``;
with a checkpoint reference, the tags ``mlflow.parentRunId`` (the source workload's run, from the ``mlflow_run_id``
its driver journaled), ``raylane.checkpoint.workload``, ``raylane.checkpoint.step`` and ``raylane.checkpoint.path``.

A ``command`` (instead of an entrypoint) runs once as a program in the runner, with the environment variables
``RAYLANE_CONFIG`` (the config as JSON), ``RAYLANE_CHECKPOINT_DIR``, ``RAYLANE_INPUT``, ``RAYLANE_OUTPUT``,
``RAYLANE_WORKLOAD_ID`` and ``RAYLANE_METRICS_FILE``: an evaluation writes its metrics there as a JSON object.
``python``/``python3`` as the program is the runner's own interpreter.
"""
from __future__ import annotations

import glob as globlib
import inspect
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from raylane import entrypoints
from raylane.control.checkpoints import CheckpointRef, parse_ref
from raylane.errors import FatalError, RetryableError, ValidationError
from raylane.launchers.retry import GiveUp, RetryRule, root_error

__all__ = ["OneShot", "Fault", "plan", "run_oneshot", "metrics_of", "command_argv",
           "METRICS_ENV", "CONFIG_ENV", "CHECKPOINT_ENV", "INPUT_ENV", "OUTPUT_ENV", "WORKLOAD_ENV"]

METRICS_ENV = "RAYLANE_METRICS_FILE"
CONFIG_ENV = "RAYLANE_CONFIG"
CHECKPOINT_ENV = "RAYLANE_CHECKPOINT_DIR"
INPUT_ENV = "RAYLANE_INPUT"
OUTPUT_ENV = "RAYLANE_OUTPUT"
WORKLOAD_ENV = "RAYLANE_WORKLOAD_ID"

# Ray Data's own tasks (listing, reading, writing) ask for 1 CPU each and have to fit in the run group beside the
# map workers: each worker slot keeps this much for them, the map worker gets the rest of the slot.
IO_CPUS = 1.0
FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv", ".csv.gz"),
           "json": (".json", ".jsonl", ".json.gz", ".jsonl.gz")}
BATCH_FORMATS = ("numpy", "pandas", "pyarrow")
PLATFORM_KEYS = ("checkpoint", "input", "input_format", "output", "overwrite", "batch_size", "batch_format",
                 "fault", "storage_path")
FAULT_KEYS = ("crash_times",)
GROUP_TIMEOUT_S = 120.0  # a run group not placed by then is a failed attempt (retried)


@dataclass(frozen=True)
class Fault:
    """The test drill of ``config.fault``."""

    crash_times: int = 0


@dataclass(frozen=True)
class OneShot:
    """A checked one-shot spec: what every attempt runs, with paths resolved. Picklable (it travels to the runner)."""

    workload: str  # the spec's name; the control plane's id is known once submitted
    kind: str
    entrypoint: Optional[str]
    command: Optional[Tuple[str, ...]]
    workers: int
    bundle: Dict[str, float]  # one worker slot, the shape of the reservation's bundles
    config: Dict[str, Any]  # what the user's code sees, before the checkpoint is resolved
    checkpoint_ref: Optional[CheckpointRef] = None
    checkpoint_dir: Optional[str] = None
    input: Optional[Any] = None  # a path, a URI or a list of files
    input_format: Optional[str] = None
    output: Optional[str] = None
    overwrite: bool = False
    batch_size: Optional[int] = None
    batch_format: str = "numpy"
    fault: Fault = field(default_factory=Fault)

    @property
    def uses_ray_data(self) -> bool:
        return self.kind == "batch" and self.command is None


# ------------------------------------------------------------------------------------------------ the checks


def plan(spec: Mapping[str, Any], *, storage_path: str, working_dir: Optional[str] = None) -> OneShot:
    """Check a one-shot spec's platform config and resolve its paths; ``ValidationError`` naming every problem
    (``config.<key>``, ``gang.*``) before anything queues. ``working_dir``: where relative inputs are (the job's
    working directory). The user's code is checked by ``raylane.entrypoints.check_spec`` (``raylane.run`` does it
    before calling the launcher)."""
    from raylane.config.loader import load_spec_from_dict
    from raylane.control.state import bundle_for

    name = spec.get("name", "?") if isinstance(spec, Mapping) else "?"
    parsed = load_spec_from_dict(spec, f"spec {name}")
    kind = parsed.kind
    if kind not in entrypoints.ONE_SHOT_KINDS:
        raise ValidationError(f"spec {name}", [("kind", kind, f"one of {', '.join(entrypoints.ONE_SHOT_KINDS)} "
                                                              "for the one-shot launcher")])
    working_dir = os.path.abspath(working_dir or os.getcwd())
    cfg = dict(parsed.config)
    gang = parsed.gang
    errors: List[Tuple[str, Any, str]] = []
    per_worker = gang.resources.to_core()
    if (kind == "eval" or parsed.command is not None) and gang.hi != 1:
        what = "a command" if parsed.command is not None else "evaluate(config)"
        errors.append(("gang.workers", gang.workers_value, f"1: {what} runs once, on one worker slot"))
    if kind == "batch" and parsed.command is None and per_worker.cpu < IO_CPUS:
        errors.append(("gang.resources.cpu", per_worker.cpu,
                       f"at least {IO_CPUS:g} per worker: Ray Data's read and write tasks run in the lease beside "
                       f"the map workers and ask for {IO_CPUS:g} CPU each"))

    ref, ck_dir = None, None
    value = cfg.get("checkpoint")
    try:
        ref = parse_ref(value, "config.checkpoint")
    except ValidationError as exc:
        errors.extend(exc.errors)
    if ref is None and value is not None and not isinstance(value, Mapping):
        if isinstance(value, str) and value.strip():
            ck_dir = _local(value, working_dir)
            if "://" not in value and not os.path.isdir(ck_dir):
                errors.append(("config.checkpoint", value, "an existing checkpoint directory (relative to the job's "
                                                           "working directory), or {workload: NAME_OR_ID, step: "
                                                           "latest | N}"))
        else:
            errors.append(("config.checkpoint", value, "{workload: NAME_OR_ID, step: latest | N}, or a checkpoint "
                                                       "directory"))

    io: Dict[str, Any] = {}
    if kind == "batch":
        io = _check_io(cfg, errors, storage_path=storage_path, working_dir=working_dir,
                       required=parsed.command is None)
    else:
        errors += [(f"config.{k}", cfg[k], "only for kind batch") for k in ("input", "input_format", "output",
                                                                            "overwrite", "batch_size", "batch_format")
                   if k in cfg]
    fault = _check_fault(cfg.get("fault"), errors)
    if errors:
        raise ValidationError(f"config of {name}", errors)

    user = entrypoints.user_config(cfg)
    if ck_dir is not None:
        user["checkpoint"] = ck_dir
    for key in ("input", "output"):
        if io.get(key) is not None:
            user[key] = io[key] if isinstance(io[key], str) else list(io[key])
    return OneShot(
        workload=parsed.name, kind=kind, entrypoint=parsed.entrypoint,
        command=tuple(parsed.command) if parsed.command is not None else None,
        workers=gang.lo, bundle=bundle_for(per_worker), config=user, checkpoint_ref=ref, checkpoint_dir=ck_dir,
        fault=fault, **io)


def _local(value: str, base: str) -> str:
    return value if "://" in value else os.path.abspath(os.path.join(base, os.path.expanduser(value)))


def _check_io(cfg: Mapping[str, Any], errors: list, *, storage_path: str, working_dir: str,
              required: bool) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    fmt = cfg.get("input_format")
    if fmt is not None and fmt not in FORMATS:
        errors.append(("config.input_format", fmt, f"one of {', '.join(FORMATS)}"))
        fmt = None
    raw = cfg.get("input")
    if raw is None:
        if required:
            errors.append(("config.input", None, "required for kind batch: a parquet, csv or json file, a directory "
                                                 "or glob of them, or a URI"))
    elif not isinstance(raw, str) or not raw.strip():
        errors.append(("config.input", raw, "a path, glob or URI (a non-empty string)"))
    else:
        files, why = _input_files(raw, working_dir)
        if why:
            errors.append(("config.input", raw, why))
        else:
            found = fmt or _format_of(files if isinstance(files, list) else [files])
            if found is None and required:
                errors.append(("config.input_format", fmt, f"one of {', '.join(FORMATS)}: the names in "
                                                           f"config.input ({raw!r}) do not say"))
            out["input"], out["input_format"] = files, found
    raw_out = cfg.get("output")
    overwrite = cfg.get("overwrite", False)
    if not isinstance(overwrite, bool):
        errors.append(("config.overwrite", overwrite, "true or false"))
        overwrite = False
    if raw_out is None:
        if required:
            errors.append(("config.output", None, "required for kind batch: the directory the results go to (a "
                                                  "relative path is taken under the storage path), or a URI"))
    elif not isinstance(raw_out, str) or not raw_out.strip():
        errors.append(("config.output", raw_out, "a directory or URI (a non-empty string)"))
    else:
        path = _local(raw_out, storage_path)
        if "://" not in path and os.path.exists(path) and not overwrite and (
                not os.path.isdir(path) or os.listdir(path)):
            errors.append(("config.output", raw_out, f"{path} exists and is not empty: name a new directory, "
                                                     "remove it, or set overwrite: true"))
        out["output"], out["overwrite"] = path, overwrite
    size = cfg.get("batch_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            errors.append(("config.batch_size", size, "an integer >= 1 (rows per batch)"))
        else:
            out["batch_size"] = size
    bf = cfg.get("batch_format", "numpy")
    if bf not in BATCH_FORMATS:
        errors.append(("config.batch_format", bf, f"one of {', '.join(BATCH_FORMATS)}"))
    else:
        out["batch_format"] = bf
    return out


def _input_files(raw: str, working_dir: str) -> Tuple[Any, Optional[str]]:
    """(what Ray Data reads: a path, a URI or a list of files, None) or (None, why not)."""
    if "://" in raw:
        return raw, None
    path = _local(raw, working_dir)
    if any(c in raw for c in "*?["):
        files = sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
        if not files:
            return None, f"matches no files (looked for {path})"
        return files, None
    if os.path.isdir(path):
        inside = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if not f.startswith((".", "_"))]
        if not inside:
            return None, f"{path} is an empty directory"
        return path, None
    if os.path.isfile(path):
        return path, None
    return None, f"no such file or directory: {path} (a relative path is taken from the job's working directory, " \
                 f"{working_dir})"


def _format_of(paths: Sequence[str]) -> Optional[str]:
    found = set()
    for p in paths:
        names = ([os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if not f.startswith((".", "_"))]
                 if os.path.isdir(p) else [p])
        for n in names:
            fmt = next((f for f, exts in FORMATS.items() if n.lower().endswith(exts)), None)
            if fmt is not None:
                found.add(fmt)
    return found.pop() if len(found) == 1 else None


def _check_fault(value: Any, errors: list) -> Fault:
    if value is None:
        return Fault()
    if not isinstance(value, Mapping):
        errors.append(("config.fault", value, f"a mapping with keys {', '.join(FAULT_KEYS)}"))
        return Fault()
    errors += [(f"config.fault.{k}", value[k], f"only the keys {', '.join(FAULT_KEYS)}") for k in value
               if k not in FAULT_KEYS]
    times = value.get("crash_times", 0)
    if isinstance(times, bool) or not isinstance(times, int) or times < 0:
        errors.append(("config.fault.crash_times", times, "an integer >= 0"))
        times = 0
    return Fault(crash_times=times)


def metrics_of(value: Any, source: str = "evaluate(config)") -> Dict[str, float]:
    """An evaluation's result as MLflow metrics; ``ValidationError`` (no retry) naming each bad entry."""
    if not isinstance(value, Mapping):
        raise ValidationError(f"result of {source}", [("<result>", _clip(value), "a mapping of metric names to "
                                                                                 "numbers")])
    errors, out = [], {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            errors.append((repr(k), _clip(v), "metric names are non-empty strings"))
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            errors.append((k, _clip(v), "a finite number"))
        else:
            out[k] = float(v)
    if not out and not errors:
        errors.append(("<result>", {}, "at least one metric"))
    if errors:
        raise ValidationError(f"result of {source}", errors)
    return out


def _clip(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 120 else text[:117] + "..."


def command_argv(command: Sequence[str]) -> List[str]:
    """The program and arguments to run: ``python``/``python3`` is the runner's own interpreter (the job's)."""
    argv = list(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


# ------------------------------------------------------------------------------------------------ the runner


class InjectedCrash(RuntimeError):
    """``config.fault.crash_times``: an attempt that crashes on purpose (retried like any crash)."""


class CommandFailed(RuntimeError):
    """A ``command`` exited with a non-zero status (retried)."""


class _Runner:
    """Runs one attempt's code inside the run group (an actor; see the module docstring)."""

    def run(self, job: OneShot, config: Dict[str, Any], wid: str, group, crash: bool) -> Dict[str, Any]:
        if crash:
            raise InjectedCrash(f"{wid}: injected crash (config.fault.crash_times {job.fault.crash_times})")
        if job.command is not None:
            return _run_command(job, config, wid)
        with entrypoints.on_path(os.getcwd()):  # the job's working directory, as in the driver
            if job.kind == "eval":
                fn = entrypoints.load(job.entrypoint, "eval")
                return {"metrics": metrics_of(fn(config), f"{job.entrypoint}(config)")}
            return _run_batch(job, config, group)


def _run_command(job: OneShot, config: Dict[str, Any], wid: str) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="raylane-oneshot-") as tmp:
        metrics_file = os.path.join(tmp, "metrics.json")
        env = dict(os.environ)
        env.update({CONFIG_ENV: json.dumps(config, default=str), METRICS_ENV: metrics_file, WORKLOAD_ENV: wid,
                    CHECKPOINT_ENV: str(config.get("checkpoint") or ""),
                    INPUT_ENV: json.dumps(config["input"]) if isinstance(config.get("input"), list)
                    else str(config.get("input") or ""),
                    OUTPUT_ENV: str(config.get("output") or "")})
        argv = command_argv(job.command)
        try:
            proc = subprocess.run(argv, env=env, preexec_fn=_die_with_parent, check=False)
        except FileNotFoundError:
            raise ValidationError("command", [("command[0]", argv[0], "a program on the PATH of the node it runs on "
                                                                      "(or python)")]) from None
        if proc.returncode != 0:
            raise CommandFailed(f"command {' '.join(job.command)[:200]} exited with status {proc.returncode}")
        out: Dict[str, Any] = {}
        if os.path.exists(metrics_file):
            try:
                with open(metrics_file) as f:
                    raw = json.load(f)
            except (OSError, ValueError) as exc:
                raise ValidationError("command", [(METRICS_ENV, metrics_file, f"a JSON object of metric names to "
                                                                              f"numbers ({exc})")]) from None
            out["metrics"] = metrics_of(raw, f"the metrics the command wrote to ${METRICS_ENV}")
        elif job.kind == "eval":
            raise ValidationError("command", [(METRICS_ENV, None, "the command exited 0 but wrote no metrics: an "
                                                                  "evaluation writes a JSON object of metric names "
                                                                  f"to numbers to the file ${METRICS_ENV} names")])
        if job.kind == "batch" and job.output:
            out["output"] = job.output
        return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The command dies with its runner: a runner stopped by force must not leave the program running."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: nothing to do
        pass


def _run_batch(job: OneShot, config: Dict[str, Any], group) -> Dict[str, Any]:
    import pyarrow.dataset as pads
    from ray.data import ActorPoolStrategy, DataContext, SaveMode, TaskPoolStrategy
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    fn = entrypoints.load(job.entrypoint, "batch")
    ctx = DataContext.get_current()
    into_group = PlacementGroupSchedulingStrategy(group)
    with warnings.catch_warnings():  # deprecated in Ray 2.60 but read by every operator; no per-run replacement
        warnings.simplefilter("ignore")
        ctx.scheduling_strategy = into_group
        ctx.scheduling_strategy_large_args = into_group
    ctx.enable_progress_bars = False  # job logs are read by people; the summary lines stay

    ds = _read(job)
    rows_in = ds.count()
    slot = job.bundle
    kwargs: Dict[str, Any] = {"batch_format": job.batch_format,
                              "num_gpus": slot.get("GPU", 0.0),
                              "num_cpus": max(0.0, slot.get("CPU", 0.0) - IO_CPUS)}
    if slot.get("memory"):
        kwargs["memory"] = slot["memory"]
    if job.batch_size is not None:
        kwargs["batch_size"] = job.batch_size
    if inspect.isclass(fn):
        kwargs["compute"] = ActorPoolStrategy(size=job.workers)
        if _takes_config(fn):
            kwargs["fn_constructor_kwargs"] = {"config": config}
    else:
        kwargs["compute"] = TaskPoolStrategy(size=job.workers)
    mapped = ds.map_batches(fn, **kwargs)

    remote = "://" in job.output
    target = job.output if remote else f"{job.output}.partial"
    if not remote:
        shutil.rmtree(target, ignore_errors=True)  # what a stopped or crashed attempt left
    mapped.write_parquet(target, mode=SaveMode.OVERWRITE)
    rows_out = pads.dataset(target, format="parquet").count_rows()
    if not remote:
        _publish(target, job.output, job.overwrite)
    return {"rows_in": rows_in, "rows_out": rows_out, "output": job.output}


def _read(job: OneShot):
    import ray.data

    readers = {"parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "json": ray.data.read_json}
    kwargs: Dict[str, Any] = {}
    if job.input_format == "csv":
        kwargs["file_extensions"] = ["csv", "csv.gz"]
    return readers[job.input_format](job.input, **kwargs)


def _takes_config(cls) -> bool:
    init = cls.__init__
    if init is object.__init__:
        return False
    params = list(inspect.signature(init).parameters.values())[1:]
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


def _publish(staged: str, output: str, overwrite: bool) -> None:
    """Move a finished attempt's output into place (a rename: readers never see half an output)."""
    if os.path.exists(output):
        if os.path.isdir(output) and not os.listdir(output):
            os.rmdir(output)
        elif overwrite:
            shutil.rmtree(output) if os.path.isdir(output) else os.remove(output)
        else:
            raise ValidationError("batch output", [("config.output", output, "appeared while the workload ran; "
                                                                             "set overwrite: true to replace it")])
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    os.rename(staged, output)


# ------------------------------------------------------------------------------------------------ the driver


@dataclass
class _Attempt:
    """How an attempt ended: ``result`` (done), ``stopped`` (the driver stopped it), or ``error``."""

    result: Optional[Dict[str, Any]] = None
    stopped: bool = False
    error: Optional[BaseException] = None


def run_oneshot(spec: Dict[str, Any], *, ctl, job_id: Optional[str] = None, storage_path: Optional[str] = None,
                tracking_uri: Optional[str] = None, poll_s: float = 2.0,
                workload_id: Optional[str] = None) -> Dict[str, Any]:
    """Check the spec (before it queues), register it, and run it on its lease until it succeeds, fails, or is
    cancelled; returns the workload's final record. ``workload_id``: drive that workload, already submitted (a
    pipeline's stage), instead of submitting the spec."""
    from raylane.launchers.train import DEFAULT_STORAGE
    from raylane.launchers.driver import registered

    storage = storage_path or (spec.get("config") or {}).get("storage_path") or DEFAULT_STORAGE
    job = plan(spec, storage_path=storage, working_dir=os.getcwd())
    return registered(ctl, spec, job_id, lambda wid: _drive(ctl, wid, spec, job, job_id=job_id,
                                                             tracking_uri=tracking_uri, poll_s=poll_s),
                      workload_id=workload_id)


def _drive(ctl, wid: str, spec: Dict[str, Any], job: OneShot, *, job_id, tracking_uri,
           poll_s: float) -> Dict[str, Any]:
    from raylane.control.client import EndState, Outcome, State
    from raylane.launchers.driver import fail_now, fatal_cause, one_line, say, wait_admitted
    from raylane.tracking import RunTracker

    tracker = RunTracker(workload_id=wid, spec=spec, tracking_uri=tracking_uri, cost_of=ctl.run_cost)
    run_id = tracker.start()
    ctl.event(wid, mlflow_run_id=run_id, mlflow_uri=tracker.tracking_uri, note=f"MLflow run {run_id}")
    budget = int(ctl.class_info(spec["class"])["retry_budget"])
    retries = RetryRule(budget)
    attempts = 0
    linked = False
    while True:
        rec = wait_admitted(ctl, wid, poll_s)
        if rec.terminal:
            notes = rec.get("events") or []
            if rec.state is State.FAILED and notes:  # e.g. the checkpoint it waited for can never be written
                tracker.event("failed", notes[-1][1])
            tracker.finish(rec.state.value)
            return rec
        if ctl.running(wid, job_id=job_id, note=f"{job.kind} starting").state is not State.RUNNING:
            continue  # preempted or cancelled between admission and start: wait again
        attempts += 1
        config = dict(job.config)
        try:
            source = _resolve(ctl, wid, job)
        except FatalError as exc:  # the checkpoint it names can never exist: no attempt will do better
            return fail_now(ctl, tracker, wid, str(exc))
        if source is not None:
            config["checkpoint"] = source["path"]
            if not linked:
                _link(ctl, tracker, source)
                linked = True
        say(f"{wid} attempt {attempts} on {len(set(rec['placement']))} node(s)")
        t0 = time.time()
        crash = attempts <= job.fault.crash_times
        out = _attempt(ctl, wid, job, config, rec["placement"], crash=crash, poll_s=poll_s)
        wall = time.time() - t0
        state = ctl.status(wid).state
        if state is State.CANCELLED:
            tracker.event("cancelled", f"cancelled during attempt {attempts}")
            tracker.finish("KILLED")
            return ctl.status(wid)
        if out.result is not None:  # done, even if a preemption arrived meanwhile
            detail = _record(tracker, job, out.result, wall, source)
            tracker.event("finished", detail)
            tracker.finish("FINISHED")
            say(f"{wid} finished: {detail}")
            return ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED, detail=detail)
        if out.stopped or state in (State.PREEMPTING, State.PENDING):
            how = "stopped" if out.stopped else "stopped by force"
            tracker.event("preempted", f"{how} after {wall:.0f}s; reruns from the start")
            say(f"{wid} preempted ({how}); releasing the lease")
            ctl.release(wid, Outcome.YIELDED)
            retries.after_success()  # it got somewhere: a later failure is not a repeat of an earlier one
            continue
        fatal = fatal_cause(out.error)
        if fatal is not None:
            return fail_now(ctl, tracker, wid, f"{one_line(fatal)} (not retried: it fails the same way every time)")
        decision = retries.after_failure(out.error, one_line(root_error(out.error)))
        if isinstance(decision, GiveUp):
            return fail_now(ctl, tracker, wid, decision.reason)
        failures, backoff = retries.failures, decision.backoff_s
        tracker.event("restarted", f"attempt {attempts} failed ({one_line(out.error)}); retry in {backoff:g}s")
        ctl.event(wid, restart=True,
             note=f"restart {failures}/{budget} after {one_line(out.error)}; backoff {backoff:g}s")
        say(f"{wid} failed ({one_line(out.error)}); retry {failures}/{budget} in {backoff:g}s")
        time.sleep(backoff)


def _resolve(ctl, wid: str, job: OneShot) -> Optional[Dict[str, Any]]:
    """``config.checkpoint: {workload, step}`` as the directory the control actor pinned for this workload."""
    from raylane.launchers.driver import say

    if job.checkpoint_ref is None:
        return None
    got = ctl.resolve_checkpoint(wid)
    say(f"{wid} uses {got['source']}'s checkpoint at step {got['step']}: {got['path']}")
    return got


def _link(ctl, tracker, source: Dict[str, Any]) -> None:
    """Make this workload's MLflow run a child of the run of the workload whose checkpoint it uses."""
    from raylane.tracking import RunTracker

    tags = {"raylane.checkpoint.workload": source["source"], "raylane.checkpoint.step": source["step"],
            "raylane.checkpoint.path": source["path"]}
    parent = None
    try:
        found = ctl.explain(source["source"])
        parent = next((e["mlflow_run_id"] for e in reversed(found["journal"]) if e.get("mlflow_run_id")), None)
        if parent is None:  # a source whose driver did not journal its run: find it by its workload id
            parent = RunTracker(workload_id=source["source"], spec=found["spec"],
                                tracking_uri=tracker.tracking_uri).find()
    except Exception as exc:  # noqa: BLE001 - a missing link must not fail the evaluation
        tracker.event("note", f"could not find the MLflow run of {source['source']}: {exc}")
    if parent and not (tracker.spec.get("pipeline") or {}).get("parent_run_id"):  # a stage stays under its pipeline
        tags["mlflow.parentRunId"] = parent
    tracker.set_tags(tags)


def _record(tracker, job: OneShot, result: Mapping[str, Any], wall: float,
            source: Optional[Mapping[str, Any]]) -> str:
    """The attempt's results in the workload's run; returns a one-line summary."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    step = int(source["step"]) if source and source.get("step") is not None else 0
    metrics = dict(result.get("metrics") or {})
    for key in ("rows_in", "rows_out"):
        if key in result:
            metrics[key] = float(result[key])
    metrics["wall_s"] = round(wall, 3)
    tracker.client.log_batch(tracker.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])
    if result.get("output"):
        tracker.set_tags({"raylane.output": result["output"]})
    shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k != "wall_s")
    where = f"; output {result['output']}" if result.get("output") else ""
    return f"{shown} in {wall:.0f}s{where}"


def _attempt(ctl, wid: str, job: OneShot, config: Dict[str, Any], placement: Sequence[str], *, crash: bool,
             poll_s: float) -> _Attempt:
    """One run in a run group of the lease's shape; the group goes at the end whatever happened."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # PACK is soft: the node-id selectors carry the core's decision, bundle by bundle.
    group = placement_group([dict(job.bundle)] * job.workers, strategy="PACK", name=f"raylane-{wid}-run",
                            bundle_label_selector=[{"ray.io/node-id": nid} for nid in placement])
    runner = None
    try:
        deadline, ready = time.time() + GROUP_TIMEOUT_S, group.ready()
        while not ray.wait([ready], timeout=poll_s)[0]:
            if ctl.should_stop(wid):
                return _Attempt(stopped=True)
            if time.time() > deadline:
                return _Attempt(error=RetryableError(f"run group of {wid} not placed in {GROUP_TIMEOUT_S:g}s"))
        slot = job.bundle
        holds_slot = not job.uses_ray_data  # for batch, the runner only drives Ray Data
        options: Dict[str, Any] = {
            "num_cpus": slot.get("CPU", 0.0) if holds_slot else 0,
            "num_gpus": slot.get("GPU", 0.0) if holds_slot else 0,
            "max_restarts": 0, "max_task_retries": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
        }
        if holds_slot and slot.get("memory"):
            options["memory"] = slot["memory"]
        runner = ray.remote(_Runner).options(**options).remote()
        ctl.register_workers(wid, [runner])
        ref = runner.run.remote(job, config, wid, group, crash)
        while True:
            done, _ = ray.wait([ref], timeout=poll_s)
            if done:
                try:
                    return _Attempt(result=ray.get(ref))
                except Exception as exc:  # noqa: BLE001 - classified by the caller
                    return _Attempt(error=exc)
            if ctl.should_stop(wid):
                return _Attempt(stopped=True)
    finally:
        if runner is not None:
            try:
                ray.kill(runner, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            remove_placement_group(group)
        except Exception:  # noqa: BLE001 - already removed
            pass
