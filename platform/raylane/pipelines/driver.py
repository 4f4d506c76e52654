"""The driver of one pipeline: ``python -m raylane.run pipeline.yaml`` (as a plain Ray job, or by ``raylane submit``).

1. Checks the spec whole before anything queues: its shape and DAG (``raylane.config.pipeline``), then every stage's
   workload and code as a single submission would be checked (``raylane.launchers.check``), each error named by
   stage.
2. Opens the pipeline's MLflow run (the parent of every stage's run) and submits the pipeline to the control actor,
   which plans it, journals it and holds each stage until its inputs are done.
3. Drives every stage with its kind's launcher, each in a thread of its own (a stage waits for its admission the
   way a single workload does, so stages that do not depend on each other run side by side); a stage that succeeds
   reports where its output is, how large, and on which node.
4. At the end writes the Gantt chart of the plan and of the actual run (``<storage>/pipelines/<id>/gantt.png``) and
   logs it, with the planned and actual makespans, to the pipeline's run.

``ray job stop`` (SIGTERM or SIGINT) cancels the pipeline: every stage not ended, and its driver's job.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Dict, Optional

from raylane.config import pipeline as ps
from raylane.control.records import TERMINAL, State
from raylane.errors import ValidationError
from raylane.ids import new_id


def check(data: Dict[str, Any], *, storage_path: str, working_dir: Optional[str] = None,
          load_code: bool = True) -> ps.PipelineSpec:
    """Every check a pipeline gets before it is submitted; ``ValidationError`` naming each stage's problems."""
    from raylane.launchers.check import check_spec_dict

    spec = ps.load_pipeline_spec(data, f"pipeline {data.get('name', '?') if isinstance(data, dict) else '?'}")
    errors = []
    for stage, s in ps.expand(spec, f"{spec.name}-check", storage_path).items():
        try:
            check_spec_dict(s, f"stage {stage}", working_dir=working_dir, load_code=load_code)
        except ValidationError as exc:
            errors += [(f"stages.{stage}.workload.{f}", v, a) for f, v, a in exc.errors]
    if errors:
        raise ValidationError(f"pipeline {spec.name}", errors)
    return spec


def run_pipeline(data: Dict[str, Any], *, storage_path: Optional[str] = None, tracking_uri: Optional[str] = None,
                 poll_s: float = 2.0, working_dir: Optional[str] = None) -> Dict[str, Any]:
    """Run a ``kind: pipeline`` spec to its end; returns the pipeline's final view (``ControlClient.pipeline``)."""
    import ray

    from raylane.launchers.train import DEFAULT_STORAGE
    from raylane.launchers.driver import connect_driver, init_ray, ray_job_id, say, threading_main
    from raylane.tracking import RunTracker

    storage = os.path.abspath(os.path.expanduser(storage_path or DEFAULT_STORAGE))
    spec = check(data, storage_path=storage, working_dir=working_dir)
    if not ray.is_initialized():
        init_ray()
    ctl, who = connect_driver()
    if who.get("auth"):  # MLflow records the caller as the owner, not what the spec claims
        data = {**data, "run": {**(data.get("run") or {}), "owner": who["user"]}}
    pid = new_id(spec.name, kind="pipeline")  # the control plane refuses one in use (ConflictError)
    tracker = RunTracker(workload_id=pid, spec=data, tracking_uri=tracking_uri, cost_of=ctl.run_cost)
    run_id = tracker.start()
    job_id = ray_job_id()
    try:
        view = ctl.pipeline_submit(data, pipeline_id=pid, storage_path=storage, parent_run_id=run_id, job_id=job_id)
    except BaseException:
        tracker.finish("FAILED")
        raise
    say(f"pipeline {pid} submitted: {len(view['stages'])} stages, planned makespan "
        f"{view['makespan_h'] * 60:.1f} min ({view['planner']}); MLflow run {run_id}")
    for st in view["stages"]:
        say(f"  {st['stage']}: {st['workload_id']} planned on {st['planned'].get('node', '?')[:12]} "
            f"at {st['planned'].get('start_h', 0) * 60:.1f}-{st['planned'].get('finish_h', 0) * 60:.1f} min")

    results: Dict[str, Any] = {}
    threads = []
    for st in view["stages"]:
        t = threading.Thread(target=_drive_stage, name=f"stage-{st['stage']}", daemon=True,
                             args=(ctl, pid, st["stage"], st["workload_id"], view["stage_specs"][st["stage"]],
                                   results),
                             kwargs=dict(job_id=job_id, storage=storage, tracking_uri=tracking_uri, poll_s=poll_s))
        t.start()
        threads.append(t)

    stopped = []

    def on_signal(signum, frame):  # `ray job stop`: the pipeline is cancelled
        stopped.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    if threading_main():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        say(f"job stopped ({stopped[0] if stopped else 'interrupted'}); cancelling pipeline {pid}")
        ctl.cancel(pid)
        tracker.finish("KILLED")
        raise SystemExit(130)
    final = _wait_end(ctl, pid)
    _finish(tracker, final, storage, spec)
    return final


