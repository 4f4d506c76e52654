"""``raylane.train``: what a Ray Train loop sees of Raylane, and the worker side of the training launcher.

A user's loop needs nothing from this module. Raylane runs the spec's entrypoint as Ray Train's
``train_loop_per_worker(config)`` inside ``UserLoop``, which, in each worker process, wraps two Ray Train calls:

- ``ray.train.report(metrics, checkpoint=...)``: the metrics go to the workload's MLflow run (rank 0, against
  ``metrics["step"]``, else ``global_step``, else ``training_iteration``, else the report's index in the workload,
  counted across attempts from the step of the checkpoint the attempt resumed from: ``report_step``; the control
  plane records a step-less loop's checkpoints at that index too, so a preemption resumes it),
  then the report goes to Ray as usual. After a report in which rank 0 passed a checkpoint, if the control actor has
  asked the workload to stop (a preemption), the report does not return: it raises ``Yielded`` (a BaseException, so
  a loop's ``except Exception`` does not swallow it), the attempt ends as *yielded* at that step, the lease goes
  back, and the workload resumes later from exactly that checkpoint (``ray.train.get_checkpoint()``). Nothing
  reported after the checkpoint is lost, because nothing is reported after it.
- ``ray.train.get_preemption_info()``: also answers (a ``PreemptionInfo`` with no nodes) while the platform asks the
  workload to stop, so a loop that already yields on Ray's node-drain notices yields at once for Raylane too.

A resumed attempt whose loop does not resume (it never asks ``ray.train.get_checkpoint()`` before its first report,
or its first step is below the checkpoint's) has restarted from zero: rank 0 says so in the journal, the driver in
MLflow (an event and the tag ``raylane.restarted_from_zero``), and its points are logged again rather than dropped as
already logged, so the curve shows the restart.

On a node whose GPUs are logical (Ray schedules ``GPU`` but there is no CUDA: the local cluster, a dry run), each
worker's Ray Train torch utilities are pointed at the CPU (``use_cpu_for_logical_gpus``): ``prepare_model``,
``prepare_data_loader`` and ``get_device`` give the CPU, while the gang still holds its GPUs. With CUDA nothing
changes.

A loop that wants to yield at its current step rather than at its next checkpoint calls ``should_yield()`` (every
rank, the same number of times: it is a broadcast from rank 0), and when it answers True reports a checkpoint and
returns (or just reports it: the report then ends the loop). Outside Raylane ``should_yield()`` is always False.

The MLflow run is also named in each worker's environment (``MLFLOW_RUN_ID``, ``MLFLOW_TRACKING_URI``), so the
loop's own ``mlflow`` calls land in the workload's run; ``workload_id()`` gives the control plane's id. The driver
starts the run beside the gang (``raylane.runstart``): when the gang starts first, rank 0 waits, before the loop
runs, until the driver has named the run to the control actor (the workload's ``mlflow_run_id``), and every rank
gets the name from it; if the driver could not start the run (``mlflow_run_error``), the attempt fails with why.

Fault drills for tests (``config.fault``, read by the platform, never passed to the loop) live in
``raylane.faults`` and act on reports, so they work for any loop.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Union

from raylane.runstart import ANSWER_TIMEOUT_S  # a light module: neither MLflow nor Ray

log = logging.getLogger("raylane.train")

__all__ = ["should_yield", "workload_id", "Yielded", "UserLoop", "StopPoll", "report_step",
           "use_cpu_for_logical_gpus"]

STEP_KEYS = ("step", "global_step", "training_iteration")


def report_step(metrics: Optional[Mapping[str, Any]], index: int) -> int:
    """A report's step: its metrics' ``step``, else ``global_step``, else ``training_iteration`` (an integer, or a
    float with an integer value), else ``index``, the report's index in the workload (``resume_step`` + the
    report's index in the attempt). The worker (MLflow) and Train's controller (checkpoints) both use it."""
    step = explicit_step(metrics)
    return index if step is None else step


def explicit_step(metrics: Optional[Mapping[str, Any]]) -> Optional[int]:
    """The step the loop itself reported (``STEP_KEYS``, first that is an integer), or None."""
    for key in STEP_KEYS:
        value = (metrics or {}).get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return int(value)
    return None


def use_cpu_for_logical_gpus() -> bool:
    """In a Ray Train worker that holds GPUs but has no CUDA (logical GPUs), have Ray Train's torch utilities
    resolve the CPU instead of ``cuda:N``; returns whether it did. Ray picks its torch device manager from the
    worker's accelerator ids (the CUDA one, whose device then fails: ``torch.cuda.Stream requires CUDA support``),
    and ``ScalingConfig`` refuses ``use_gpu=False`` with GPUs in ``resources_per_worker``, so the choice is made
    here, per process, before the loop runs."""
    import ray

    if not ray.get_gpu_ids():
        return False
    import torch

    if torch.cuda.is_available():
        return False
    from ray.air._internal import device_manager
    from ray.air._internal.device_manager.cpu import CPUTorchDeviceManager

    with device_manager._torch_device_manager_lock:
        device_manager._torch_device_manager = CPUTorchDeviceManager()
    return True

_session: Optional["_Session"] = None


class Yielded(BaseException):
    """Raised by ``ray.train.report`` inside Raylane when the workload was asked to stop and the report carried a
    checkpoint: the attempt ends at ``step``; the workload resumes from that checkpoint."""

    def __init__(self, step: Optional[int]):
        super().__init__(f"yielded at step {step}")
        self.step = step


def should_yield() -> bool:
    """True when Raylane asks this workload to stop (a preemption). A collective: call it on every rank."""
    return _session.stop_asked(poll=True) if _session is not None else False


def workload_id() -> Optional[str]:
    """The control plane's id of the workload this process trains, or None outside Raylane."""
    return _session.opts.workload_id if _session is not None else None


