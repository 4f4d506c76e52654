"""Talking to the control actor: start it, find it, and call it with Raylane's own exceptions.

Everything outside the actor (the CLI, ``raylane.run``, launchers, tests) goes through here, so errors the actor
raises (``ValidationError``, ``InfeasibleError``, ``NotFoundError``) reach callers as those types, not wrapped in
Ray's task errors.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Union

import ray

from raylane.config.loader import default_policy_path, read_yaml
from raylane.control.actor import CONTROL_NAME, NAMESPACE, ControlActor
from raylane.errors import ControlPlaneUnavailable, RaylaneError

DEFAULT_JOURNAL = os.path.join(os.path.expanduser("~"), ".raylane", "journal.db")


def journal_path(path: Optional[str] = None) -> str:
    return path or os.environ.get("RAYLANE_JOURNAL") or DEFAULT_JOURNAL


def policy_dict(policy: Union[str, Path, Dict[str, Any], None]) -> Dict[str, Any]:
    if isinstance(policy, dict):
        return policy
    data, _ = read_yaml(Path(policy) if policy else default_policy_path(), "policy file")
    return data


def start_control(policy: Union[str, Path, Dict[str, Any], None] = None, journal: Optional[str] = None,
                  *, tick_s: float = 1.0, admit_timeout_s: float = 30.0):
    """Create the detached control actor (or return the running one) in the ``raylane`` namespace."""
    # On the head node, beside its journal: an actor that asks for no CPU could otherwise land on any node.
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(ControlActor).options(
        name=CONTROL_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, num_cpus=0, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
        runtime_env={"env_vars": {"RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "")}}
        if os.environ.get("RAY_AUTH_MODE") else None,
    )
    handle = remote.remote(policy_dict(policy), journal_path(journal), tick_s, admit_timeout_s)
    call(handle, "ping")
    return handle


def head_node_id() -> str:
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return n["NodeID"]
    return ray.get_runtime_context().get_node_id()


def get_control():
    try:
        return ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    except ValueError as exc:
        raise ControlPlaneUnavailable(
            f"no control actor {CONTROL_NAME!r} in namespace {NAMESPACE!r}; start one with `raylane up`") from exc


def call(handle, method: str, *args, timeout: Optional[float] = 60.0, **kwargs):
    """Call ``method`` on the control actor and return its result, re-raising Raylane errors unwrapped."""
    try:
        return ray.get(getattr(handle, method).remote(*args, **kwargs), timeout=timeout)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if hasattr(exc, "cause") else None
        if isinstance(cause, RaylaneError):
            raise cause from None
        raise


def stop_control() -> None:
    try:
        ray.kill(ray.get_actor(CONTROL_NAME, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        pass
