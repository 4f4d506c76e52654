"""Ray's jobs API, as Raylane uses it: submitting a driver job, retried while the cluster's job agent starts.

Right after a cluster starts, the dashboard answers 500 "No available agent to submit job" until the head's agent
is up; that is retried for up to ``timeout`` seconds, anything else is raised at once.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

from raylane.errors import RetryableError


def submit_job(client, *, timeout: float = 60.0, **kwargs) -> str:
    deadline = time.time() + timeout
    while True:
        try:
            return client.submit_job(**kwargs)
        except RuntimeError as exc:
            if "No available agent" not in str(exc):
                raise
            if time.time() >= deadline:
                raise RetryableError(f"the cluster's job agent did not come up in {timeout:g}s: {exc}") from exc
            time.sleep(1.0)


def wait_ready(client, *, timeout: float = 90.0) -> float:
    """Block until the cluster accepts job submissions (a no-op job is submitted and finishes); returns seconds."""
    t0 = time.time()
    job = submit_job(client, timeout=timeout, entrypoint="true", metadata={"raylane": "readiness probe"})
    while time.time() - t0 < timeout:
        if str(client.get_job_status(job)).endswith(("SUCCEEDED", "FAILED", "STOPPED")):
            return time.time() - t0
        time.sleep(0.2)
    raise RetryableError(f"the readiness probe job {job} did not finish in {timeout:g}s")


def with_credential(runtime_env: Optional[Dict[str, Any]], token: Optional[str],
                    spec: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``runtime_env`` plus the module that carries ``token`` (and ``spec``, for a driver that reads it from there:
    ``python -m raylane.run`` with neither a spec nor a workload id) to the job's driver (``raylane.credentials``):
    a ``py_modules`` entry, so neither is in a command line, environment variable or job info. The folder is
    removed when the process exits (Ray uploads it at submission). Ray keeps the package in its key-value store,
    which any code on the cluster can read: a job token is scoped to its workload for that reason
    (docs/security.md)."""
    import atexit
    import shutil

    from raylane.credentials import job_credential_dir

    env = dict(runtime_env or {})
    if not token and spec is None:
        return env
    path = job_credential_dir(token, spec=spec)
    atexit.register(shutil.rmtree, os.path.dirname(path), True)
    env["py_modules"] = list(env.get("py_modules") or []) + [path]
    return env