class StopPoll:
    """Asked by rank 0: has the control actor asked this workload to stop? Picklable."""

    def __init__(self, workload_id: str, control=None):
        self.workload_id = workload_id
        self.control = control  # a raylane.control.client.ControlClient (it carries the driver's credential)

    def __call__(self) -> bool:
        from raylane.control.client import ControlClient
        from raylane.errors import NotFoundError, RetryableError

        if self.control is None:
            self.control = ControlClient.connect()
        try:
            return self.control.should_stop(self.workload_id, timeout=10)
        except NotFoundError:  # the control plane no longer knows it: stop
            return True
        except Exception as exc:  # noqa: BLE001 - the control actor restarting must not kill training
            self.control = self.control.reconnect()
            raise RetryableError(f"control actor unreachable: {exc}") from exc


@dataclass
class LoopOptions:
    """What the platform tells the worker side (picklable)."""

    workload_id: str
    run_id: Optional[str] = None
    tracking_uri: Optional[str] = None
    fault: Optional[Dict[str, Any]] = None
    marker_dir: Optional[str] = None
    extra_env: Dict[str, str] = field(default_factory=dict)
    control: Any = None  # the driver's ControlClient, for stop polls
    awaits_run: bool = False  # run_id is not known yet: the workers wait for the driver to name it (_named_run)
    resume_step: int = 0  # the workload's step when the attempt starts (its last checkpoint's), for report_step


class UserLoop:
    """Ray Train's ``train_loop_per_worker`` for a workload: imports the user's entrypoint in the worker (from the
    job's working directory or an installed package), runs it with the user's config under the report wrapper, and
    returns ``{"status": "finished" | "yielded", "step": last reported step, "value": what the loop returned}``,
    with ``"restarted_from_zero": step`` when a resumed attempt's loop did not resume from that step's checkpoint."""

    def __init__(self, target: Union[str, Callable], opts: LoopOptions):
        self.target = target
        self.opts = opts

    def __call__(self, config: Dict[str, Any]) -> Dict[str, Any]:
        global _session
        fn = self._function()
        use_cpu_for_logical_gpus()
        opts = _named_run(self.opts) if self.opts.awaits_run else self.opts
        session = _Session(opts)
        _session = session
        session.install()
        try:
            takes_config = _takes_argument(fn)
            value = fn(config) if takes_config else fn()
            status = "yielded" if session.asked else "finished"
            return {"status": status, "step": session.last_step, "value": _plain(value), **session.findings()}
        except Yielded as y:
            return {"status": "yielded", "step": y.step if y.step is not None else session.last_step,
                    **session.findings()}
        finally:
            session.close()
            _session = None

    def _function(self) -> Callable:
        if callable(self.target):
            return self.target
        from raylane import entrypoints

        return entrypoints.load(self.target, "train")


