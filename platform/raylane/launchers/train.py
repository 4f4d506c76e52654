"""The training launcher: turns a lease into a Ray Train gang that lands where the control actor decided.

Ray Train V2 builds its own placement group and cannot take one reserved elsewhere, so the lease is handed over:
the control actor holds the gang's reservation (a placement group pinned node by node) until the driver is ready;
then the reservation is dropped and Train's own group of the same shape is created with a per-worker node-id
label selector, so every worker lands on the node the core chose. The ledger keeps the capacity counted throughout.

Train's own retries are off (``max_failures=0``): the driver (``raylane.run``) decides, because a worker that died
because the control actor stopped it by force after a preemption's grace period is not a failure, while a crash is
retried from the latest checkpoint with backoff up to the class's retry budget.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional, Sequence

import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.v2._internal.execution.callback import ReportCallback, WorkerGroupCallback

from raylane.control.actor import CONTROL_NAME, GiB, NAMESPACE
from raylane.errors import RetryableError
from raylane.scheduling.placement import RAY_STRATEGY

log = logging.getLogger("raylane.launchers.train")
DEFAULT_STORAGE = os.path.join(os.path.expanduser("~"), ".raylane", "runs")


class StopPoll:
    """Asked by rank 0 before every step: has the control actor asked this workload to stop? Picklable."""

    def __init__(self, workload_id: str):
        self.workload_id = workload_id
        self._handle = None

    def __call__(self) -> bool:
        try:
            if self._handle is None:
                self._handle = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
            return bool(ray.get(self._handle.should_stop.remote(self.workload_id), timeout=10))
        except Exception as exc:  # noqa: BLE001 - the control actor restarting must not kill training
            self._handle = None
            raise RetryableError(f"control actor unreachable: {exc}") from exc

    def __getstate__(self):
        return {"workload_id": self.workload_id, "_handle": None}


class RegisterWorkers(WorkerGroupCallback):
    """Tells the control actor which actors form the gang, so it can stop them by force after the grace period."""

    def __init__(self, workload_id: str):
        self.workload_id = workload_id

    def after_worker_group_start(self, worker_group):
        handles = [w.actor for w in worker_group.get_workers()]
        ctl = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
        ray.get(ctl.register_workers.remote(self.workload_id, handles), timeout=30)


class RecordCheckpoints(ReportCallback):
    """Tells the control actor of every checkpoint the gang registers, whatever loop wrote it.

    Runs in Train's controller after Train's own checkpoint manager took the report (and its retention deleted what
    fell out of ``num_to_keep``), so the checkpoint named here is on storage. The actor journals it, pins it for a
    consumer that waits for that step (raylane.control.checkpoints), and counts it as the gang's last checkpoint.
    """

    def __init__(self, workload_id: str):
        self.workload_id = workload_id

    def after_report(self, training_report, metrics):
        checkpoint = getattr(training_report, "checkpoint", None)
        if checkpoint is None:
            return
        reported = getattr(training_report, "metrics", None) or {}
        step = {"step": reported["step"]} if "step" in reported else {}
        try:
            ctl = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
            ray.get(ctl.checkpoint_saved.remote(self.workload_id, checkpoint.path, step), timeout=60)
        except Exception as exc:  # noqa: BLE001 - the control plane restarting must not fail the training run
            log.warning("could not tell the control actor of checkpoint %s: %s", checkpoint.path, exc)


def build_trainer(*, workload_id: str, spec: Dict[str, Any], placement: Sequence[str], storage_path: str,
                  train_loop_config: Dict[str, Any], train_fn=None) -> TorchTrainer:
    from workloads.ray_train import train_loop_per_worker

    gang = spec["gang"]
    res = gang.get("resources", {})
    per_worker: Dict[str, float] = {"CPU": float(res.get("cpu", 1) or 0)}
    if res.get("gpu"):
        per_worker["GPU"] = float(res["gpu"])
    if res.get("memory"):
        per_worker["memory"] = float(_gib(res["memory"]) * GiB)
    real_gpus = torch.cuda.is_available()
    scaling = ScalingConfig(
        num_workers=int(gang.get("workers", 1)),
        # Logical GPUs are scheduled as GPUs; without CUDA the workers train on the CPU over gloo.
        use_gpu=bool(res.get("gpu")),
        resources_per_worker=per_worker,
        placement_strategy=RAY_STRATEGY.get(gang.get("placement") or "pack", "PACK"),
        label_selector=[{"ray.io/node-id": nid} for nid in placement],
    )
    run_config = RunConfig(
        name=workload_id,
        storage_path=storage_path,
        failure_config=FailureConfig(max_failures=0),
        checkpoint_config=CheckpointConfig(num_to_keep=3),
        callbacks=[RegisterWorkers(workload_id), RecordCheckpoints(workload_id)],
    )
    return TorchTrainer(
        train_fn or train_loop_per_worker,
        train_loop_config=train_loop_config,
        scaling_config=scaling,
        run_config=run_config,
        torch_config=TorchConfig(backend="nccl" if real_gpus else "gloo"),
    )


def _gib(value) -> float:
    from raylane.config.models import parse_memory

    return parse_memory(value)


def latest_checkpoint(storage_path: str, workload_id: str) -> Optional[str]:
    run_dir = os.path.join(storage_path, workload_id)
    if not os.path.isdir(run_dir):
        return None
    cps = sorted(d for d in os.listdir(run_dir)
                 if d.startswith("checkpoint_") and os.path.isdir(os.path.join(run_dir, d)))
    return os.path.join(run_dir, cps[-1]) if cps else None
