"""The ``kind: pipeline`` spec: stages with ``needs:``, each running a workload of any one-lease kind (train, eval,
batch, the user's own code), and how one is turned into stage workloads and into a planning problem.

This module owns the pipeline document's shape and its checks, the expansion of a pipeline into one workload spec per
stage (names, team, class, run metadata, stage references resolved), and the translation of a pipeline and the live
cluster into ``raylane.planning`` types. It imports no Ray. The control actor calls ``expand`` at submit and
``replan_problem`` when a stage overruns or a node is lost (``raylane.control.pipelines``); the pipeline driver
(``raylane.pipelines.driver``) checks the stages' code before submitting.

Stage references: inside a stage's ``workload.config``, a mapping ``{stage: NAME}`` is replaced by the directory
stage NAME writes its output to, and ``{stage: NAME, step: latest | N}`` by the checkpoint reference ``{workload:
<NAME's workload id>, step: ...}`` (kept safe from retention exactly like any ``init_from``). NAME must be a stage the
referring stage needs, directly or through other stages.

Durations: a stage's ``duration`` (or its workload's ``runtime_estimate``) is what the planner is told. A stage that
declares neither (``undeclared``) is planned with a runtime the caller predicts from history and hands to
``planning_problem`` (``predicted_s``): the control plane takes the median of its runtime model's prediction and
refuses the pipeline when there is no history to predict from; nothing here supplies a constant.

Output directories: ``<storage>/pipelines/<pipeline id>/<stage>``; a batch stage without ``config.output`` writes
there, a command stage finds it in ``RAYLANE_OUTPUT``; a training stage's output is its checkpoints.

The module lives in ``raylane.config`` beside the other specs, so that the control plane reads pipelines without
importing the pipeline driver.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pydantic import Field, field_validator, model_validator
from typing_extensions import Annotated, Literal

from raylane.config.fields import NAME_MAX, Allowed, Duration, Memory, Name, StrictModel, parse_duration, parse_memory
from raylane.config.models import RunMetadata, spec_workers
from raylane.errors import ValidationError
from raylane.planning import Network, Pipeline, PlanNode, Stage

__all__ = ["STAGE_KINDS", "PIPELINE_FIELDS", "PLANNERS", "DURATION_ESTIMATE", "StageSpec", "PipelineSpec",
           "load_pipeline_spec", "ancestors", "stage_ids", "output_dir", "expand", "declared", "undeclared",
           "estimate_s", "output_location",
           "H", "DONE_H", "demand", "planning_problem", "plan_nodes", "PIN", "replan_problem"]

#: The kinds a stage may run: one lease each, a run that ends.
STAGE_KINDS = ("train", "eval", "batch")
#: Fields of a stage's workload the pipeline sets: a stage may not set them itself.
PIPELINE_FIELDS = ("name", "team", "run", "pipeline")
PLANNERS = ("best", "heft", "olb", "cpsat")
DURATION_ESTIMATE = ("an estimated duration (90s, 10m, 2h, or seconds), or a mapping of node type to one (key "
                     "default for the other types)")


class StageSpec(StrictModel):
    """One stage: what it needs before it starts, what it runs and what the planner is told about it."""

    needs: List[Name] = Field(default_factory=list)
    # Node features the stage needs beyond its workload's gang.features (both are required of its node).
    features: List[Name] = Field(default_factory=list)
    # The estimated duration: one duration, or one per node type (key ``default`` for the rest). Default: the
    # workload's runtime_estimate; with neither, the control plane predicts it from past runs (module docstring).
    duration: Annotated[Any, Allowed(DURATION_ESTIMATE)] = None
    # The estimated size of what it writes, read by every stage that needs it (e.g. 20Gi).
    output: Memory = 0.0
    # The workload spec (kind train, eval or batch), without name, team and run: the pipeline gives those.
    workload: Dict[str, Any]

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, v):
        try:
            if v is None:
                return None
            if isinstance(v, Mapping):
                if not v or not all(isinstance(k, str) for k in v):
                    raise ValueError
                return {k: float(parse_duration(d)) for k, d in v.items()}
            return float(parse_duration(v))
        except (ValueError, TypeError):
            raise ValueError(DURATION_ESTIMATE) from None


class PipelineSpec(StrictModel):
    kind: Literal["pipeline"]
    name: Name
    team: Name
    # The class of every stage that names none.
    class_: Optional[Name] = Field(default=None, alias="class")
    run: RunMetadata
    # None: the policy's pipelines.planner.
    planner: Optional[Literal["best", "heft", "olb", "cpsat"]] = None
    stages: Annotated[Dict[Name, StageSpec], Field(min_length=1),
                      Allowed("a mapping of stage name to stage (at least one)")]

    @model_validator(mode="after")
    def _names_fit(self):
        long = [s for s in self.stages if len(self.name) + 1 + len(s) > NAME_MAX]
        if long:
            raise ValueError(f"pipeline name + '-' + stage name at most {NAME_MAX} characters (they name the stage "
                             f"workloads); too long: {', '.join(long)}")
        return self


def load_pipeline_spec(data: Any, source: str = "pipeline") -> PipelineSpec:
    """The spec's shape, its DAG (unknown ``needs``, cycles: named) and each stage's own rules, all errors at once."""
    from raylane.config.loader import validate_document

    spec: PipelineSpec = validate_document(PipelineSpec, data, source)
    errors: List[Tuple[str, Any, str]] = []
    for name, st in spec.stages.items():
        w = st.workload
        base = f"stages.{name}.workload"
        for f in PIPELINE_FIELDS:
            if f in w:
                errors.append((f"{base}.{f}", w[f], f"not set in a stage: the pipeline gives every stage its {f}"))
        for f in ("config", "gang"):
            if f in w and not isinstance(w[f], Mapping):
                errors.append((f"{base}.{f}", w[f], "a mapping"))
        g = w.get("gang")
        if isinstance(g, Mapping) and "features" in g and not (
                isinstance(g["features"], list) and all(isinstance(x, str) for x in g["features"])):
            errors.append((f"{base}.gang.features", g["features"], "a list of node feature names"))
        kind = w.get("kind", "train")
        if kind not in STAGE_KINDS:
            errors.append((f"{base}.kind", kind, f"one of {', '.join(STAGE_KINDS)} (a stage is one run that ends)"))
        if "class" not in w and spec.class_ is None:
            errors.append((f"{base}.class", None, "a class of the policy, here or as the pipeline's class"))
        if isinstance(w.get("config") or {}, Mapping):
            errors += _ref_errors(spec, name, w.get("config") or {}, f"{base}.config")
    try:
        Pipeline(tuple(Stage(n, cpu=0, memory_gb=0, duration_h=1, needs=tuple(st.needs))
                       for n, st in spec.stages.items()))
    except ValidationError as exc:
        errors += exc.errors
    if errors:
        raise ValidationError(source, errors)
    return spec


def ancestors(spec: PipelineSpec, stage: str) -> set:
    out, todo = set(), list(spec.stages[stage].needs)
    while todo:
        n = todo.pop()
        if n not in out and n in spec.stages:
            out.add(n)
            todo += spec.stages[n].needs
    return out


def _is_ref(v: Any) -> bool:
    return isinstance(v, Mapping) and "stage" in v and set(v) <= {"stage", "step"}


def _walk(value: Any, path: str):
    """(path, mapping) of every stage reference in a config value."""
    if _is_ref(value):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")


def _ref_errors(spec: PipelineSpec, stage: str, config: Any, path: str) -> List[Tuple[str, Any, str]]:
    before = ancestors(spec, stage) if set(spec.stages[stage].needs) <= set(spec.stages) else set()
    errors = []
    for where, ref in _walk(config, path):
        if not isinstance(ref["stage"], str) or ref["stage"] not in before:
            errors.append((f"{where}.stage", ref["stage"], "a stage this one needs, directly or through others: "
                                                            f"one of {', '.join(sorted(before)) or '(none)'}"))
        step = ref.get("step", "latest")
        if step != "latest" and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
            errors.append((f"{where}.step", step, "'latest' or a step number >= 1"))
    return errors


def stage_ids(pipeline_id: str, spec: PipelineSpec) -> Dict[str, str]:
    """Stage name -> its workload id: ``<pipeline id>-<stage>`` (the pipeline id is unique, so these are)."""
    return {s: f"{pipeline_id}-{s}" for s in spec.stages}


def output_dir(storage_path: str, pipeline_id: str, stage: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(storage_path)), "pipelines", pipeline_id, stage)


def _resolve(value: Any, ids: Mapping[str, str], outputs: Mapping[str, str]) -> Any:
    if _is_ref(value):
        if "step" in value:
            return {"workload": ids[value["stage"]], "step": value["step"]}
        return outputs[value["stage"]]
    if isinstance(value, Mapping):
        return {k: _resolve(v, ids, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, ids, outputs) for v in value]
    return value


def expand(spec: PipelineSpec, pipeline_id: str, storage_path: str,
           parent_run_id: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """One workload spec per stage (in the pipeline's order): name ``<pipeline>-<stage>``, the pipeline's team,
    run metadata and default class, the stage's features added to its gang, its estimate (if it declares one) as
    runtime_estimate,
    stage references resolved, a batch stage's output defaulting to its output directory, and ``pipeline:`` naming
    the pipeline, the stage and the pipeline's MLflow run."""
    ids = stage_ids(pipeline_id, spec)
    outputs = {s: output_dir(storage_path, pipeline_id, s) for s in spec.stages}
    run = spec.run.model_dump(exclude_none=True)
    out = {}
    for name, st in spec.stages.items():
        w = copy.deepcopy(st.workload)
        w["name"] = f"{spec.name}-{name}"
        w["team"] = spec.team
        w.setdefault("class", spec.class_)
        w.setdefault("kind", "train")
        w["run"] = {**run, "intent": f"{spec.run.intent} (stage {name} of pipeline {spec.name})"}
        gang = dict(w.get("gang") or {})
        if st.features:
            gang["features"] = sorted(set(gang.get("features") or []) | set(st.features))
        if gang:
            w["gang"] = gang
        if w.get("runtime_estimate") is None and st.duration is not None:
            w["runtime_estimate"] = estimate_s(st)
        config = _resolve(dict(w.get("config") or {}), ids, outputs)
        if w["kind"] == "batch" and "output" not in config:
            config["output"] = outputs[name]
        w["config"] = config
        w["pipeline"] = {"name": pipeline_id, "stage": name,
                         **({"parent_run_id": parent_run_id} if parent_run_id else {})}
        out[name] = w
    return out


def declared(st: StageSpec) -> bool:
    """Whether the stage states its duration (``duration`` or ``workload.runtime_estimate``)."""
    return st.duration is not None or st.workload.get("runtime_estimate") is not None


def undeclared(spec: PipelineSpec) -> List[str]:
    """The stages that state no duration, in the pipeline's order: their runtimes must be predicted."""
    return [name for name, st in spec.stages.items() if not declared(st)]


#: What a stage that states no duration is told where nothing predicted one (``raylane plan`` has no history).
NO_ESTIMATE = ("declare duration (90s, 10m, 2h) or workload.runtime_estimate: no prediction from past runs was given "
               "for this stage")


def estimate_s(st: StageSpec, node_type: Optional[str] = None) -> float:
    """The stage's declared estimated seconds (on ``node_type`` when it has an estimate for that type); a stage that
    declares none has no estimate here (``undeclared``: its caller predicts one)."""
    d = st.duration
    if d is None:
        if st.workload.get("runtime_estimate") is None:
            raise ValidationError("pipeline stage", [("duration", None, NO_ESTIMATE)])
        return float(parse_duration(st.workload["runtime_estimate"]))
    if isinstance(d, Mapping):
        if node_type is not None and node_type in d:
            return float(d[node_type])
        return float(d.get("default", max(d.values())))
    return float(d)


def output_location(kind: str, spec: Mapping[str, Any], checkpoints: Mapping[int, str]) -> str:
    """Where a finished stage's output is: a batch or command stage's ``config.output``, a training stage's latest
    checkpoint; "" when it wrote none (an evaluation's result is its metrics)."""
    if kind == "train":
        return checkpoints[max(checkpoints)] if checkpoints else ""
    return str((spec.get("config") or {}).get("output") or "")


# ------------------------------------------------------------------------------------------------ planning
H = 3600.0
#: A stage already finished, in a re-plan: it takes no time, but its output is still on its node.
DONE_H = 1e-6


def demand(w: Mapping[str, Any], fits) -> Tuple[float, float, float]:
    """(cpu, memory GB, gpu) the planner sees: the whole gang on one node, or one worker when ``fits`` says no node
    holds the whole gang (a gang that spans nodes is planned by where its first worker goes)."""
    g = w.get("gang") or {}
    r = g.get("resources") or {}
    per = (float(r.get("cpu", 0)), float(parse_memory(r.get("memory", 0))), float(r.get("gpu", 0)))
    n = spec_workers(g.get("workers", 1))
    total = tuple(x * n for x in per)
    return total if fits(total) else per


def planning_problem(spec: PipelineSpec, stage_specs: Mapping[str, Mapping[str, Any]], nodes: Sequence[PlanNode],
                     bandwidth_gb_per_h: float,
                     predicted_s: Optional[Mapping[str, float]] = None) -> Tuple[Pipeline, Network]:
    """The pipeline as the planner sees it on ``nodes`` (the live cluster's, ``plan_nodes``). ``predicted_s``: the
    seconds to plan each ``undeclared`` stage with; one missing is refused, naming every such stage."""
    def fits(d):
        return any(all(x <= c + 1e-9 for x, c in zip(d, n.capacity)) for n in nodes)

    predicted_s = predicted_s or {}
    missing = [s for s in undeclared(spec) if not predicted_s.get(s, 0) > 0]
    if missing:
        raise ValidationError(f"pipeline {spec.name}", [(f"stages.{s}.duration", None, NO_ESTIMATE) for s in missing])
    stages = []
    for name, st in spec.stages.items():
        w = stage_specs[name]
        cpu, mem, gpu = demand(w, fits)
        per_type = {n.node_type: estimate_s(st, n.node_type) / H for n in nodes
                    if isinstance(st.duration, Mapping) and n.node_type in st.duration}
        seconds = estimate_s(st) if declared(st) else float(predicted_s[name])
        stages.append(Stage(name, cpu=cpu, memory_gb=mem, gpu=gpu, duration_h=seconds / H,
                            features=frozenset((w.get("gang") or {}).get("features") or ()),
                            output_gb=float(st.output), needs=tuple(st.needs), durations_h=per_type))
    return Pipeline(tuple(stages)), Network(default_gb_per_h=bandwidth_gb_per_h)


def plan_nodes(nodes) -> List[PlanNode]:
    """The scheduling core's nodes (``raylane.scheduling.Node``) in service, as planning nodes named by node id."""
    return [PlanNode(n.id, n.node_type or "-", cpu=n.capacity.cpu, memory_gb=n.capacity.memory, gpu=n.capacity.gpu,
                     features=frozenset(n.features)) for n in nodes if n.schedulable]


PIN = "@node:"


def replan_problem(pipeline: Pipeline, nodes: Sequence[PlanNode], done: Mapping[str, Optional[str]],
                   running: Mapping[str, Tuple[str, float]]) -> Tuple[Pipeline, List[PlanNode]]:
    """The problem of re-planning what has not started: a finished stage takes no time on the node that holds its
    output (``done``: stage -> node, None if that node is gone: then its output is read from anywhere); a running
    stage holds its node for ``running[stage][1]`` more hours. Pinned by a feature only that node has."""
    pinned_nodes = [PlanNode(n.name, n.node_type, n.cpu, n.memory_gb, n.gpu, n.features | {PIN + n.name},
                             n.storage_gbps) for n in nodes]
    present = {n.name for n in nodes}
    stages = []
    for s in pipeline.stages:
        if s.name in done:
            node = done[s.name]
            feats = frozenset({PIN + node}) if node in present else frozenset()
            stages.append(Stage(s.name, cpu=0, memory_gb=0, duration_h=DONE_H, output_gb=s.output_gb, needs=(),
                                features=feats))
        elif s.name in running:
            node, left_h = running[s.name]
            stages.append(Stage(s.name, s.cpu, s.memory_gb, duration_h=max(left_h, DONE_H), gpu=s.gpu,
                                output_gb=s.output_gb, needs=(),
                                features=frozenset({PIN + node}) if node in present else s.features))
        else:
            stages.append(s)
    return Pipeline(tuple(stages)), pinned_nodes
