"""The control plane's calls: one request model per call, checked the same way on both sides. Pure: no Ray.

The control actor takes every call through one entry point, ``request(credential, call, args)``: the call's name
is looked up in ``CALLS`` (an unknown name is refused naming the known ones), its arguments are validated by the
call's model (``extra="forbid"``, strict types, bounded sizes, at most ``MAX_DEPTH`` levels of nesting: every
problem is named by its field, the value and what is allowed), the caller is authenticated, then authorized for the
call's ``Action`` on its target workload.
``raylane.control.client.ControlClient`` builds these requests; nothing else names a call.

Words: *call* is the request's name (``submit``, ``cancel``, ...); *target* the workload a call acts on, if any.
"""
from __future__ import annotations

import enum
import json
from typing import Any, ClassVar, Dict, List, Optional, Type

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator
from pydantic import ValidationError as PydanticValidationError
from typing_extensions import Annotated

from raylane.auth import Action
from raylane.control.journal import Kind
from raylane.control.records import State
from raylane.errors import ValidationError

# The detached control actor's name and namespace: what a client looks it up by (``raylane.control.client``).
CONTROL_NAME = "raylane-control"
NAMESPACE = "raylane"

WORKLOAD_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$"
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,159}$"
WorkloadId = Annotated[StrictStr, Field(pattern=WORKLOAD_ID)]
JobId = Annotated[StrictStr, Field(pattern=JOB_ID)]
Text = Annotated[StrictStr, Field(max_length=4000)]
Step = Annotated[StrictInt, Field(ge=0, le=10 ** 12)]
Seconds = Annotated[float, Field(ge=0, le=3600, allow_inf_nan=False)]
MAX_SPEC_BYTES = 1 << 20
# How deep an argument's dicts and lists may nest. A real spec or policy is under ten levels deep; one nested
# hundreds deep passed the size bound and then broke serializing it (pydantic, json) deep inside the handler.
MAX_DEPTH = 32
# The longest a wait_admission call may hold its caller (and a waiter in the actor); drivers poll for seconds.
MAX_WAIT_S = 300.0


class Outcome(str, enum.Enum):
    """How a workload's attempt ended, as its driver releases it."""

    FINISHED = "finished"
    FAILED = "failed"
    YIELDED = "yielded"  # after a preemption: back to the queue


class EndState(str, enum.Enum):
    """How a released workload ended, by its driver's word: the ``State``s it may end in but REJECTED (only a submit
    rejects). Each member is its ``State``'s value, so ``State(end)`` is the record's state."""

    SUCCEEDED = State.SUCCEEDED.value
    FAILED = State.FAILED.value
    CANCELLED = State.CANCELLED.value


class ReportKind(str, enum.Enum):
    """What a driver reports of its running workload; journaled as an entry of the ``Kind`` of the same value."""

    RUNNING = Kind.RUNNING.value  # the driver started its work on the lease
    EVENT = Kind.EVENT.value  # a note for the journal, or progress (detail)


class Request(BaseModel):
    """One call's arguments. ``action`` is what ``raylane.auth.authorize`` checks; ``audited`` calls are written to
    the audit trail when they succeed (every refusal is, whatever the call)."""

    # defer_build: a model's validator is built at its first use, not at import: every client imports this module
    # (for the enums and the actor's name), and building all the calls' validators took a twentieth of a
    # `raylane queue`. The actor builds each on the first call of its kind.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    action: ClassVar[Optional[Action]] = None
    audited: ClassVar[bool] = False

    def target(self) -> Optional[str]:
        return getattr(self, "workload_id", None)

    @classmethod
    def parse(cls, args: Any) -> "Request":
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ValidationError(f"call {CALL_NAMES[cls]}", [("args", _short(args), "a mapping of argument names "
                                                                                     "to values")])
        deep = _too_deep(args)
        if deep is not None:
            path, value = deep
            raise ValidationError(f"call {CALL_NAMES[cls]}", [(path, _short(value), f"at most {MAX_DEPTH} levels "
                                                                                     f"of nested mappings and lists")])
        try:
            return cls(**args)
        except PydanticValidationError as exc:
            raise ValidationError(f"call {CALL_NAMES[cls]}", [
                (".".join(str(p) for p in e["loc"]) or "args", _short(e.get("input")), e["msg"])
                for e in exc.errors()]) from None
        except TypeError as exc:  # e.g. non-string keys
            raise ValidationError(f"call {CALL_NAMES[cls]}", [("args", _short(args), str(exc))]) from None


