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
from typing import Any, Callable, Dict, List

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