# How long rank 0 waits for the driver to name the workload's MLflow run: the driver's own wait for the run's
# starter, and a margin for the control actor restarting.
RUN_NAME_TIMEOUT_S = ANSWER_TIMEOUT_S + 30.0


def _named_run(opts: LoopOptions) -> LoopOptions:
    """``opts`` with the MLflow run the driver named to the control actor: rank 0 waits for it (or for why there is
    none) and every rank gets its answer (a broadcast). Raises ``RetryableError`` if the run could not be started."""
    import dataclasses

    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    from raylane.errors import RetryableError

    answer = _await_run_name(opts) if ray.train.get_context().get_world_rank() == 0 else None
    run_id, error = broadcast_from_rank_zero(answer)
    if error:
        raise RetryableError(error)
    return dataclasses.replace(opts, run_id=run_id, awaits_run=False)


def _await_run_name(opts: LoopOptions, timeout_s: float = RUN_NAME_TIMEOUT_S) -> tuple:
    """``(run_id, None)`` once the workload's record names its MLflow run, else ``(None, why)``."""
    from raylane.control.client import ControlClient
    from raylane.errors import NotFoundError

    control = opts.control or ControlClient.connect()
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            rec = control.status(opts.workload_id, timeout=10)
        except NotFoundError:
            return None, f"the control plane no longer knows {opts.workload_id}"
        except Exception as exc:  # noqa: BLE001 - the control actor restarting: ask again
            log.warning("could not ask the control actor for the MLflow run; will ask again: %s", exc)
            control, rec = control.reconnect(), None
        if rec is not None:
            if rec.get("mlflow_run_id"):
                return rec["mlflow_run_id"], None
            if rec.get("mlflow_run_error"):
                return None, f"the workload's MLflow run could not be started: {rec['mlflow_run_error']}"
            if rec.terminal:
                return None, f"{opts.workload_id} ended ({rec.state.value}) before its MLflow run was named"
        if time.monotonic() >= deadline:
            return None, f"the driver did not name the MLflow run of {opts.workload_id} within {timeout_s:g}s"
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _takes_argument(fn: Callable) -> bool:
    """Whether Ray Train would pass ``config`` to ``fn``: only when it has exactly one required parameter
    (``ray.train._internal.utils.construct_train_func``); a ``config=None`` default means it is called bare."""
    from ray.train._internal.utils import count_required_parameters

    try:
        return count_required_parameters(fn) == 1
    except (TypeError, ValueError):
        return True


