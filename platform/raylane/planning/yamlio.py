"""Pipeline and planning-cluster YAML files, loaded into the planning types (see docs/pipelines.md).

memory: a number of GB, or a string with a unit: "32Gi"/"32G"/"32GB" (all read as GB).
duration: a number of hours or "3h"/"90m", or a mapping node_type -> one of those (key "default" for the rest).
"""
import re
from pathlib import Path
from typing import Dict, List, Literal, Tuple, Union, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from raylane.errors import ValidationError as _ModelError

from .model import Network, Pipeline, Placement, Plan, PlanNode, Stage


class LoadError(ValueError):
    pass


def _err(path, field, value, allowed):
    return LoadError(f"{path}: {field}: got {value!r}; allowed: {allowed}")


def _gb(path, field, v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = re.fullmatch(r"\s*([0-9.]+)\s*(Gi|G|GB)?\s*", str(v))
    if not m:
        raise _err(path, field, v, "a number of GB or a string like 32Gi, 32G, 32GB")
    return float(m.group(1))


def _hours(path, field, v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = re.fullmatch(r"\s*([0-9.]+)\s*(h|m)\s*", str(v))
    if not m:
        raise _err(path, field, v, "a number of hours or a string like 3h, 90m")
    return float(m.group(1)) / (60 if m.group(2) == "m" else 1)


class _Stage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu: float
    memory: Union[float, str]
    gpu: float = 0
    features: List[str] = []
    duration: Union[float, str, Dict[str, Union[float, str]]]
    output: float = 0
    needs: List[str] = []


class _PipelineFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["pipeline"]
    name: str
    stages: Dict[str, _Stage]


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    node_type: str
    cpu: float
    memory: Union[float, str]
    gpu: float = 0
    features: List[str] = []
    storage_gbps: float = 0


class _Link(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: Tuple[str, str]
    bandwidth: float


class _NetworkSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: float
    links: List[_Link] = []


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: List[_Node]
    network: _NetworkSpec


def _read(path, model):
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise LoadError(f"{path}: cannot read: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        msgs = [f"{path}: {'.'.join(str(x) for x in d['loc']) or '(top)'}: got {d.get('input')!r}; "
                + (f"unknown field; allowed: {_fields(model, d['loc'][:-1])}" if d["type"] == "extra_forbidden"
                   else d["msg"]) for d in e.errors()]
        raise LoadError("\n".join(msgs)) from None


def _fields(model, loc) -> str:
    """The field names allowed at ``loc`` (a path through models, mappings and lists) in ``model``."""
    for key in loc:
        if isinstance(model, type) and issubclass(model, BaseModel):
            model = model.model_fields[key].annotation
        else:  # Dict[str, X] or List[X]: the key or index selects an X
            model = get_args(model)[-1]
    return ", ".join(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else "?"


def load_pipeline(path) -> Pipeline:
    f = _read(path, _PipelineFile)
    stages = []
    for name, s in f.stages.items():
        base = f"stages.{name}"
        if isinstance(s.duration, dict):
            per = {k: _hours(path, f"{base}.duration.{k}", v) for k, v in s.duration.items()}
            default = per.pop("default", None)
            if default is None:
                default = max(per.values()) if per else None
            if default is None:
                raise _err(path, f"{base}.duration", s.duration, "a mapping with at least one node type")
        else:
            per, default = {}, _hours(path, f"{base}.duration", s.duration)
        try:
            stages.append(Stage(name, cpu=s.cpu, memory_gb=_gb(path, f"{base}.memory", s.memory), gpu=s.gpu,
                                features=set(s.features), duration_h=default, output_gb=s.output,
                                needs=tuple(s.needs), durations_h=per))
        except (ValueError, _ModelError) as e:
            raise LoadError(f"{path}: {e}") from None
    try:
        return Pipeline(tuple(stages))
    except (ValueError, _ModelError) as e:
        raise LoadError(f"{path}: {e}") from None


def load_cluster(path) -> Tuple[List[PlanNode], Network]:
    f = _read(path, _ClusterFile)
    try:
        nodes = [PlanNode(n.name, n.node_type, cpu=n.cpu, memory_gb=_gb(path, f"nodes.{n.name}.memory", n.memory),
                          gpu=n.gpu, features=set(n.features), storage_gbps=n.storage_gbps) for n in f.nodes]
        net = Network(default_gb_per_h=f.network.default,
                      links={tuple(l.nodes): l.bandwidth for l in f.network.links}).with_storage(nodes)
    except (ValueError, _ModelError) as e:
        raise LoadError(f"{path}: {e}") from None
    return nodes, net


class _Placement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    start: float
    finish: float


class _PlanFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["plan"] = "plan"
    makespan: float
    planner: str = ""
    stages: Dict[str, _Placement]


def load_plan(path) -> Plan:
    """A plan file: ``stages: {T1: {node: gpu-1, start: 0, finish: 3}, ...}`` (hours), ``makespan`` (hours)."""
    f = _read(path, _PlanFile)
    return Plan(tuple(Placement(s, p.node, p.start, p.finish) for s, p in f.stages.items()), f.makespan,
                planner=f.planner)


def dump_plan(plan: Plan) -> str:
    data = {"kind": "plan", "planner": plan.planner, "makespan": plan.makespan_h,
            "stages": {p.stage: {"node": p.node, "start": p.start_h, "finish": p.finish_h} for p in plan.placements}}
    return yaml.safe_dump(data, sort_keys=False)
