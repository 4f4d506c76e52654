"""Talking to the control actor: start it, find it, and call it through one typed client.

Everything outside the actor (the CLI, ``raylane.run``, launchers, Train callbacks, tests) goes through
``ControlClient``: one method per call (``raylane.control.api`` holds the calls' argument models), each carrying the
caller's credential, each returning a typed result. Errors the actor raises (``ValidationError``,
``InfeasibleError``, ``NotFoundError``, ``AuthenticationError``, ``PermissionDeniedError``) reach callers as those
types, not wrapped in Ray's task errors.

A client pickles without its actor handle (it finds the actor again where it lands), so launchers hand it to Ray
Train's callbacks and workers; the credential travels inside it, never through an environment variable, a command
line or a log line (``Credential``'s repr shows the token id only).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import ray

from raylane import auth, credentials
from raylane.control.api import CONTROL_NAME, NAMESPACE, CostGroup, EndState, Outcome, ReportKind
from raylane.control.records import State
from raylane.cost import CostReport
from raylane.credentials import Credential
from raylane.errors import AuthenticationError, ControlPlaneUnavailable, RaylaneError, TooManyRequestsError

DEFAULT_JOURNAL = os.path.join(os.path.expanduser("~"), ".raylane", "journal.db")

__all__ = ["ControlClient", "WorkloadView", "Reply", "CostReport", "State", "Outcome", "EndState", "ReportKind", "start_control",
           "get_control", "stop_control", "journal_path"]


class WorkloadView(dict):
    """A workload as the control plane shows it to the caller: the record's fields (``id``, ``team``, ``class``,
    ``state``, ``position``, ``reason``, ...; for another team's workload only positions and reasons, and
    ``redacted`` is True), with typed accessors."""

    @property
    def id(self) -> str:
        return self["id"]

    @property
    def state(self) -> State:
        return State(self["state"])

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def ready(self) -> bool:
        """Its reservation is placed (``wait_admission`` only)."""
        return bool(self.get("ready"))

    @property
    def position(self) -> Optional[int]:
        return self.get("position")

    @property
    def reason(self) -> str:
        return self.get("reason") or ""

    @property
    def owner(self) -> Optional[str]:
        return self.get("owner")


class Reply(dict):
    """The answer to a ``report``: the workload's ``state`` and whether it must ``stop`` (preempted)."""

    @property
    def state(self) -> State:
        return State(self["state"])

    @property
    def stop(self) -> bool:
        return bool(self["stop"])


def _view(out) -> Optional[WorkloadView]:
    return WorkloadView(out) if out is not None else None