def _too_deep(args: Dict[Any, Any]) -> Optional[tuple]:
    """(field path, value) of the first mapping or list that lies more than ``MAX_DEPTH`` levels down an argument
    (an argument's own value is level 1), or None. Iterative, so any depth (a self-containing list too) is measured
    without recursion; what it walks was already received whole."""
    stack = [(_step(k), v, 1) for k, v in args.items() if isinstance(v, (dict, list, tuple))]
    while stack:
        path, v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return path, v
        items = v.items() if isinstance(v, dict) else enumerate(v)
        stack.extend((f"{path}.{_step(k)}", x, depth + 1) for k, x in items if isinstance(x, (dict, list, tuple)))
    return None


def _step(key: Any) -> str:
    """A key or index as a field path shows it, short: a path is at most ``MAX_DEPTH`` of these, however long the
    keys are that it passes."""
    if isinstance(key, str):
        return key if len(key) <= 40 else key[:37] + "..."
    if isinstance(key, int) and abs(key) < 10 ** 12:
        return str(key)
    return f"<{type(key).__name__}>"


def _short(v: Any) -> Any:
    """A value as an error shows it: long ones cut, so a huge argument does not become a huge error."""
    try:
        text = repr(v)
    except (ValueError, RecursionError):  # ints beyond Python's digit limit, self-nesting containers
        return f"<a {type(v).__name__} too large to show>"
    return v if len(text) <= 200 else text[:200] + f"... ({len(text)} characters)"


class Submit(Request):
    spec: Dict[StrictStr, Any]
    job_id: Optional[JobId] = None
    action: ClassVar[Optional[Action]] = Action.SUBMIT
    audited: ClassVar[bool] = True

    @field_validator("spec")
    @classmethod
    def _size(cls, v):
        try:
            n = len(json.dumps(v, default=str))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"a JSON-like mapping ({type(exc).__name__})") from None
        if n > MAX_SPEC_BYTES:
            raise ValueError(f"at most {MAX_SPEC_BYTES} bytes as JSON (got {n})")
        return v


class PipelineSubmit(Submit):
    """A ``kind: pipeline`` spec (``raylane.pipelines``): every stage becomes a workload at once. The driver names the
    pipeline (``pipeline_id``, unique), says where stage outputs go and which MLflow run is the pipeline's."""

    pipeline_id: WorkloadId
    storage_path: Annotated[StrictStr, Field(min_length=1, max_length=4000)]
    parent_run_id: Optional[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = None

    def target(self) -> Optional[str]:
        return self.pipeline_id


class PipelineOutput(Request):
    """A finished stage's output, as its driver measured it: where, how many bytes, on which node."""

    workload_id: WorkloadId  # the pipeline's id
    stage: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][-a-z0-9]{0,62}$")]
    path: Annotated[StrictStr, Field(max_length=4000)] = ""
    bytes: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    node: Annotated[StrictStr, Field(max_length=200)] = ""
    action: ClassVar[Optional[Action]] = Action.REPORT


class Cancel(Request):
    workload_id: WorkloadId
    action: ClassVar[Optional[Action]] = Action.CANCEL
    audited: ClassVar[bool] = True


class Release(Request):
    workload_id: WorkloadId
    outcome: Outcome
    state: EndState = EndState.SUCCEEDED
    step: Optional[Step] = None
    detail: Text = ""
    action: ClassVar[Optional[Action]] = Action.RELEASE
    audited: ClassVar[bool] = True


