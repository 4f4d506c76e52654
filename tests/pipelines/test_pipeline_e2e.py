"""Pipelines on a real local Ray cluster (raylane.pipelines; docs/pipelines.md, "Running a pipeline on Ray").

One cluster for the module: a CPU head and two nodes of 2 logical GPUs, one tagged nvlink and one ssd (the embedded
cluster's shape). The control actor runs with authentication on, as `raylane up` starts it.

- The lifecycle example (prepare a corpus -> pretrain on it -> fine-tune from its checkpoint -> evaluate) runs end to
  end as one Ray job: stages in dependency order on the nodes their features name, each output recorded and handed
  on, one MLflow parent run with a child per stage, the queue showing the pipeline with its stages, and the Gantt
  chart of plan and run written and logged.
- Stages wait for their inputs with a reason; cancelling a pipeline cancels every stage; a stage that could never
  run refuses the whole pipeline at submit, named; a stage that runs over its estimate re-plans what has not started.
"""
from __future__ import annotations

import os

import pytest
import yaml

from tests.raytest import REPO, wait_for

pytestmark = pytest.mark.ray

NODES = (("gpu-a", ["gpu-sim", "nvlink"]), ("gpu-b", ["gpu-sim", "ssd"]))
EXAMPLE = REPO / "examples" / "pipelines" / "lm-lifecycle.yaml"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from tests.jobtest import local_policy, start_env, stop_env

    env = start_env(tmp_path_factory.mktemp("pipelines"), policy=local_policy(pretrain={"min_runtime": 0}),
                    gpu_nodes=NODES, gpus=2, cpus=4)
    try:
        yield env
    finally:
        stop_env(env)


@pytest.fixture(autouse=True)
def _logs(request, env):
    from tests.jobtest import print_job_logs_on_failure

    yield
    print_job_logs_on_failure(request, env)


def node_with(feature: str) -> str:
    import ray

    return next(n["NodeID"] for n in ray.nodes() if n["Alive"]
                and (n.get("Labels") or {}).get(f"feature.raylane.io/{feature}") == "true")


def small(spec: dict) -> dict:
    """The example, shorter: fewer steps and bytes (the same stages, features and references)."""
    st = spec["stages"]
    st["prep"]["workload"]["config"]["max_bytes"] = 60000
    st["pretrain"]["workload"]["config"].update(max_steps=10, checkpoint_every=10,
                                                corpus={"path": {"stage": "prep"}, "max_bytes": 60000})
    st["finetune"]["workload"]["config"].update(max_steps=6, checkpoint_every=6,
                                                corpus={"subdir": "json", "max_bytes": 40000})
    st["eval"]["workload"]["config"].update(batches=2, corpus={"subdir": "json", "max_bytes": 40000})
    return spec