def _plain(value: Any) -> Any:
    """The loop's return value if it is small plain data, else its repr (it travels back through Ray)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, dict)) and len(repr(value)) <= 10_000:
        return value
    return repr(value)[:1000]


class _DeferredLogger:
    """Rank 0's ``raylane.tracking.MetricLogger``, built in a background thread started by the first report, so that
    importing MLflow (about 2 s of CPU on a small machine, holding the GIL) is neither on the way to the loop's first
    step nor competing with it. Reports logged before it is ready wait in a list and go to it, in order, when it
    is; ``flush`` waits for it, so a checkpoint's metrics are still in MLflow before the checkpoint is handed to
    Ray."""

    def __init__(self, run_id: str, tracking_uri: str):
        self._logger = None
        self._error: Optional[BaseException] = None
        self._early: list = []
        self._keep_repeats = False
        self._thread = threading.Thread(target=self._build, args=(run_id, tracking_uri),
                                        name="raylane-metric-logger", daemon=True)

    def _build(self, run_id: str, tracking_uri: str) -> None:
        try:
            from raylane.tracking import MetricLogger

            self._logger = MetricLogger(run_id, tracking_uri)
        except BaseException as exc:  # noqa: BLE001 - raised in the loop's thread at its next flush
            self._error = exc

    def _ready(self, wait: bool):
        if self._thread.ident is None:
            self._thread.start()
        if self._thread.is_alive():
            if not wait:
                return None
            self._thread.join()
        if self._error is not None:
            raise self._error
        if self._keep_repeats:
            self._logger.keep_repeats()
        for step, metrics in self._early:
            self._logger.log(step, metrics)
        self._early = []
        return self._logger

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        logger = self._ready(wait=False)
        if logger is None:
            self._early.append((step, dict(metrics)))
        else:
            logger.log(step, metrics)

    def flush(self) -> None:
        self._ready(wait=True).flush()

    def keep_repeats(self) -> None:
        self._keep_repeats = True

    def close(self, attempts: int = 5) -> None:
        """The last flush: tried again with backoff, since nothing is written after it (``MetricLogger.flush``
        keeps what it could not write for the next flush, and there is none)."""
        logger = self._ready(wait=True)
        for i in range(attempts):
            logger.flush()
            if not logger.pending():
                return
            time.sleep(min(0.5 * 2 ** i, 5.0))
        log.error("run %s: %d metrics could not be written to %s", logger.run_id, logger.pending(),
                  logger.tracking_uri)


class _Session:
    """The worker side of one attempt: the wrapped Ray Train calls, the metric logger and the fault drills."""

    def __init__(self, opts: LoopOptions):
        import ray.train

        from raylane.faults import Faults

        self.opts = opts
        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.poll = StopPoll(opts.workload_id, opts.control)
        self.logger: Optional[_DeferredLogger] = None
        if self.rank == 0 and opts.run_id:
            self.logger = _DeferredLogger(opts.run_id, opts.tracking_uri or "")
        self.faults = Faults(marker_dir=opts.marker_dir or "", **opts.fault) if opts.fault else None
        self.resumed = ray.train.get_checkpoint() is not None
        self.read_checkpoint = False  # the loop asked for its checkpoint (get_checkpoint) before its first report
        self.restarted_from: Optional[int] = None  # resumed, but the loop started again from zero
        self.asked = False
        self.last_step: Optional[int] = None
        self.reports = 0
        self._saved: Dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- wrapping

    def install(self) -> None:
        import ray.train

        if self.opts.run_id:
            os.environ["MLFLOW_RUN_ID"] = self.opts.run_id
            if self.opts.tracking_uri:
                os.environ["MLFLOW_TRACKING_URI"] = self.opts.tracking_uri
        os.environ["RAYLANE_WORKLOAD_ID"] = self.opts.workload_id
        for k, v in self.opts.extra_env.items():
            os.environ[k] = v
        self._saved = {"report": ray.train.report, "get_preemption_info": ray.train.get_preemption_info}
        original_report, original_info = self._saved["report"], self._saved["get_preemption_info"]
        session = self
        self._watch_checkpoint_reads()

        def report(metrics, checkpoint=None, *args, **kwargs):
            return session.report(original_report, metrics, checkpoint, *args, **kwargs)

        def get_preemption_info():
            info = original_info()
            if session.stop_asked(poll=True) and info is None:
                return _preemption_info()
            return info

        report.__doc__ = original_report.__doc__
        get_preemption_info.__doc__ = original_info.__doc__
        ray.train.report = report
        ray.train.get_preemption_info = get_preemption_info

    def _watch_checkpoint_reads(self) -> None:
        """Notice the loop asking for its checkpoint, however it imported ``get_checkpoint``: every spelling ends
        in the worker's ``TrainFnUtils``, whose method is shadowed on the instance for this attempt."""
        from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

        utils = get_train_fn_utils()
        original = utils.get_checkpoint
        session = self

        def get_checkpoint():
            session.read_checkpoint = True
            return original()

        utils.get_checkpoint = get_checkpoint
        self._utils = utils

    def close(self) -> None:
        import ray.train

        for name, fn in self._saved.items():
            setattr(ray.train, name, fn)
        utils = getattr(self, "_utils", None)
        if utils is not None and "get_checkpoint" in vars(utils):
            del utils.get_checkpoint
        if self.logger is not None:
            self.logger.close()

    def findings(self) -> Dict[str, Any]:
        """What the driver tells MLflow about this attempt beyond its metrics."""
        return {} if self.restarted_from is None else {"restarted_from_zero": self.restarted_from}

    def _check_resumed(self, step: int, explicit: bool) -> None:
        """At a resumed attempt's first report: did the loop resume from its checkpoint?"""
        resumed_at = self.opts.resume_step
        if self.read_checkpoint and not (explicit and step < resumed_at):
            return
        self.restarted_from = resumed_at
        why = ("it did not ask for its checkpoint (ray.train.get_checkpoint())" if not self.read_checkpoint
               else f"its first step is {step}")
        if self.logger is not None:
            self.logger.keep_repeats()  # its points are new training, not a re-run of logged steps
        if self.rank == 0 and self.opts.control is not None:
            try:
                self.opts.control.event(self.opts.workload_id,
                                        f"restarted from zero: resumed at step {resumed_at}, but {why}")
            except Exception as exc:  # noqa: BLE001 - telling is best effort; the driver tells MLflow too
                log.warning("could not journal the restart from zero: %s", exc)

    # -- the wrapped calls

    def report(self, original, metrics, checkpoint, *args, **kwargs):
        step = self._step_of(metrics)
        if self.resumed and self.reports == 1:
            self._check_resumed(step, explicit_step(metrics) is not None)
        if self.faults is not None:
            self.faults.before_report(step, self.rank)
        if self.logger is not None:
            self.logger.log(step, metrics or {})
            if checkpoint is not None:
                self.logger.flush()  # what the checkpoint covers is in MLflow before the checkpoint is
        original(metrics, checkpoint=checkpoint, *args, **kwargs)
        self.last_step = step
        holding = self.faults is not None and self.faults.holds_at(step, self.resumed, checkpoint is not None)
        if self.faults is not None and self.faults.hold_at_steps:
            # Only rank 0 reports the checkpoint's files (the others pass none), so its word decides for all: a rank
            # that held while another trained on would wait in a collective the other never joins.
            from ray.train.collective import broadcast_from_rank_zero

            holding = bool(broadcast_from_rank_zero(holding if self.rank == 0 else None))
        asked = self.stop_asked(poll=checkpoint is not None or holding)
        while holding and not asked:  # every rank loops on the broadcast answer, so all join the same polls
            time.sleep(0.5)
            asked = self.stop_asked(poll=True)
        if asked:
            if self.logger is not None:
                self.logger.flush()
            raise Yielded(step)

    def stop_asked(self, *, poll: bool) -> bool:
        """Rank 0 asks the control actor (when ``poll``), every rank gets its answer (a broadcast)."""
        from ray.train.collective import broadcast_from_rank_zero

        answer = None
        if self.rank == 0:
            answer = self._ask() if poll else False
        asked = bool(broadcast_from_rank_zero(answer))
        if self.faults is not None:
            asked = self.faults.on_stop_answer(asked, self.rank)
        self.asked = self.asked or asked
        return asked

    def _ask(self) -> bool:
        from raylane.errors import RetryableError

        try:
            return self.poll()
        except RetryableError as exc:  # the control plane is restarting: keep training, ask again later
            log.warning("could not ask the control actor whether to stop; will ask again: %s", exc)
            return False

    def _step_of(self, metrics: Optional[Mapping[str, Any]]) -> int:
        self.reports += 1
        return report_step(metrics, self.opts.resume_step + self.reports)


def _preemption_info():
    from ray.train.v2.api.preemption import PreemptionInfo

    return PreemptionInfo(deadline_ms=int(time.time() * 1000), preempted_node_to_ranks={})