class Report(Request):
    workload_id: WorkloadId
    kind: ReportKind
    note: Optional[Text] = None
    detail: Optional[Text] = None
    restart: Optional[StrictBool] = None
    mlflow_run_id: Optional[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = None
    mlflow_run_error: Optional[Text] = None  # the driver could not start the workload's MLflow run: why
    # The store of that run (default: the cluster's, ~/.raylane/mlflow.db): where the control plane closes a run
    # its driver left open (raylane.control.ends).
    mlflow_uri: Optional[Annotated[StrictStr, Field(pattern=r"^(sqlite:///|https?://)[^\x00-\x1f]{1,4000}$")]] = None
    job_id: Optional[JobId] = None
    step: Optional[Step] = None
    action: ClassVar[Optional[Action]] = Action.REPORT


class CheckpointSaved(Request):
    workload_id: WorkloadId
    path: Annotated[StrictStr, Field(min_length=1, max_length=4096)]
    metrics: Optional[Dict[StrictStr, Any]] = None
    action: ClassVar[Optional[Action]] = Action.REPORT


class RegisterWorkers(Request):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    workload_id: WorkloadId
    handles: Annotated[List[Any], Field(max_length=4096)]
    action: ClassVar[Optional[Action]] = Action.REPORT


class WorkloadCall(Request):
    workload_id: WorkloadId


class ShouldStop(WorkloadCall):
    action: ClassVar[Optional[Action]] = Action.REPORT


class ResolveCheckpoint(WorkloadCall):
    action: ClassVar[Optional[Action]] = Action.REPORT


class Status(WorkloadCall):
    """A workload's record: its whole record for its team, positions and reasons for others."""


class PipelineStatus(WorkloadCall):
    """A pipeline (``workload_id`` is its id): its stages with their states, plan, outputs and re-plans."""


class Explain(WorkloadCall):
    """Status plus the team's quota and, for its team, the journal."""


class WaitAdmission(WorkloadCall):
    """A workload's record once its reservation is ready, or after ``timeout_s``. Only its team and operators may
    wait on it (a waiter holds the caller's connection and a slot in the actor)."""

    timeout_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, allow_inf_nan=False)] = 5.0
    action: ClassVar[Optional[Action]] = Action.READ


class FindJob(Request):
    job_id: JobId


class Queue(Request):
    include_done: StrictBool = False
    action: ClassVar[Optional[Action]] = Action.QUEUE


class ClassInfo(Request):
    name: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


class Info(Request):
    pass


class WhoAmI(Request):
    pass


class Teams(Request):
    """Every team's quota per resource (nominal, borrowing and lending limits), what it uses now and how many of its
    workloads wait and run. Any caller may read it, as ``explain`` shows any workload's team quota."""


class Cohorts(Request):
    """The quota tree's cohorts (none for a flat policy), top-down: each one's parent, members and, per resource,
    its subtree's nominal quota, what its teams hold, what it borrows beyond its nominal, what lies idle and what
    of that it may lend. Any caller may read it, as ``teams``."""


class TokenCreate(Request):
    user: StrictStr
    teams: List[StrictStr] = Field(default_factory=list, max_length=64)
    role: StrictStr = "member"
    ttl_s: Optional[Annotated[float, Field(gt=0, le=366 * 86400, allow_inf_nan=False)]] = None
    note: Annotated[StrictStr, Field(max_length=200)] = ""
    action: ClassVar[Optional[Action]] = Action.TOKEN_ADMIN
    audited: ClassVar[bool] = True


class JobToken(Request):
    """A token for one Ray job, with the caller's own rights, that expires (``raylane submit`` makes one)."""

    ttl_s: Annotated[float, Field(gt=0, le=7 * 86400, allow_inf_nan=False)] = 86400.0
    note: Annotated[StrictStr, Field(max_length=200)] = ""
    # For a script's job (``raylane submit --script``): it submits each of the script's workloads (one per fit()).
    script: StrictBool = False
    audited: ClassVar[bool] = True


class TokenId(Request):
    token_id: Annotated[StrictStr, Field(pattern=r"^[a-z0-9]{12}$")]
    action: ClassVar[Optional[Action]] = Action.TOKEN_ADMIN
    audited: ClassVar[bool] = True


class TokenRotate(TokenId):
    pass


class TokenRevoke(TokenId):
    pass


class TokenList(Request):
    include_revoked: StrictBool = False
    action: ClassVar[Optional[Action]] = Action.TOKEN_ADMIN


