"""The pipeline spec and the control plane's pipeline decisions, without Ray (raylane.config.pipeline,
raylane.control.pipelines): every refusal named; stage references resolved; stages gated on their inputs; preferred
nodes; end states; overruns; the re-plan problem with finished and running stages fixed where they ran."""
from __future__ import annotations

import copy

import pytest
import yaml

from raylane.control.journal import Entry
from raylane.control.pipelines import PipelineBook, end_state, gate, overrunning, preferred_nodes
from raylane.errors import ValidationError
from raylane.config import pipeline as ps
from raylane.planning import PLANNERS, Network, PlanNode, verify
from tests.raytest import REPO

EXAMPLE = yaml.safe_load((REPO / "examples" / "pipelines" / "lm-lifecycle.yaml").read_text())


def errors_of(data) -> dict:
    with pytest.raises(ValidationError) as info:
        ps.load_pipeline_spec(data)
    return {path: allowed for path, _, allowed in info.value.errors}


def with_(**changes):
    d = copy.deepcopy(EXAMPLE)
    for path, value in changes.items():
        *head, last = path.split("__")
        node = d
        for k in head:
            node = node[k]
        node[last] = value
    return d


def test_the_example_loads_and_expands_with_references_resolved():
    spec = ps.load_pipeline_spec(EXAMPLE)
    out = ps.expand(spec, "lm-lifecycle-abc123", "/data", parent_run_id="r1")
    assert list(out) == ["prep", "pretrain", "finetune", "eval"]
    pre = out["pretrain"]
    assert pre["name"] == "lm-lifecycle-pretrain" and pre["team"] == "team-a" and pre["class"] == "pretrain"
    assert pre["config"]["corpus"]["path"] == "/data/pipelines/lm-lifecycle-abc123/prep"
    assert pre["gang"]["features"] == ["nvlink"] and pre["runtime_estimate"] == 120
    assert out["finetune"]["config"]["init_from"] == {"workload": "lm-lifecycle-abc123-pretrain", "step": "latest"}
    assert out["eval"]["config"]["checkpoint"] == {"workload": "lm-lifecycle-abc123-finetune", "step": "latest"}
    # A batch stage writes to its output directory unless it names one.
    assert out["prep"]["config"]["output"] == "/data/pipelines/lm-lifecycle-abc123/prep"
    assert out["prep"]["pipeline"] == {"name": "lm-lifecycle-abc123", "stage": "prep", "parent_run_id": "r1"}
    assert "stage finetune of pipeline lm-lifecycle" in out["finetune"]["run"]["intent"]


@pytest.mark.parametrize("changes,field,says", [
    ({"stages__pretrain__needs": ["nope"]}, "stages.pretrain.needs", "one of: eval, finetune, prep, pretrain"),
    ({"stages__prep__needs": ["eval"]}, "stages.needs", "an acyclic graph"),
    ({"stages__eval__workload__kind": "serve"}, "stages.eval.workload.kind", "one of train, eval, batch"),
    ({"stages__eval__workload__team": "team-b"}, "stages.eval.workload.team", "the pipeline gives every stage"),
    ({"stages__eval__workload__config": {"checkpoint": {"stage": "eval", "step": "latest"}}},
     "stages.eval.workload.config.checkpoint.stage", "a stage this one needs"),
    ({"stages__finetune__workload__config": {"init_from": {"stage": "pretrain", "step": 0}}},
     "stages.finetune.workload.config.init_from.step", "'latest' or a step number"),
    ({"stages__pretrain__duration": "soon"}, "stages.pretrain.duration", "an estimated duration (90s"),
    ({"stages__pretrain__duration": {"local": "x"}}, "stages.pretrain.duration", "a mapping of node type"),
])
def test_bad_pipelines_are_refused_with_the_field_named(changes, field, says):
    got = errors_of(with_(**changes))
    assert field in got, got
    assert says in got[field]


def test_a_stage_without_a_class_needs_the_pipelines_and_names_must_fit():
    d = with_()
    del d["class"]
    assert "stages.pretrain.workload.class" in errors_of(d)
    d = with_(name="p" * 60)
    assert any("at most 63" in a for a in errors_of(d).values())


# ------------------------------------------------------------------------------------------------ the book
def book_with(needs, plan=None, outputs=None):
    b = PipelineBook()
    stages = {s: f"p-{s}" for s in needs}
    b.apply(Entry(1, 100.0, "pipeline", "p", {
        "event": "submitted", "spec": {"team": "t", "name": "p"}, "stages": stages, "needs": needs,
        "plan": plan or {}, "makespan_h": 1.0, "estimates_s": {s: 60 for s in needs},
        "output_gb": outputs or {}}))
    return b, b.runs["p"]


