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
    ({"stages__eval__duration": None}, "stages.eval.duration", "an estimated duration"),
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