def _drive_stage(ctl, pid, stage, wid, stage_spec, results, *, job_id, storage, tracking_uri, poll_s) -> None:
    from raylane.control.client import EndState, Outcome
    from raylane.launchers import launcher_for
    from raylane.launchers.driver import one_line, say

    try:
        rec = launcher_for(stage_spec.get("kind", "train"))(
            stage_spec, ctl=ctl, job_id=job_id, storage_path=storage, tracking_uri=tracking_uri, poll_s=poll_s,
            workload_id=wid)
    except BaseException as exc:  # noqa: BLE001 - a stage's crash fails that stage, not the driver
        say(f"stage {stage} ({wid}) failed in its driver: {one_line(exc)}")
        if not ctl.status(wid).terminal:
            ctl.release(wid, Outcome.FAILED, state=EndState.FAILED, detail=f"driver error: {one_line(exc)}")
        results[stage] = {"state": State.FAILED.value}
        return
    results[stage] = rec
    if rec["state"] != State.SUCCEEDED:
        return
    path = ps.output_location(stage_spec.get("kind", "train"), stage_spec, rec.get("checkpoints") or {})
    size = _size(path) if path else None
    node = next(iter(rec.get("placement") or ()), "")
    ctl.pipeline_output(pid, stage, path=path, size=size, node=node)
    say(f"stage {stage} succeeded; output {path or '(none)'}"
        + (f" ({size / 1e6:.2f} MB)" if size is not None else "") + (f" on node {node[:12]}" if node else ""))


def _size(path: str) -> Optional[int]:
    if not os.path.exists(path):
        return None
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
               if os.path.isfile(os.path.join(d, f)))


def _wait_end(ctl, pid: str, timeout: float = 30.0) -> Dict[str, Any]:
    """The pipeline's view once the control actor has ended it (its next tick after the last stage ended)."""
    deadline = time.time() + timeout
    while True:
        view = ctl.pipeline(pid)
        if view["state"] != State.RUNNING or time.time() > deadline:
            return view
        time.sleep(0.2)


def actual_plan(view: Dict[str, Any]):
    """The run as it happened, as a ``raylane.planning.Plan`` in hours from the pipeline's submission: each stage
    from its first admission to its end, on the node its (last) lease ran on. Stages that never ran are left out."""
    from raylane.planning import Placement, Plan, PlanStatus

    t0 = view["submitted_at"]
    out = []
    for st in view["stages"]:
        start, end = st.get("first_admitted_at"), st.get("ended_at")
        if start is None or end is None:
            continue
        node = next(iter(st.get("placement") or ()), st["planned"].get("node", "?"))
        out.append(Placement(st["stage"], node, (start - t0) / ps.H, (end - t0) / ps.H))
    return Plan(tuple(out), max((p.finish_h for p in out), default=0.0), planner="actual", status=PlanStatus.DRAFT)


def planned_plan(view: Dict[str, Any]):
    from raylane.planning import Placement, Plan, PlanStatus

    out = tuple(Placement(st["stage"], st["planned"]["node"], st["planned"]["start_h"], st["planned"]["finish_h"])
                for st in view["stages"] if st.get("planned"))
    return Plan(out, view["makespan_h"], planner=view["planner"], status=PlanStatus.HEURISTIC)


def node_labels(node_ids) -> Dict[str, str]:
    """Short, readable names for Ray node ids: ``<node type or 'node'>-<first 6 hex digits>``."""
    import ray

    types = {}
    try:
        for n in ray.nodes():
            types[n["NodeID"]] = (n.get("Labels") or {}).get("raylane.io/node-type") or "node"
    except Exception:  # noqa: BLE001 - labels are cosmetic
        pass
    return {nid: f"{types.get(nid, 'node')}-{nid[:6]}" for nid in node_ids}


def _renamed(plan, names):
    from dataclasses import replace

    return replace(plan, placements=tuple(replace(p, node=names.get(p.node, p.node)) for p in plan.placements))


def _finish(tracker, view: Dict[str, Any], storage: str, spec: ps.PipelineSpec) -> None:
    """Gantt chart (plan above, actual run below), makespans and the end state on the pipeline's MLflow run."""
    from raylane.planning import Pipeline, Stage
    from raylane.launchers.driver import say

    planned, actual = planned_plan(view), actual_plan(view)
    names = node_labels({p.node for p in planned.placements + actual.placements})
    # The durations the plan used: declared, or predicted at submit (the view's estimate_s).
    planned_s = {st["stage"]: st.get("estimate_s") for st in view["stages"]}
    pipeline = Pipeline(tuple(
        Stage(s, 0, 0, duration_h=(ps.estimate_s(st) if ps.declared(st) else planned_s[s]) / ps.H,
              output_gb=float(st.output), needs=tuple(st.needs)) for s, st in spec.stages.items()))
    path = os.path.join(storage, "pipelines", view["id"], "gantt.png")
    try:
        from raylane.planning.gantt import write_gantt

        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_gantt(path, pipeline, _renamed(planned, names), actual=_renamed(actual, names),
                    title=f"pipeline {view['id']}: plan and actual run")
        tracker.client.log_artifact(tracker.run_id, path, "gantt")
        say(f"Gantt chart of the plan and the run: {path}")
    except Exception as exc:  # noqa: BLE001 - a chart must not fail a finished pipeline
        say(f"could not write the Gantt chart: {exc}")
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = {"planned_makespan_min": view["makespan_h"] * 60, "actual_makespan_min": actual.makespan_h * 60,
               "replans": float(len(view["replans"]))}
    tracker.client.log_batch(tracker.run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
    tracker.set_tags({"raylane.pipeline.state": view["state"]})
    # Not ended when the wait gave up: the run failed.
    tracker.finish(view["state"] if view["state"] in TERMINAL else State.FAILED.value)
    say(f"pipeline {view['id']}: {view['state']}; planned {view['makespan_h'] * 60:.1f} min, actual "
        f"{actual.makespan_h * 60:.1f} min, re-planned {len(view['replans'])}x")