def test_a_stage_waits_for_every_input_and_never_runs_after_a_failed_one():
    b, run = book_with({"a": [], "b": [], "c": ["a", "b"]})
    assert gate(run, "a", {}) == ("ready", "")
    assert gate(run, "c", {"p-a": "SUCCEEDED", "p-b": "RUNNING"}) == ("wait", "waiting for its inputs: b (running)")
    assert gate(run, "c", {"p-a": "SUCCEEDED", "p-b": "SUCCEEDED"}) == ("ready", "")
    assert gate(run, "c", {"p-a": "FAILED", "p-b": "RUNNING"}) == ("never", "input stage a ended FAILED")
    assert b.stage_of("p-c") == (run, "c") and b.stage_of("other") is None


def test_end_states():
    _, run = book_with({"a": [], "b": ["a"]})
    assert end_state(run, {"p-a": "SUCCEEDED", "p-b": "RUNNING"}) is None
    assert end_state(run, {"p-a": "SUCCEEDED", "p-b": "SUCCEEDED"}) == "SUCCEEDED"
    assert end_state(run, {"p-a": "FAILED", "p-b": "FAILED"}) == "FAILED"
    assert end_state(run, {"p-a": "SUCCEEDED", "p-b": "CANCELLED"}) == "CANCELLED"


def test_preferred_nodes_are_the_plan_then_the_inputs_largest_first():
    _, run = book_with({"a": [], "b": [], "c": ["a", "b"]}, plan={"c": {"node": "n3"}},
                       outputs={"a": 1.0, "b": 20.0})
    run.outputs["a"] = {"node": "n1"}
    assert preferred_nodes(run, "c", {"p-b": ("n2",)}) == ("n3", "n2", "n1")
    assert preferred_nodes(run, "a", {}) == ()


def test_an_overrun_is_reported_once():
    b, run = book_with({"a": [], "b": ["a"]})
    assert overrunning(run, {"a": 0.0}, now=100.0, factor=2.0) == []  # 100 s of an estimated 60: not 2x yet
    assert overrunning(run, {"a": 0.0}, now=121.0, factor=2.0) == ["a"]
    b.apply(Entry(2, 121.0, "pipeline", "p", {"event": "replanned", "plan": {"b": {"node": "n1"}},
                                              "overrun": ["a"], "reason": "x"}))
    assert overrunning(run, {"a": 0.0}, now=500.0, factor=2.0) == []
    assert run.plan["b"]["node"] == "n1" and run.replans[0]["overrun"] == ["a"]


# ---------------------------------------------------------------------------------------------- re-planning
def test_the_replan_problem_fixes_finished_and_running_stages_where_they_ran():
    from raylane.planning import Pipeline, Stage

    pipe = Pipeline((Stage("a", 1, 1, 1.0, output_gb=10), Stage("b", 1, 1, 2.0, needs=("a",)),
                     Stage("c", 2, 1, 1.0, needs=("a",), output_gb=5), Stage("d", 1, 1, 1.0, needs=("b", "c"))))
    nodes = [PlanNode("n1", "x", 2, 8), PlanNode("n2", "x", 2, 8)]
    net = Network(default_gb_per_h=10)
    reduced, pinned = ps.replan_problem(pipe, nodes, done={"a": "n2"}, running={"b": ("n1", 0.5)})
    plan = PLANNERS.get("heft").plan(reduced, pinned, net)
    assert verify(reduced, pinned, net, plan).ok
    got = plan.by_stage()
    assert got["a"].node == "n2" and got["a"].finish_h < 1e-3  # done: no time, its output on n2
    assert got["b"].node == "n1" and got["b"].finish_h == pytest.approx(0.5)  # running: the rest of its run
    # c reads a's 10 GB: on n2 it needs no transfer (1 h on n1 would wait for it).
    assert got["c"].node == "n2" and got["c"].start_h == pytest.approx(got["a"].finish_h)
    # A finished stage whose node is gone is read from anywhere: not pinned.
    reduced, _ = ps.replan_problem(pipe, nodes[:1], done={"a": "n2"}, running={})
    assert reduced.stage("a").features == frozenset()


