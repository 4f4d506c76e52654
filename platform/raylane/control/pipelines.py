"""The control plane's pipelines: what it remembers of each, rebuilt from the journal, and the decisions it takes on
them. Pure: no Ray; the control actor journals what these return and acts on it.

A pipeline (``raylane.config.pipeline``) is submitted whole: every stage becomes a workload record at once, held out
of the queue until each stage it needs has succeeded (then queued under the team's quota like any workload); a stage
whose input failed or was cancelled fails without running. The plan (stage -> node) made at submit is each stage's
first preference when it is placed, then the nodes that hold its inputs. A stage that runs much longer than its
estimate, or a node lost under the pipeline, makes the control plane re-plan the stages that have not started.

Journal entries: kind ``pipeline``, workload id the pipeline's id, ``event`` one of ``submitted`` (spec, stage ids,
plan, ...), ``output`` (a finished stage's output location and size, from the driver), ``replanned`` (the new plan
and why) and ``finished`` (its end state).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from raylane.control.journal import Entry
from raylane.control.records import TERMINAL, State


@dataclass
class PipelineRun:
    id: str
    spec: Dict[str, Any]
    stages: Dict[str, str]  # stage -> workload id
    needs: Dict[str, List[str]]  # stage -> stages it needs
    plan: Dict[str, Dict[str, Any]]  # stage -> {node, start_h, finish_h}
    makespan_h: float
    planner: str
    submitted_at: float
    owner: str = ""
    job_id: Optional[str] = None
    parent_run_id: Optional[str] = None
    storage: str = ""
    state: str = State.RUNNING.value  # a State's value (replies carry it as it is): RUNNING, then its end state
    ended_at: Optional[float] = None
    outputs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    replans: List[Dict[str, Any]] = field(default_factory=list)
    estimates_s: Dict[str, float] = field(default_factory=dict)
    output_gb: Dict[str, float] = field(default_factory=dict)

    @property
    def team(self) -> str:
        return self.spec.get("team", "")

    @property
    def name(self) -> str:
        return self.spec.get("name", "")

    @property
    def terminal(self) -> bool:
        return self.state != State.RUNNING


class PipelineBook:
    """Every pipeline the journal holds. Only ``apply`` changes it (live and on recovery alike)."""

    def __init__(self):
        self.runs: Dict[str, PipelineRun] = {}
        self._of: Dict[str, Tuple[str, str]] = {}  # workload id -> (pipeline id, stage)

    def apply(self, e: Entry) -> None:
        d = e.data
        ev = d.get("event")
        if ev == "submitted":
            run = PipelineRun(e.workload_id, d["spec"], dict(d["stages"]), {k: list(v) for k, v in d["needs"].items()},
                              dict(d["plan"]), float(d["makespan_h"]), d.get("planner", ""), e.ts,
                              owner=d.get("owner", ""), job_id=d.get("job_id"), parent_run_id=d.get("parent_run_id"),
                              storage=d.get("storage", ""), estimates_s=dict(d.get("estimates_s") or {}),
                              output_gb=dict(d.get("output_gb") or {}))
            self.runs[run.id] = run
            for stage, wid in run.stages.items():
                self._of[wid] = (run.id, stage)
            return
        run = self.runs.get(e.workload_id)
        if run is None:
            return
        if ev == "output":
            run.outputs[d["stage"]] = {"path": d.get("path", ""), "bytes": d.get("bytes"), "node": d.get("node", "")}
        elif ev == "replanned":
            run.plan.update(d["plan"])
            run.makespan_h = float(d.get("makespan_h", run.makespan_h))
            run.replans.append({"ts": e.ts, "reason": d.get("reason", ""), "plan": d["plan"],
                                "makespan_h": d.get("makespan_h"), "overrun": list(d.get("overrun") or ())})
        elif ev == "finished":
            run.state, run.ended_at = State(d["state"]).value, e.ts

    def stage_of(self, wid: str) -> Optional[Tuple[PipelineRun, str]]:
        got = self._of.get(wid)
        return (self.runs[got[0]], got[1]) if got else None

    def active(self) -> List[PipelineRun]:
        return [r for r in self.runs.values() if not r.terminal]


def gate(run: PipelineRun, stage: str, states: Mapping[str, str]) -> Tuple[str, str]:
    """May ``stage`` queue now? (``ready`` | ``wait`` | ``never``, why). ``states``: workload id -> record state (its
    value)."""
    needs = run.needs.get(stage, [])
    got = {n: states.get(run.stages[n], "?") for n in needs}
    bad = {n: s for n, s in got.items() if s in TERMINAL and s != State.SUCCEEDED}
    if bad:
        return "never", "input stage " + ", ".join(f"{n} ended {s}" for n, s in sorted(bad.items()))
    waiting = {n: s for n, s in got.items() if s != State.SUCCEEDED}
    if waiting:
        return "wait", "waiting for its inputs: " + ", ".join(f"{n} ({s.lower()})" for n, s in waiting.items())
    return "ready", ""


def preferred_nodes(run: PipelineRun, stage: str, placements: Mapping[str, Tuple[str, ...]]) -> Tuple[str, ...]:
    """Where ``stage`` should go, best first: its planned node, then the nodes that ran its inputs, largest output
    first (``placements``: workload id -> the nodes its last lease ran on)."""
    out: List[str] = []
    planned = (run.plan.get(stage) or {}).get("node")
    if planned:
        out.append(planned)
    inputs = sorted(run.needs.get(stage, []), key=lambda n: -run.output_gb.get(n, 0.0))
    for n in inputs:
        node = (run.outputs.get(n) or {}).get("node") or next(iter(placements.get(run.stages[n]) or ()), None)
        if node and node not in out:
            out.append(node)
    return tuple(out)


def end_state(run: PipelineRun, states: Mapping[str, str]) -> Optional[State]:
    """The pipeline's end state once every stage has ended (SUCCEEDED, CANCELLED if any stage was, else FAILED);
    None while one has not. ``states``: workload id -> record state (its value)."""
    got = [states.get(w, "?") for w in run.stages.values()]
    if any(s not in TERMINAL for s in got):
        return None
    if all(s == State.SUCCEEDED for s in got):
        return State.SUCCEEDED
    return State.CANCELLED if State.CANCELLED in got else State.FAILED


def overrunning(run: PipelineRun, running_since: Mapping[str, float], now: float, factor: float) -> List[str]:
    """Stages running longer than ``factor`` times their estimate and not re-planned for yet (``running_since``:
    stage -> when its current run started)."""
    seen = {s for r in run.replans for s in r.get("overrun", ())}
    return [s for s, t0 in running_since.items()
            if s not in seen and now - t0 > factor * run.estimates_s.get(s, float("inf"))]
