"""The ``serve:`` section of a workload spec (``kind: serve``): what model to serve, how each replica is sized, how
the replica count follows the traffic, and the latency the deployment is meant to keep.

This module owns that section's schema and its defaults; it reads no files and decides nothing (the serving driver,
``raylane.launchers.serve``, acts on it). It builds on ``raylane.config.fields`` (``StrictModel``,
``Duration``, ``ResourcesSpec``) and is what ``WorkloadSpec.serve`` holds.

Words
- *deployment*: the class every replica constructs (``model.deployment``, the user's code) with ``model.args``.
- *replica*: one copy of the model behind the HTTP route, a Ray Serve replica. Each holds ``replica.resources``
  (its GPUs among them) under a lease of its own from the control actor.
- *ongoing requests*: requests a replica has accepted and not yet answered; the autoscaler aims at
  ``target_ongoing_requests`` per replica.
- *upscale / downscale delay*: how long the wanted replica count must stay above / below the current one before the
  driver acts. The downscale delay is also the least time a replica's GPU is held before it goes back to training
  (anti-thrash).
- *latency objective*: the p99 request latency, in milliseconds, the deployment is sized for; exported as a metric
  and compared by the benchmark, not enforced.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Dict, Optional

from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from raylane.config.fields import Allowed, Duration, ResourcesSpec, StrictModel
from raylane.config.fields import error as _err

__all__ = ["ServeSpec", "ServeModelSpec", "ReplicaSpec", "AutoscalingSpec"]

IMPORT_PATH_ALLOWED = "an import path 'package.module:Class' (or 'package.module.Class')"
_IMPORT_RE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*([:.][A-Za-z_][\w]*)")


def _check_import_path(value: str) -> str:
    if not _IMPORT_RE.fullmatch(value):
        raise _err("import_path", IMPORT_PATH_ALLOWED)
    return value


ImportPath = Annotated[str, AfterValidator(_check_import_path), Allowed(IMPORT_PATH_ALLOWED)]

ROUTE_ALLOWED = "an HTTP route prefix starting with '/', of letters, digits and '-_./'"
_ROUTE_RE = re.compile(r"/[A-Za-z0-9\-_./]*")


def _check_route(value: str) -> str:
    if not _ROUTE_RE.fullmatch(value):
        raise _err("route", ROUTE_ALLOWED)
    return value


RoutePrefix = Annotated[str, AfterValidator(_check_route), Allowed(ROUTE_ALLOWED)]


class ServeModelSpec(StrictModel):
    """What each replica runs: the deployment class and the keyword arguments every replica constructs it with.

    ``deployment`` is required: an import path to a Ray Serve deployment or a plain class (the driver wraps it with
    ``serve.deployment``), from the job's working directory or an installed package. ``args`` go to the class's
    constructor as they are, whatever the class; a class that declares a pydantic ``config_schema`` has them checked
    against it before anything queues (``raylane.launchers.serve.load_deployment``). This section imports nothing:
    the class and its arguments are the driver's to check.
    """

    deployment: ImportPath
    args: Dict[str, Any] = Field(default_factory=dict)


class ReplicaSpec(StrictModel):
    """One replica: what it holds while it runs, and how many requests it accepts at once."""

    resources: ResourcesSpec = Field(default_factory=lambda: ResourcesSpec(gpu=1, cpu=0.5))
    # Above the autoscaling target so that excess load queues at the replicas, where the driver can count it.
    max_ongoing_requests: int = Field(default=32, ge=1, le=10_000)


class AutoscalingSpec(StrictModel):
    """How the replica count follows the load. Scale-from-zero is not offered: load is measured at the replicas."""

    min_replicas: int = Field(default=1, ge=1, le=1000)
    max_replicas: int = Field(default=1, ge=1, le=1000)
    target_ongoing_requests: float = Field(default=2.0, gt=0)
    upscale_delay: Duration = 5.0
    downscale_delay: Duration = 60.0

    # A field validator so that it reports even when another field of the section is invalid.
    @field_validator("max_replicas")
    @classmethod
    def _max_at_least_min(cls, v: int, info: ValidationInfo) -> int:
        lo = info.data.get("min_replicas")
        if lo is not None and v < lo:
            raise _err("max_replicas", f"an integer >= min_replicas ({lo})")
        return v


class ServeSpec(StrictModel):
    """The ``serve:`` section of a ``kind: serve`` spec."""

    model: ServeModelSpec
    # None: "/<spec name>".
    route_prefix: Optional[RoutePrefix] = None
    replica: ReplicaSpec = Field(default_factory=ReplicaSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    latency_objective_ms: float = Field(default=1000.0, gt=0)
