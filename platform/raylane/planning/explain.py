"""Why a plan is what it is: per stage, why it went where it did, and the critical path that sets the makespan.

Pure functions of (pipeline, nodes, network, plan) for a plan the verifier accepts; transfers at ``Network.rate``
(the link, or a node's storage when slower: the text says which).

- Per stage (``StageWhy``): the features it needs and the nodes they exclude, the nodes too small to hold it; where
  each input comes from (read on the same node: no transfer; or G GB moved from N in H h); and, for every other node
  that can hold it, the earliest finish it would have there *given the rest of the plan* (the other stages stay where
  they are; its consumers are not moved), with what sets that finish (an input's transfer, waiting for room, a slower
  duration). A stage that starts later than its inputs and its node allowed is said to wait.
- The critical path (``Link``s, first to last): from the stage that finishes last, walk back to whatever set each
  start: the input whose arrival is that instant (``data``: same node; ``transfer``: moved), else a stage on the same
  node whose finish made room for it (``capacity``), else nothing (``start`` at 0 h, or ``idle``: it waited for no
  reason the plan shows).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from raylane.errors import ValidationError
from raylane.planning.model import EPS, RESOURCE_LABELS, Network, Pipeline, Plan, PlanNode, Stage
from raylane.planning.timeline import Timeline

TOL = 1e-6  # hours, as in the verifier


@dataclass(frozen=True)
class Input:
    stage: str  # the producer
    gb: float
    src: str  # the producer's node
    hours: float  # transfer time; 0 on the same node
    rate_gb_per_h: float  # 0 on the same node
    bottleneck: str  # "link", "storage of NODE", or "" on the same node

    def __str__(self) -> str:
        if not self.rate_gb_per_h:
            return f"{self.stage}'s {self.gb:g} GB read on {self.src}: no transfer"
        return f"{self.stage}'s {self.gb:g} GB moved from {self.src} in {self.hours:g} h ({_rate(self)})"


@dataclass(frozen=True)
class Alternative:
    node: str
    start_h: float
    finish_h: float
    reason: str  # what sets that finish


@dataclass(frozen=True)
class StageWhy:
    stage: str
    node: str
    start_h: float
    finish_h: float
    features: Tuple[str, ...]
    excluded: Tuple[Tuple[str, str], ...]  # (node, why it can never hold the stage)
    inputs: Tuple[Input, ...]
    earliest_start_h: float  # on its own node, given the rest of the plan
    alternatives: Tuple[Alternative, ...]  # every other node that can hold it, earliest finish first

    def lines(self) -> List[str]:
        out = [f"{self.stage} on {self.node} {self.start_h:g}-{self.finish_h:g} h"]
        if self.features:
            out.append(f"needs feature(s) {', '.join(self.features)}")
        for node, why in self.excluded:
            out.append(f"not {node}: {why}")
        out += [str(i) for i in self.inputs]
        if self.start_h > self.earliest_start_h + TOL:
            out.append(f"waits {self.start_h - self.earliest_start_h:g} h: its inputs and room on {self.node} "
                       f"allowed {self.earliest_start_h:g} h")
        for a in self.alternatives:
            d = a.finish_h - self.finish_h
            rel = "the same finish" if abs(d) <= TOL else f"{d:+g} h"
            out.append(f"on {a.node} it would finish at {a.finish_h:g} h ({rel}): {a.reason}")
        if not self.alternatives:
            out.append("no other node can hold it")
        return out


@dataclass(frozen=True)
class Link:
    """One stage of the critical path and what set its start (``after``: the stage before it on the path)."""

    stage: str
    node: str
    start_h: float
    finish_h: float
    after: str
    reason: str  # start, data, transfer, capacity, idle
    detail: str

    def __str__(self) -> str:
        head = f"{self.stage} on {self.node} {self.start_h:g}-{self.finish_h:g} h: "
        if self.reason == "start":
            return head + self.detail
        return head + (f"after {self.after} " if self.after else "") + f"[{self.reason}] {self.detail}"


@dataclass(frozen=True)
class Explanation:
    stages: Tuple[StageWhy, ...]
    critical_path: Tuple[Link, ...]
    makespan_h: float

    def render(self) -> str:
        lines = [f"critical path ({self.makespan_h:g} h):"] + [f"  {link}" for link in self.critical_path]
        lines.append("why each stage is where it is:")
        for why in self.stages:
            first, *rest = why.lines()
            lines += [f"  {first}"] + [f"    {x}" for x in rest]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"makespan_h": self.makespan_h, "critical_path": [asdict(x) for x in self.critical_path],
                "stages": {w.stage: {**asdict(w), "text": w.lines()[1:]} for w in self.stages}}


def _rate(i: Input) -> str:
    which = "the link" if i.bottleneck == "link" else f"{i.bottleneck} is the bottleneck"
    return f"{i.rate_gb_per_h:g} GB/h, {which}"


def _input(stages: Dict[str, Stage], network: Network, placed, producer: str, node: str) -> Input:
    src, gb = placed[producer].node, stages[producer].output_gb
    if src == node or gb <= 0:
        return Input(producer, gb, src, 0.0, 0.0, "")
    return Input(producer, gb, src, network.transfer_h(gb, src, node), network.rate(src, node),
                 network.bottleneck(src, node))


def _checked(pipeline: Pipeline, nodes: Sequence[PlanNode], plan: Plan):
    placed, known = plan.by_stage(), {n.name for n in nodes}
    bad = [(f"stages.{s.name}", placed[s.name].node if s.name in placed else None, "a placement on a known node")
           for s in pipeline.stages if s.name not in placed or placed[s.name].node not in known]
    if bad:
        raise ValidationError("plan to explain (verify it first)", bad)
    return placed


def _earliest(s: Stage, node: PlanNode, pipeline: Pipeline, placed, network: Network) -> Tuple[float, float, str]:
    """(start, ready, reason): the earliest start of ``s`` on ``node`` beside the other stages placed there, when its
    inputs arrive there, and what sets that start."""
    stages = {x.name: x for x in pipeline.stages}
    tl = Timeline(node)
    for name, pl in placed.items():
        if pl.node == node.name and name != s.name:
            tl.add(pl.start_h, pl.finish_h, stages[name].demand)
    inputs = [_input(stages, network, placed, p, node.name) for p in s.needs]
    arrivals = [(placed[i.stage].finish_h + i.hours, i) for i in inputs]
    ready = max((t for t, _ in arrivals), default=0.0)
    start = tl.earliest_start(ready, s.duration_on(node), s.demand)
    if start > ready + TOL:
        reason = f"waits for room until {start:g} h"
    elif arrivals and ready > TOL:
        t, i = max(arrivals, key=lambda a: a[0])
        reason = (f"{i.stage} finishes there at {t:g} h" if not i.rate_gb_per_h else
                  f"{i.stage}'s {i.gb:g} GB would take {i.hours:g} h to move ({_rate(i)})")
    else:
        reason = "it can start at 0 h"
    return start, ready, reason


def explain_stages(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network, plan: Plan) -> Tuple[StageWhy, ...]:
    network = network.with_storage(nodes)
    placed = _checked(pipeline, nodes, plan)
    stages = {s.name: s for s in pipeline.stages}
    out = []
    for s in pipeline.stages:
        pl = placed[s.name]
        here = next(n for n in nodes if n.name == pl.node)
        excluded = tuple((n.name, n.why_not(s)) for n in nodes if n.why_not(s))
        alts = []
        for n in nodes:
            if n.name == pl.node or n.why_not(s):
                continue
            start, _, reason = _earliest(s, n, pipeline, placed, network)
            dur = s.duration_on(n)
            if abs(dur - s.duration_on(here)) > TOL:
                reason += f"; it runs {dur:g} h on a {n.node_type} node ({s.duration_on(here):g} h on {pl.node})"
            alts.append(Alternative(n.name, start, start + dur, reason))
        alts.sort(key=lambda a: a.finish_h)
        inputs = tuple(_input(stages, network, placed, p, pl.node) for p in s.needs)
        out.append(StageWhy(s.name, pl.node, pl.start_h, pl.finish_h, tuple(sorted(s.features)), excluded, inputs,
                            _earliest(s, here, pipeline, placed, network)[0], tuple(alts)))
    return tuple(out)


def critical_path(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network, plan: Plan) -> Tuple[Link, ...]:
    network = network.with_storage(nodes)
    placed = _checked(pipeline, nodes, plan)
    stages = {s.name: s for s in pipeline.stages}
    by_node = {n.name: n for n in nodes}
    order = [s.name for s in pipeline.stages]
    current: Optional[str] = max(order, key=lambda n: (placed[n].finish_h, -order.index(n)))
    path: List[Link] = []
    while current:
        pl, s = placed[current], stages[current]
        link = None
        arrivals = sorted(((placed[p].finish_h + i.hours, i) for p in s.needs
                           for i in [_input(stages, network, placed, p, pl.node)]), key=lambda a: -a[0])
        for t, i in arrivals:
            if abs(t - pl.start_h) <= TOL:
                detail = (f"{i.stage}'s output is on {pl.node} (same node, no transfer)" if not i.rate_gb_per_h else
                          f"{i.stage}'s {i.gb:g} GB from {i.src} take {i.hours:g} h ({_rate(i)})")
                link = (i.stage, "transfer" if i.rate_gb_per_h else "data", detail)
                break
        if link is None and pl.start_h > TOL:
            link = _capacity_link(s, pl, by_node[pl.node], placed, stages, order)
        if link is None:
            ready = max((t for t, _ in arrivals), default=0.0)
            link = ("", "start", "starts at 0 h") if pl.start_h <= TOL else (
                "", "idle", f"starts at {pl.start_h:g} h; its inputs had arrived by {ready:g} h and nothing on "
                            f"{pl.node} kept it waiting")
        path.append(Link(current, pl.node, pl.start_h, pl.finish_h, *link))
        current = link[0]
    return tuple(reversed(path))


def _capacity_link(s: Stage, pl, node: PlanNode, placed, stages, order):
    """The stage on the same node whose finish at ``pl.start_h`` made room for ``s``: with it still running, ``s``
    would not have fit."""
    before = [n for n in order if n != s.name and placed[n].node == node.name
              and placed[n].start_h < pl.start_h - TOL and placed[n].finish_h > pl.start_h - TOL]
    freed = [n for n in before if abs(placed[n].finish_h - pl.start_h) <= TOL]
    for r, label in enumerate(RESOURCE_LABELS):
        used = s.demand[r] + sum(stages[n].demand[r] for n in before)
        if freed and used > node.capacity[r] + EPS:
            who = max(freed, key=lambda n: stages[n].demand[r])
            return (who, "capacity", f"{who} finished on {node.name} and freed {label} "
                                     f"{stages[who].demand[r]:g} ({used:g} needed, capacity {node.capacity[r]:g})")
    return None


def explain(pipeline: Pipeline, nodes: Sequence[PlanNode], network: Network, plan: Plan) -> Explanation:
    """Per-stage reasons and the critical path of a plan the verifier accepts."""
    return Explanation(explain_stages(pipeline, nodes, network, plan), critical_path(pipeline, nodes, network, plan),
                       max(p.finish_h for p in plan.placements))
