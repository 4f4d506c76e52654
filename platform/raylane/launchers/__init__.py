"""Launchers turn a lease into Ray work, one per workload kind, looked up by name as the core's policies are.

Each entry is ``"module:function"``, imported only when a workload of that kind runs (a sweep driver does not pay for
Ray Serve, nor a training driver for Ray Data). A launcher is called as

    launcher(spec, ctl=<control actor>, job_id=<Ray job id or None>, storage_path=..., tracking_uri=..., poll_s=...)

and returns the workload's final record (``status``). It registers the workload (or its slots) with the control
actor, waits for admission, runs, and releases; it never imports the reference workloads (``workloads/``): the
user's code comes from the spec (``raylane.entrypoints``).

- ``train``: ``raylane.launchers.train.run_training``: a Ray Train gang running the spec's entrypoint.
- ``tune``: ``raylane.launchers.tune.run_sweep``: a Ray Tune sweep inside the team's quota.
- ``serve``: ``raylane.launchers.serve.run_serving``: Ray Serve replicas.
- ``eval``, ``batch``: ``raylane.launchers.oneshot.run_oneshot``: one run of the user's code on the lease.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

from raylane.errors import UnknownNameError

LAUNCHERS: Dict[str, str] = {
    "train": "raylane.launchers.train:run_training",
    "tune": "raylane.launchers.tune:run_sweep",
    "serve": "raylane.launchers.serve:run_serving",
    "eval": "raylane.launchers.oneshot:run_oneshot",
    "batch": "raylane.launchers.oneshot:run_oneshot",
}


def kinds() -> List[str]:
    return sorted(LAUNCHERS)


def launcher_for(kind: str) -> Callable[..., Dict[str, Any]]:
    """The launcher of ``kind``; ``UnknownNameError`` listing the known kinds."""
    if kind not in LAUNCHERS:
        raise UnknownNameError("workload kind", kind, list(LAUNCHERS))
    module, _, name = LAUNCHERS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def register(kind: str, target: str) -> None:
    """Add a launcher for a new kind (``"module:function"``); a kind registered twice is refused."""
    if kind in LAUNCHERS:
        raise ValueError(f"workload kind {kind!r} registered twice")
    LAUNCHERS[kind] = target


# ---------------------------------------------------------------------------------------------------------------
# What each launcher checks before anything queues, beyond the entrypoint (raylane.entrypoints.check_spec): run by
# ``raylane spec check`` and ``raylane submit`` too (raylane.launchers.check), so they refuse what the driver would.


def _check_oneshot(spec, data: Mapping[str, Any], working_dir: Optional[str]) -> None:
    from raylane.launchers.oneshot import plan

    plan(data, storage_path=os.path.join(os.path.expanduser("~"), ".raylane", "runs"), working_dir=working_dir)


def _check_sweep(spec, data: Mapping[str, Any], working_dir: Optional[str]) -> None:
    from raylane.entrypoints import on_path
    from raylane.sweeps.trainables import check_trainable

    with on_path(working_dir):
        check_trainable(spec.config, spec.sweep)


def _check_serve(spec, data: Mapping[str, Any], working_dir: Optional[str]) -> None:
    from raylane.launchers.serve import load_deployment

    load_deployment(spec.serve.model, working_dir=working_dir)


def _check_train(spec, data: Mapping[str, Any], working_dir: Optional[str]) -> None:
    fault = (spec.config or {}).get("fault")
    if fault is None:
        return
    from raylane.errors import ValidationError
    from raylane.faults import FAULT_KEYS, Faults

    if not isinstance(fault, dict) or set(fault) - set(FAULT_KEYS):
        raise ValidationError("spec", [("config.fault", fault, f"a mapping of fault drills: {', '.join(FAULT_KEYS)}")])
    Faults(marker_dir="", **fault)


PRECHECKS: Dict[str, Callable[[Any, Mapping[str, Any], Optional[str]], None]] = {
    "train": _check_train, "eval": _check_oneshot, "batch": _check_oneshot, "tune": _check_sweep,
    "serve": _check_serve,
}


def precheck(spec, data: Mapping[str, Any], *, working_dir: Optional[str] = None) -> None:
    """The launcher's own checks of a valid ``WorkloadSpec`` (``data``: the spec as written); ``ValidationError``
    naming every problem. They import the user's code (trainable, deployment) from ``working_dir``."""
    check = PRECHECKS.get(spec.kind)
    if check is not None:
        check(spec, data, working_dir)