class ControlClient:
    """The control plane, as one caller (its credential) sees it."""

    def __init__(self, handle=None, credential: Union[Credential, str, None] = None, *, timeout: float = 60.0):
        self._handle = handle
        self.credential = Credential(credential) if isinstance(credential, str) else credential
        self.timeout = timeout

    @classmethod
    def connect(cls, credential: Union[Credential, str, None] = None) -> "ControlClient":
        """The running control actor, with ``credential`` or the one ``raylane.credentials.find`` finds."""
        return cls(get_control(), credential if credential is not None else credentials.find())

    def as_user(self, credential: Union[Credential, str, None]) -> "ControlClient":
        """The same control plane, called with another credential."""
        return ControlClient(self._handle, credential, timeout=self.timeout)

    def reconnect(self) -> "ControlClient":
        """The same caller, finding the control actor anew at its next call (after a failed call: the handle may
        name an actor that has since restarted)."""
        return ControlClient(None, self.credential, timeout=self.timeout)

    def __repr__(self) -> str:
        return f"ControlClient({self.credential!r})"

    def __getstate__(self):
        return {"credential": self.credential, "timeout": self.timeout}

    def __setstate__(self, state):
        self._handle = None
        self.credential = state["credential"]
        self.timeout = state["timeout"]

    @property
    def handle(self):
        if self._handle is None:
            self._handle = get_control()
        return self._handle

    def _call(self, call: str, timeout: Optional[float] = None, **args) -> Any:
        token = self.credential.token if self.credential is not None else None
        try:
            return ray.get(self.handle.request.remote(token, call, args),
                           timeout=self.timeout if timeout is None else timeout)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if hasattr(exc, "cause") else None
            if isinstance(cause, RaylaneError):
                raise cause from None
            raise

    # ----------------------------------------------------------------------------------------- workloads
    def submit(self, spec: Dict[str, Any], *, job_id: Optional[str] = None) -> WorkloadView:
        """Queue a workload (the caller becomes its owner); raises ``ValidationError``, ``InfeasibleError``,
        ``PermissionDeniedError`` (the spec's team is not the caller's)."""
        return _view(self._call("submit", spec=spec, job_id=job_id))

    def pipeline_submit(self, spec: Dict[str, Any], *, pipeline_id: str, storage_path: str,
                        parent_run_id: Optional[str] = None, job_id: Optional[str] = None) -> Dict[str, Any]:
        """Submit a ``kind: pipeline`` spec (``raylane.pipelines``): its view, with ``stage_specs`` (each stage's
        workload spec as the control plane resolved it). Raises ``ValidationError`` / ``InfeasibleError`` naming
        the stage."""
        return self._call("pipeline_submit", spec=spec, pipeline_id=pipeline_id, storage_path=storage_path,
                          parent_run_id=parent_run_id, job_id=job_id)

    def pipeline(self, pipeline_id: str) -> Dict[str, Any]:
        """A pipeline: state, plan, re-plans and its stages (state, placement, times, output)."""
        return self._call("pipeline_status", workload_id=pipeline_id)

    def pipeline_output(self, pipeline_id: str, stage: str, *, path: str, size: Optional[int], node: str) -> None:
        self._call("pipeline_output", workload_id=pipeline_id, stage=stage, path=path, bytes=size, node=node)

    def cancel(self, workload_id: str) -> WorkloadView:
        return _view(self._call("cancel", workload_id=workload_id))

    def release(self, workload_id: str, outcome: Outcome, *, state: EndState = EndState.SUCCEEDED,
                step: Optional[int] = None, detail: str = "") -> WorkloadView:
        """The workload's attempt ended: finished, failed, or yielded after a preemption (back to the queue)."""
        return _view(self._call("release", workload_id=workload_id, outcome=Outcome(outcome),
                                state=EndState(state), step=step, detail=detail[:4000]))

    def report(self, workload_id: str, kind: ReportKind, *, note: Optional[str] = None,
               detail: Optional[str] = None, restart: Optional[bool] = None, mlflow_run_id: Optional[str] = None,
               mlflow_run_error: Optional[str] = None, job_id: Optional[str] = None,
               step: Optional[int] = None, mlflow_uri: Optional[str] = None) -> Reply:
        args = {k: v for k, v in dict(note=note and note[:4000], detail=detail and detail[:4000], restart=restart,
                                      mlflow_run_id=mlflow_run_id,
                                      mlflow_run_error=mlflow_run_error and mlflow_run_error[:4000], job_id=job_id,
                                      step=step, mlflow_uri=mlflow_uri).items()
                if v is not None}
        return Reply(self._call("report", workload_id=workload_id, kind=ReportKind(kind), **args))

    def event(self, workload_id: str, note: Optional[str] = None, **kw) -> Reply:
        """A note for the workload's journal (or progress as ``detail``)."""
        return self.report(workload_id, ReportKind.EVENT, note=note, **kw)

    def running(self, workload_id: str, *, job_id: Optional[str], note: Optional[str] = None) -> Reply:
        """The driver starts its work on the lease (the reservation is handed over)."""
        return self.report(workload_id, ReportKind.RUNNING, job_id=job_id, note=note)

    def checkpoint_saved(self, workload_id: str, path: str, metrics: Optional[Dict[str, Any]] = None,
                         timeout: Optional[float] = None) -> None:
        self._call("checkpoint_saved", timeout=timeout, workload_id=workload_id, path=path, metrics=metrics)

    def register_workers(self, workload_id: str, handles: Sequence[Any], timeout: Optional[float] = None) -> None:
        self._call("register_workers", timeout=timeout, workload_id=workload_id, handles=list(handles))

    def should_stop(self, workload_id: str, timeout: Optional[float] = None) -> bool:
        return bool(self._call("should_stop", timeout=timeout, workload_id=workload_id))

    def resolve_checkpoint(self, workload_id: str) -> Dict[str, Any]:
        """``{"path", "step", "source"}`` of the checkpoint a consumer starts from (``path`` None: no reference)."""
        return self._call("resolve_checkpoint", workload_id=workload_id)

    def status(self, workload_id: str, timeout: Optional[float] = None) -> WorkloadView:
        return _view(self._call("status", timeout=timeout, workload_id=workload_id))

    def explain(self, workload_id: str) -> WorkloadView:
        """Status, the team's quota and (for the caller's teams) the journal."""
        return _view(self._call("explain", workload_id=workload_id))

    def wait_admission(self, workload_id: str, timeout_s: float = 5.0) -> WorkloadView:
        """Wait up to ``timeout_s`` for the reservation to be placed; the record either way (``ready``). A wait the
        control plane refuses for too many open ones (``TooManyRequestsError``: its bounds on one credential's, one
        workload's and all waits) is tried again a second later within ``timeout_s``; past it, the record as it is."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                return _view(self._call("wait_admission", timeout=max(60.0, left + 30), workload_id=workload_id,
                                        timeout_s=float(left)))
            except TooManyRequestsError:
                if time.monotonic() + 1.0 >= deadline:
                    return self.status(workload_id)
                time.sleep(1.0)

    def find_job(self, job_id: str) -> Optional[WorkloadView]:
        return _view(self._call("find_job", job_id=job_id))

    def queue(self, include_done: bool = False) -> List[WorkloadView]:
        return [WorkloadView(r) for r in self._call("queue", include_done=include_done)]

    def class_info(self, name: str) -> Dict[str, Any]:
        return self._call("class_info", name=name)

    def info(self) -> Dict[str, Any]:
        return self._call("info")

    def whoami(self) -> Dict[str, Any]:
        return self._call("whoami")

    def cohorts(self) -> List[Dict[str, Any]]:
        """The quota tree's cohorts, top-down (empty for a flat policy): ``cohort``, ``parent``, ``teams`` and, per
        resource, ``nominal``, ``used``, ``borrowed``, ``idle`` and ``lendable``."""
        return self._call("cohorts")

    def teams(self) -> List[Dict[str, Any]]:
        """Every team: ``team``, ``weight``, ``used`` (per resource), ``pending`` and ``running`` workload counts,
        ``quotas`` (per resource: ``used``, ``nominal``, ``borrowing_limit``, ``lending_limit``; a limit of None
        is unlimited) and ``cohorts`` (the cohorts above it, top-down; empty for a flat policy)."""
        return self._call("teams")

    # -------------------------------------------------------------------------------- operators: tokens, policy
    def token_create(self, user: str, teams: Sequence[str] = (), role: str = "member",
                     ttl_s: Optional[float] = None, note: str = "") -> Dict[str, Any]:
        """A new token (``result["token"]``, shown once) and its record."""
        role = role.value if isinstance(role, auth.Role) else role
        return self._call("token_create", user=user, teams=list(teams), role=role, ttl_s=ttl_s, note=note)

    def job_token(self, ttl_s: float = 7 * 86400.0, note: str = "", script: bool = False) -> Optional[str]:
        """A token for one Ray job with the caller's rights, expiring after ``ttl_s`` and with the caller's token;
        None when the control plane runs without authentication. ``script``: for a script's job (one workload per
        ``fit()``, ``raylane.script``)."""
        return self._call("job_token", ttl_s=ttl_s, note=note, **({"script": True} if script else {}))["token"]

    def token_rotate(self, token_id: str) -> Dict[str, Any]:
        return self._call("token_rotate", token_id=token_id)

    def token_revoke(self, token_id: str) -> Dict[str, Any]:
        return self._call("token_revoke", token_id=token_id)

    def token_list(self, include_revoked: bool = False) -> List[Dict[str, Any]]:
        return self._call("token_list", include_revoked=include_revoked)

    def audit(self, *, since: Optional[float] = None, user: Optional[str] = None, team: Optional[str] = None,
              limit: int = 1000) -> List[Dict[str, Any]]:
        return self._call("audit", since=since, user=user, team=team, limit=limit)

    def cost(self, *, since: Optional[float] = None, until: Optional[float] = None, team: Optional[str] = None,
             by: Optional[str] = None, workload_ids: Optional[Sequence[str]] = None,
             mlflow_run_id: Optional[str] = None) -> CostReport:
        """Spend in ``[since, until)`` (epoch seconds; default: all of the journal, to now): per workload, sweep,
        pipeline, team and class (``by``: only that group), per node type, idle, and each team's month against its
        budget. Operators see every team (or ``team``); anyone else their own teams (``team``: one of them).
        ``workload_ids`` / ``mlflow_run_id``: only these workloads' leases / those of the workloads that named
        this MLflow run."""
        return CostReport.from_dict(self._call(
            "cost", since=since, until=until, team=team, by=CostGroup(by) if by is not None else None,
            workload_ids=list(workload_ids) if workload_ids is not None else None, mlflow_run_id=mlflow_run_id))

    def run_cost(self, mlflow_run_id: str) -> float:
        """What the leases of an MLflow run's workloads cost so far (a workload's run; a sweep's parent run, all its
        slots): what ``RunTracker`` records when the run ends."""
        return self.cost(by="workload", mlflow_run_id=mlflow_run_id).leased_cost

    def reload_policy(self, policy: Union[str, Path, Dict[str, Any]]) -> Dict[str, Any]:
        return self._call("reload_policy", policy=policy_dict(policy))

    # ----------------------------------------------------------------------------------------------- nodes
    def nodes(self, include_lost: bool = False) -> List[Dict[str, Any]]:
        """Every node: service state (ready, cordoned, draining, drained, quarantined, lost), reason, last probe,
        GPUs and the leases on it."""
        return self._call("node_list", include_lost=include_lost)

    def node_cordon(self, node: str, reason: str = "") -> Dict[str, Any]:
        """No new leases on ``node`` (its id or a unique prefix); what runs there keeps running. Operators only."""
        return self._call("node_cordon", node=node, reason=reason)

    def node_uncordon(self, node: str, reason: str = "") -> Dict[str, Any]:
        """Back in service (from cordoned, draining, drained or quarantined). Operators only."""
        return self._call("node_uncordon", node=node, reason=reason)

    def node_drain(self, node: str, reason: str = "") -> Dict[str, Any]:
        """Cordon ``node`` and preempt its leases gracefully; ``nodes()`` shows it ``drained`` once empty."""
        return self._call("node_drain", node=node, reason=reason)

    def ping(self) -> bool:
        return bool(ray.get(self.handle.ping.remote(), timeout=self.timeout))


def journal_path(path: Optional[str] = None) -> str:
    return path or os.environ.get("RAYLANE_JOURNAL") or DEFAULT_JOURNAL


def policy_dict(policy: Union[str, Path, Dict[str, Any], None]) -> Dict[str, Any]:
    from raylane.config.loader import default_policy_path, read_yaml

    if isinstance(policy, dict):
        return policy
    data, _ = read_yaml(Path(policy) if policy else default_policy_path(), "policy file")
    return data


def start_control(policy: Union[str, Path, Dict[str, Any], None] = None, journal: Optional[str] = None,
                  *, tick_s: float = 1.0, admit_timeout_s: float = 30.0, auth_enabled: bool = True,
                  operator: str = "operator", token: Optional[str] = None,
                  cluster: Union[str, Path, Dict[str, Any], None] = None) -> ControlClient:
    """Create the detached control actor (or find the running one) in the ``raylane`` namespace; returns a client
    holding an operator token (with ``auth_enabled``; its digest alone reaches the actor, which journals it).
    ``token``: that operator token (a caller that retries passes the same one); default a fresh one. ``cluster``:
    the cluster file (a path or its dict), whose growable node groups the control plane asks Ray's autoscaler to
    grow for waiting gangs (``raylane.control.state_scale``); None: it asks for no node."""
    from raylane.config.loader import read_yaml
    # Here, not at the top: every CLI command and driver imports this module, and the state machine is the
    # actor's (its import is a tenth of a `raylane queue`).
    from raylane.control.actor import start_actor, start_watch

    if token is None:
        token, tid, salt, digest = auth.new_token()
    else:
        tid, secret = auth.parse_token(token)
        salt = auth.secrets.token_hex(16)
        digest = auth.digest(secret, salt)
    boot = {"enabled": auth_enabled,
            "bootstrap": {"user": operator, "id": tid, "salt": salt, "digest": digest} if auth_enabled else None}
    if cluster is not None and not isinstance(cluster, dict):
        cluster, _ = read_yaml(Path(cluster), "cluster file")
    # On the head node, beside its journal (raylane.control.actor.start_actor); its watcher starts it again from
    # the same arguments if it is ever gone (ControlWatch: ray.kill ends an actor whatever its max_restarts).
    start = {"policy": policy_dict(policy), "journal": journal_path(journal), "tick_s": tick_s,
             "admit_timeout_s": admit_timeout_s, "auth": boot, "cluster": cluster}
    handle = start_actor(start)
    client = ControlClient(handle, token if auth_enabled else None)
    client.ping()
    start_watch(start)
    try:
        if client.info().get("auth") is False:
            client.credential = None
    except AuthenticationError:
        # It was running already (get_if_exists), so this bootstrap token never reached it: use the caller's own.
        client.credential = credentials.find()
    return client


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


def stop_control() -> None:
    """Stop the control actor for good: its watcher first (raylane.control.actor.ControlWatch), which would start
    it again."""
    from raylane.control.actor import WATCH_NAME

    for name in (WATCH_NAME, CONTROL_NAME):
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        except ValueError:
            pass