@pytest.mark.slow
@pytest.mark.e2e
def test_the_lifecycle_pipeline_runs_end_to_end_with_features_outputs_runs_and_gantt(env):
    from tests.jobtest import finished, submit_job
    from raylane.tracking import client_for

    spec = small(yaml.safe_load(EXAMPLE.read_text()))
    job = submit_job(env, spec, "lm-lifecycle")
    ctl = env["ctl"]
    pid = wait_for(lambda: (ctl.find_job(job) or {}).get("id"), timeout=120, what="the pipeline to register")
    # While the first stage runs, the others wait for their inputs, and the queue lists them under the pipeline.
    rows = ctl.queue(include_done=True)
    mine = [r for r in rows if r.get("pipeline") == pid]
    assert {r["stage"] for r in mine} == {"prep", "pretrain", "finetune", "eval"}
    assert any(r["id"] == pid and r["kind"] == "pipeline" for r in rows)

    status = finished(env, job, timeout=600)
    assert str(status).endswith("SUCCEEDED"), env["client"].get_job_logs(job)[-3000:]
    view = ctl.pipeline(pid)
    assert view["state"] == "SUCCEEDED"
    st = {s["stage"]: s for s in view["stages"]}
    assert all(s["state"] == "SUCCEEDED" for s in st.values())
    # Dependency order: no stage was admitted before every stage it needs had ended.
    for s in st.values():
        for n in s["needs"]:
            assert s["first_admitted_at"] >= st[n]["ended_at"], (s["stage"], n)
    # Node features: prep on the ssd node, pretrain on the nvlink node; the plan said so too.
    assert st["prep"]["placement"] == [node_with("ssd")] and st["prep"]["planned"]["node"] == node_with("ssd")
    assert set(st["pretrain"]["placement"]) == {node_with("nvlink")}
    # Outputs: where, how large, on which node; prep's directory is what pretrain trained on.
    prep_out = st["prep"]["output"]
    assert prep_out["path"].endswith(f"pipelines/{pid}/prep") and prep_out["bytes"] > 50000
    assert prep_out["node"] == node_with("ssd")
    assert sorted(os.listdir(prep_out["path"]))[0] == "_manifest.json"
    assert "checkpoint" in st["pretrain"]["output"]["path"] and st["pretrain"]["output"]["bytes"] > 0
    # MLflow: one parent run for the pipeline, each stage's run its child; the eval's metrics in its run.
    client = client_for(env["uri"])
    exps = [e.experiment_id for e in client.search_experiments()]
    parent = client.search_runs(exps, f"tags.`raylane.workload_id` = '{pid}'")
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    children = client.search_runs(exps, f"tags.`mlflow.parentRunId` = '{parent[0].info.run_id}'")
    assert sorted(r.data.tags["raylane.pipeline.stage"] for r in children) == ["eval", "finetune", "prep",
                                                                               "pretrain"]
    ev = next(r for r in children if r.data.tags["raylane.pipeline.stage"] == "eval")
    assert ev.data.metrics["val_loss"] > 0
    assert parent[0].data.metrics["actual_makespan_min"] > 0
    # The Gantt chart of the plan and the run, written and logged with the parent run.
    gantt = os.path.join(env["storage"], "pipelines", pid, "gantt.png")
    assert open(gantt, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert [a.path for a in client.list_artifacts(parent[0].info.run_id, "gantt")] == ["gantt/gantt.png"]


def stage(cmd="true", *, needs=(), gpu=0, duration="1m", features=()):
    return {"needs": list(needs), "duration": duration, "features": list(features),
            "workload": {"kind": "batch", "class": "eval", "gang": {"workers": 1, "resources": {"cpu": 0.5,
                                                                                                 "gpu": gpu}},
                         "command": ["sh", "-c", cmd]}}


def pipeline(name, **stages):
    return {"kind": "pipeline", "name": name, "team": "team-a", "run": {"intent": "test"}, "stages": stages}


def test_stages_wait_for_their_inputs_and_cancelling_the_pipeline_cancels_them_all(env, tmp_path):
    ctl = env["ctl"]
    view = ctl.pipeline_submit(pipeline("waits", a=stage(), b=stage(needs=["a"]), c=stage(needs=["a", "b"])),
                               pipeline_id="waits-000001", storage_path=str(tmp_path))
    ids = {s["stage"]: s["workload_id"] for s in view["stages"]}
    # No driver runs `a`: it is admitted and holds its lease; b and c wait for their inputs, saying which.
    wait_for(lambda: ctl.status(ids["a"]).state.value == "ADMITTED", timeout=30, what="a admitted")
    # Reasons are brought up to date each tick.
    wait_for(lambda: ctl.status(ids["b"])["reason"] == "waiting for its inputs: a (admitted)", timeout=10,
             what="b's reason")
    assert ctl.status(ids["b"]).state.value == "PENDING"
    assert ctl.status(ids["c"])["reason"] == "waiting for its inputs: a (admitted), b (pending)"
    ctl.cancel("waits-000001")
    wait_for(lambda: ctl.pipeline("waits-000001")["state"] == "CANCELLED", timeout=30, what="pipeline cancelled")
    assert {s["state"] for s in ctl.pipeline("waits-000001")["stages"]} == {"CANCELLED"}


def test_a_stage_that_could_never_run_refuses_the_whole_pipeline_at_submit(env, tmp_path):
    from raylane.errors import InfeasibleError, ValidationError

    ctl = env["ctl"]
    with pytest.raises(InfeasibleError) as info:
        ctl.pipeline_submit(pipeline("never", a=stage(), big=stage(needs=["a"], gpu=3)),
                            pipeline_id="never-000001", storage_path=str(tmp_path))
    assert "stage big" in str(info.value) and "3" in str(info.value)
    with pytest.raises(ValidationError) as info:
        ctl.pipeline_submit(pipeline("cyc", a=stage(needs=["b"]), b=stage(needs=["a"])),
                            pipeline_id="cyc-000001", storage_path=str(tmp_path))
    assert "a -> b -> a" in str(info.value) or "b -> a -> b" in str(info.value)
    assert "never-000001" not in {r["id"] for r in ctl.queue(include_done=True)}


def test_a_stage_running_over_its_estimate_re_plans_what_has_not_started(env, tmp_path):
    ctl = env["ctl"]
    view = ctl.pipeline_submit(pipeline("late", a=stage(duration="1s"), b=stage(needs=["a"], duration="10m")),
                               pipeline_id="late-000001", storage_path=str(tmp_path))
    a = view["stages"][0]["workload_id"]
    wait_for(lambda: ctl.status(a).state.value == "ADMITTED", timeout=30, what="a admitted")
    ctl.running(a, job_id=None, note="the test drives it")  # as a driver would; it never reports done
    got = wait_for(lambda: ctl.pipeline("late-000001")["replans"], timeout=30, what="a re-plan")
    assert got[0]["reason"].startswith("stage a ran over 2x its estimate") and set(got[0]["plan"]) == {"b"}
    assert ctl.pipeline("late-000001")["makespan_h"] * 3600 > 2  # a's run so far is counted again
    ctl.cancel("late-000001")
    wait_for(lambda: ctl.pipeline("late-000001")["state"] == "CANCELLED", timeout=30, what="pipeline cancelled")


def test_a_lost_node_re_plans_the_stages_planned_on_it(env, tmp_path):
    """Last in the module: it adds a node and kills it."""
    from raylane.config.cluster import NodeGroup
    from raylane.localcluster import node_labels
    from tests.raytest import free_port

    ctl, c = env["ctl"], env["cluster"]
    node = c.add_node(num_cpus=2, num_gpus=0, labels=node_labels(NodeGroup(name="fast", node_type="fast")),
                      temp_dir=c.raylane_temp_dir, dashboard_agent_listen_port=free_port(),
                      runtime_env_dir_name="runtime_resources_fast")
    c.wait_for_nodes()
    fast = node.node_id
    # b takes 1 minute on the fast node and 30 elsewhere: the plan puts it there.
    b = {**stage(needs=["a"]), "duration": {"fast": "1m", "default": "30m"}}
    view = ctl.pipeline_submit(pipeline("lost", a=stage(), b=b), pipeline_id="lost-000001",
                               storage_path=str(tmp_path))
    assert {s["stage"]: s["planned"]["node"] for s in view["stages"]}["b"] == fast
    c.remove_node(node, allow_graceful=False)
    got = wait_for(lambda: ctl.pipeline("lost-000001")["replans"], timeout=90, what="a re-plan after the loss")
    assert got[0]["reason"] == f"node {fast[:12]} was lost"
    assert got[0]["plan"]["b"]["node"] != fast
    # b's new plan is 30 minutes, no longer 1.
    assert got[0]["plan"]["b"]["finish_h"] - got[0]["plan"]["b"]["start_h"] == pytest.approx(0.5)
    ctl.cancel("lost-000001")
    wait_for(lambda: ctl.pipeline("lost-000001")["state"] == "CANCELLED", timeout=30, what="pipeline cancelled")