def test_fuzzed_pipelines_get_an_error_naming_where_never_a_traceback(tmp_path):
    """300 seeded mutations of the example through every check `raylane spec check` and `raylane submit` run."""
    import random

    from raylane.errors import FatalError
    from raylane.pipelines.driver import check

    rnd = random.Random(13)
    values = [None, 0, -1, 1.5, "", "x", "soon", [], {}, [1, "a"], {"stage": "prep"}, {"stage": "nope", "step": 0},
              {"a": {"b": []}}, True, "9" * 400]

    def paths(node, prefix=()):
        yield prefix
        if isinstance(node, dict):
            for k, v in node.items():
                yield from paths(v, prefix + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from paths(v, prefix + (i,))

    for _ in range(300):
        d = copy.deepcopy(EXAMPLE)
        for _ in range(rnd.randint(1, 3)):
            where = rnd.choice([p for p in paths(d) if p])
            node = d
            for k in where[:-1]:
                node = node[k]
            node[where[-1]] = copy.deepcopy(rnd.choice(values))
        try:
            check(d, storage_path=str(tmp_path), load_code=False)
        except FatalError as exc:
            assert str(exc).strip()


# ------------------------------------------------------------------------------------- predicted durations
def undeclared_eval():
    """The example with its eval stage stating no duration (no ``duration``, no ``workload.runtime_estimate``)."""
    d = with_()
    del d["stages"]["eval"]["duration"]
    return d


def test_a_stage_may_state_no_duration_and_is_planned_only_with_a_prediction():
    spec = ps.load_pipeline_spec(undeclared_eval())  # accepted: the control plane predicts it
    assert ps.undeclared(spec) == ["eval"] and ps.declared(spec.stages["prep"])
    specs = ps.expand(spec, "p-1", "/data")
    assert "runtime_estimate" not in specs["eval"]  # not taught to the runtime model as a user's estimate
    assert specs["prep"]["runtime_estimate"] == 30
    nodes = [PlanNode("n1", "x", cpu=8, memory_gb=32, gpu=4, features={"ssd", "nvlink"})]
    # Without a prediction: refused, naming the stage and what to declare (never a silent constant).
    with pytest.raises(ValidationError) as info:
        ps.planning_problem(spec, specs, nodes, 3600.0)
    assert [(f, v) for f, v, _ in info.value.errors] == [("stages.eval.duration", None)]
    assert info.value.errors[0][2].startswith("declare duration") and "no prediction" in info.value.errors[0][2]
    problem, _ = ps.planning_problem(spec, specs, nodes, 3600.0, predicted_s={"eval": 900.0})
    assert problem.stage("eval").duration_h == pytest.approx(0.25)
    assert problem.stage("prep").duration_h == pytest.approx(30 / 3600)
    # A workload.runtime_estimate states it as well as a duration does.
    d = undeclared_eval()
    d["stages"]["eval"]["workload"]["runtime_estimate"] = "5m"
    assert ps.undeclared(ps.load_pipeline_spec(d)) == []


@pytest.fixture
def harness(tmp_path):
    from tests.controltest import Harness
    from tests.raytest import local_policy

    h = Harness(str(tmp_path / "journal.db"), local_policy())
    yield h
    h.close()


def submit_pipeline(h, data, pid, tmp_path):
    return h.call("pipeline_submit", spec=data, pipeline_id=pid, storage_path=str(tmp_path))


def test_without_history_a_stage_stating_no_duration_refuses_the_pipeline_naming_it(harness, tmp_path):
    with pytest.raises(ValidationError) as info:
        submit_pipeline(harness, undeclared_eval(), "lm-1", tmp_path)
    assert [(f, v) for f, v, _ in info.value.errors] == [("stages.eval.duration", None)]
    assert info.value.errors[0][2].startswith("declare duration") and "to predict one from" in info.value.errors[0][2]
    assert "lm-1" not in harness.cs.pipes.runs and not any(w.startswith("lm-1-") for w in harness.cs.records)


def test_a_stage_stating_no_duration_is_planned_with_the_median_of_its_prediction_and_the_plan_says_so(
        harness, tmp_path):
    from raylane.runtimes import RunFeatures

    # History: three finished eval runs of 8, 10 and 30 minutes (the class level: no run of this stage yet).
    for minutes in (8, 10, 30):
        harness.cs.runtimes.model.observe(RunFeatures(team="team-b", cls="eval", gpus=1, workers=1), minutes * 60.0)
    view = submit_pipeline(harness, undeclared_eval(), "lm-2", tmp_path)
    stages = {s["stage"]: s for s in view["stages"]}
    assert stages["eval"]["estimate_s"] == 600.0 and stages["eval"]["estimate"] == "predicted"
    assert stages["prep"]["estimate_s"] == 30.0 and stages["prep"]["estimate"] == "declared"
    planned = stages["eval"]["planned"]
    assert planned["finish_h"] - planned["start_h"] == pytest.approx(600 / 3600)
    assert view["makespan_h"] == pytest.approx(planned["finish_h"])
    assert "durations predicted from past runs: eval 10m (3 runs of class eval: median 10m)" in view["planner"]
    submitted = next(d for k, d in harness.journal("lm-2") if d.get("event") == "submitted")
    assert submitted["predicted"] == {"eval": {"seconds": 600.0, "basis": "3 runs of class eval: median 10m"}}
    # The stage's workload carries no runtime_estimate: it is queued with its own prediction, like any workload.
    assert "runtime_estimate" not in harness.record("lm-2-eval").spec
    # After a restart the pipeline is what the journal says, prediction and explanation included.
    harness.restart()
    again = harness.call("pipeline_status", workload_id="lm-2")
    assert again["planner"] == view["planner"]
    assert {s["stage"]: s["estimate_s"] for s in again["stages"]}["eval"] == 600.0