class Audit(Request):
    since: Optional[Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]] = None
    user: Optional[Annotated[StrictStr, Field(max_length=64)]] = None
    team: Optional[Annotated[StrictStr, Field(max_length=64)]] = None
    limit: Annotated[StrictInt, Field(ge=1, le=100000)] = 1000
    action: ClassVar[Optional[Action]] = Action.AUDIT_READ


class CostGroup(str, enum.Enum):
    """What ``cost`` sums by (``raylane.cost.GROUPS``)."""

    WORKLOAD = "workload"
    SWEEP = "sweep"
    PIPELINE = "pipeline"
    TEAM = "team"
    CLASS = "class"


Timestamp = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]


class Cost(Request):
    """Spend in ``[since, until)`` (``raylane.cost``): per workload, sweep, pipeline, team and class (``by``: only
    that group), per node type, idle GPUs, and each team's month against its budget. Operators see every team;
    anyone else sees their own teams (``team``: one of them) and the cluster's idle cost. ``workload_ids``: only
    these workloads' leases; ``mlflow_run_id``: only those of the workloads that named this MLflow run (a driver
    asking what its run cost)."""

    since: Optional[Timestamp] = None
    until: Optional[Timestamp] = None
    team: Optional[Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]] = None
    by: Optional[CostGroup] = None
    workload_ids: Optional[Annotated[List[WorkloadId], Field(max_length=4096)]] = None
    mlflow_run_id: Optional[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]] = None
    action: ClassVar[Optional[Action]] = Action.COST_READ

    @field_validator("until")
    @classmethod
    def _after_since(cls, v, info):
        since = info.data.get("since")
        if v is not None and since is not None and v <= since:
            raise ValueError(f"a time after since ({since:g})")
        return v


class ReloadPolicy(Request):
    policy: Dict[StrictStr, Any]
    action: ClassVar[Optional[Action]] = Action.POLICY_RELOAD
    audited: ClassVar[bool] = True


class NodeList(Request):
    include_lost: StrictBool = False


class NodeAdmin(Request):
    """A node by its Ray node id (hex) or a unique prefix of it (6 characters or more)."""

    node: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{6,56}$")]
    reason: Annotated[StrictStr, Field(max_length=200)] = ""
    action: ClassVar[Optional[Action]] = Action.NODE_ADMIN
    audited: ClassVar[bool] = True

    def target(self) -> Optional[str]:
        return f"node {self.node}"


class NodeCordon(NodeAdmin):
    pass


class NodeUncordon(NodeAdmin):
    pass


class NodeDrain(NodeAdmin):
    pass


CALLS: Dict[str, Type[Request]] = {
    "submit": Submit, "cancel": Cancel, "release": Release, "report": Report, "checkpoint_saved": CheckpointSaved,
    "register_workers": RegisterWorkers, "should_stop": ShouldStop, "resolve_checkpoint": ResolveCheckpoint,
    "status": Status, "explain": Explain, "wait_admission": WaitAdmission, "find_job": FindJob, "queue": Queue,
    "class_info": ClassInfo, "info": Info, "whoami": WhoAmI, "teams": Teams, "cohorts": Cohorts,
    "token_create": TokenCreate, "job_token": JobToken,
    "token_rotate": TokenRotate, "token_revoke": TokenRevoke, "token_list": TokenList, "audit": Audit,
    "reload_policy": ReloadPolicy, "cost": Cost,
    "node_list": NodeList, "node_cordon": NodeCordon, "node_uncordon": NodeUncordon, "node_drain": NodeDrain,
    "pipeline_submit": PipelineSubmit, "pipeline_status": PipelineStatus, "pipeline_output": PipelineOutput,
}
CALL_NAMES: Dict[Type[Request], str] = {v: k for k, v in CALLS.items()}


def parse(call: Any, args: Any) -> Request:
    """The validated request for ``call(args)``; raises ``ValidationError`` naming the call or the field."""
    if not isinstance(call, str) or call not in CALLS:
        raise ValidationError("control-plane request", [("call", _short(call), f"one of {', '.join(sorted(CALLS))}")])
    return CALLS[call].parse(args)
