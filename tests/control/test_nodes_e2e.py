"""Nodes on a real multi-node local cluster (logical GPUs): the node commands of the CLI; cordon blocks new leases; a
drain moves a running training gang to another node with no step lost after its checkpoint; the health probe, run as
a Ray task on the node, quarantines it and uncordon brings it back; Ray's own drain notice is honoured; a worker node
killed under a running 2-node gang gives its lease back at once, the gang waits with a reason while the capacity is
gone and resumes, with no step lost after its checkpoint, when a node joins.

The node book's logic (states, probe and drain rules, lost nodes, who may change a node) is tested without Ray in
tests/control/test_control_state.py."""
import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from tests.jobtest import (finished, metric_history, record_of_job, reference_losses, start_env,  # noqa: E402
                           stop_env, submit_job)
from tests.raytest import free_port, local_policy, spec, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TRAIN = {"max_steps": 30, "checkpoint_every": 10, "batch_size": 8, "warmup_steps": 2, "eval_every": 0,
         "corpus": {"max_bytes": 200_000}, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "context": 32}}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nodes")
    policy = local_policy(pretrain={"min_runtime": 0, "grace_period": "30s"})
    policy["health"] = {"probe_interval": "1s", "probe_timeout": "20s", "probe_failures": 2,
                        "conditions_dir": str(tmp / "conditions")}
    policy["node_features"].update({f"node-gpu-{x}": f"the test's node gpu-{x}" for x in "abcd"})
    # Each node carries a feature tag named after it, to find it by.
    e = start_env(tmp, policy=policy, gpu_nodes=(("gpu-a", ["gpu-sim", "node-gpu-a"]),
                                                ("gpu-b", ["gpu-sim", "node-gpu-b"])), gpus=2)
    e["conditions"] = tmp / "conditions"
    e["conditions"].mkdir()
    try:
        yield e
    finally:
        stop_env(e)


def node_of(env, name):
    """The Ray node id of the node started for group ``name``."""
    for n in ray.nodes():
        if n["Alive"] and n["Labels"].get(f"feature.raylane.io/node-{name}") == "true":
            return n["NodeID"]
    raise AssertionError(f"no live node {name}: {[n['Labels'] for n in ray.nodes()]}")


def row(env, nid):
    return next(r for r in env["ctl"].nodes(include_lost=True) if r["id"] == nid)


def add_gpu_node(env, name):
    from raylane.config.cluster import NodeGroup
    from raylane.localcluster import node_labels

    c = env["cluster"]
    node = c.add_node(num_cpus=4, num_gpus=2, labels=node_labels(NodeGroup(name=name, features=["gpu-sim", f"node-{name}"])),
                      temp_dir=c.raylane_temp_dir, dashboard_agent_listen_port=free_port(),
                      runtime_env_dir_name=f"runtime_resources_{name}")
    c.wait_for_nodes()
    return node


def steps_and_losses(env, wid):
    _, hist = metric_history(env, wid)
    return [s for s, _ in hist], [v for _, v in hist]


def test_node_commands(env):
    import json

    from typer.testing import CliRunner

    from raylane.cli import app

    op = {"RAYLANE_TOKEN": env["ctl"].credential.token}
    b = node_of(env, "gpu-b")
    r = CliRunner().invoke(app, ["node", "list", "--json"], env=op)
    assert r.exit_code == 0, r.output
    assert {row["id"] for row in json.loads(r.output) if row["gpus_total"]} == {node_of(env, "gpu-a"), b}
    r = CliRunner().invoke(app, ["node", "cordon", b[:10], "--reason", "cli test"], env=op)
    assert r.exit_code == 0 and f"node {b[:12]}: cordoned (cli test)" in r.output, r.output
    r = CliRunner().invoke(app, ["node", "list"], env=op)
    assert r.exit_code == 0 and "cordoned" in r.output and "cli test" in r.output, r.output
    member = env["ctl"].token_create("dave", ["team-b"])["token"]
    r = CliRunner().invoke(app, ["node", "uncordon", b[:10]], env={"RAYLANE_TOKEN": member})
    assert r.exit_code == 1 and "only operators" in r.output, r.output
    r = CliRunner().invoke(app, ["node", "drain", "zzz"], env=op)
    assert r.exit_code == 1 and "node" in r.output, r.output
    r = CliRunner().invoke(app, ["node", "uncordon", b[:10]], env=op)
    assert r.exit_code == 0 and f"node {b[:12]}: ready" in r.output, r.output
    assert row(env, b)["state"] == "ready"


@pytest.mark.e2e
def test_cordon_then_drain_moves_a_running_gang_with_no_step_lost(env):
    ctl = env["ctl"]
    a, b = node_of(env, "gpu-a"), node_of(env, "gpu-b")
    ctl.node_cordon(a[:10], reason="test: keep A free")
    assert row(env, a)["state"] == "cordoned"
    cfg = dict(TRAIN, fault={"hold_at_step": 10})
    job = submit_job(env, spec("drainme", "team-a", "pretrain", workers=1, gpu=2, cpu=1, config=cfg), "drainme")
    wid = record_of_job(env, job)["id"]
    rec = wait_for(lambda: (r := ctl.status(wid)).state is State.RUNNING and r, timeout=120, what="running")
    assert set(rec["placement"]) == {b}, "a cordoned node got a new lease"
    wait_for(lambda: any(e["kind"] == "checkpointed" and e.get("step") == 10 for e in ctl.explain(wid)["journal"]),
             timeout=240, what="checkpoint at step 10")
    ctl.node_uncordon(a[:10])
    ctl.node_drain(b, reason="test: maintenance")
    assert row(env, b)["state"] == "draining"
    wait_for(lambda: row(env, b)["state"] == "drained", timeout=120, what="B drained")
    assert str(finished(env, job)).endswith("SUCCEEDED")
    rec = ctl.explain(wid)
    admitted = [e["placement"] for e in rec["journal"] if e["kind"] == "admitted"]
    assert admitted == [[b], [a]], rec["journal"]
    assert rec["preemptions"] == 1 and "draining" in next(e for e in rec["journal"] if e["kind"] == "preempting")["reason"]
    steps, losses = steps_and_losses(env, wid)
    assert steps == list(range(1, 31))
    ref = reference_losses(dict(TRAIN))
    assert losses == [ref[s] for s in steps]
    assert not row(env, b)["leases"]
    ctl.node_uncordon(b)
    assert row(env, b)["state"] == "ready"


def test_failing_probe_quarantines_the_node_and_uncordon_brings_it_back(env):
    ctl = env["ctl"]
    b = node_of(env, "gpu-b")
    (env["conditions"] / b).write_text("ECC errors on GPU 1")
    r = wait_for(lambda: (x := row(env, b))["state"] == "quarantined" and x, timeout=60, what="B quarantined")
    assert "ECC errors on GPU 1" in r["reason"] and "2 times in a row" in r["reason"]
    assert r["probe"]["ok"] is False
    (env["conditions"] / b).unlink()
    ctl.node_uncordon(b[:8], reason="GPU replaced")
    wait_for(lambda: row(env, b)["probe"]["ok"] is True, timeout=60, what="B's probe passing")
    assert row(env, b)["state"] == "ready"


def test_ray_drain_notice_is_honoured(env):
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    ctl = env["ctl"]
    node_d = add_gpu_node(env, "gpu-d")
    try:
        d = node_of(env, "gpu-d")
        wait_for(lambda: any(r["id"] == d for r in ctl.nodes()), what="D known")
        # A reservation on D, so that Ray does not stop D the moment the drain is accepted (it stops idle nodes).
        held = ctl.submit(spec("on-d", "team-a", "pretrain", workers=1, gpu=2, features=["node-gpu-d"]))
        wait_for(lambda: ctl.wait_admission(held.id, 2.0).ready, timeout=60, what="a reservation on D")
        gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
        accepted, why = gcs.drain_node(d, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                       "spot reclaim (test)", int((time.time() + 600) * 1000))
        assert accepted, why
        # The control plane takes Ray's notice as a drain: the reservation is preempted and requeued (it can only run
        # on D), D is drained; Ray then stops the idle node and it is lost.
        wait_for(lambda: row(env, d)["state"] in ("drained", "lost"), timeout=60, what="D drained")
        events = _node_journal(env, d)
        assert events[:3] == ["joined", "ray_draining", "drained"], events
        r = ctl.explain(held.id)
        notes = r["journal"][-2]["note"] + r["journal"][-1]["note"]
        assert r.state is State.PENDING and "draining" in notes, r["journal"]
        ctl.cancel(held.id)
        # Ray stops the drained node once it is idle; the test cluster forgets it (or its next wait_for_nodes waits
        # for it).
        wait_for(lambda: row(env, d)["state"] == "lost", timeout=60, what="D stopped by Ray")
    finally:
        # Whatever failed above, the module's later tests must not wait for D (wait_for_nodes counts it).
        env["cluster"].remove_node(node_d, allow_graceful=False)


def diagnosis(env, wid):
    """What a failed end-to-end wait needs to be understood: the workload's journal, reservations, node resources."""
    lines = [f"{e['ts']:.1f} {e['kind']} {e.get('note', '')} {e.get('placement', '')}"
             for e in env["ctl"].explain(wid)["journal"]]
    lines += [f"pg {v['name']} {v['state']} {v['bundles_to_node_id']}"
              for v in ray.util.placement_group_table().values() if v["state"] != "REMOVED"]
    lines += [f"node {n['NodeID'][:8]} alive={n['Alive']} {n['Resources']}" for n in ray.nodes()]
    lines += [f"available {ray.available_resources()}"]
    return "\n".join(lines)


def _node_journal(env, nid):
    from raylane.control.journal import Journal

    path = env["ctl"].info()["journal"]
    return [e.data["event"] for e in Journal(path).replay() if e.kind == "node" and e.data["node"] == nid]


@pytest.mark.e2e
def test_killed_node_requeues_its_gang_which_resumes_when_a_node_joins(env):
    ctl = env["ctl"]
    a, b = node_of(env, "gpu-a"), node_of(env, "gpu-b")
    cfg = dict(TRAIN, fault={"hold_at_step": 10})
    # 2 workers x 2 GPUs: one on each node; with B gone no node set can hold it until another joins.
    job = submit_job(env, spec("lossy", "team-a", "pretrain", workers=2, gpu=2, cpu=1, config=cfg), "lossy")
    wid = record_of_job(env, job)["id"]
    rec = wait_for(lambda: (r := ctl.status(wid)).state is State.RUNNING and r, timeout=120, what="running")
    assert sorted(rec["placement"]) == sorted([a, b])
    wait_for(lambda: any(e["kind"] == "checkpointed" and e.get("step") == 10 for e in ctl.explain(wid)["journal"]),
             timeout=240, what="checkpoint at step 10")
    victim = next(n for n in env["cluster"].worker_nodes if n.node_id == b)
    killed_at = time.time()
    env["cluster"].remove_node(victim, allow_graceful=False)
    r = wait_for(lambda: (x := ctl.explain(wid)).state is State.PENDING and x, timeout=90, what="requeued")
    lost = [e for e in r["journal"] if e["kind"] == "requeued" and e.get("lost_node") == b]
    assert len(lost) == 1 and "was lost" in lost[0]["note"]
    assert r["submit_time"] == rec["submit_time"]
    assert row(env, b)["state"] == "lost" and not row(env, b)["leases"]
    # The lease went back at once, its GPUs with it: A is free again.
    assert lost[0]["ts"] - killed_at < 60
    r = wait_for(lambda: "capacity it ran on is gone" in (ctl.status(wid)["reason"] or "") and ctl.status(wid),
                 timeout=60, what="the capacity-lost reason")
    assert r.state is State.PENDING
    add_gpu_node(env, "gpu-c")
    c = node_of(env, "gpu-c")
    try:
        status = str(finished(env, job, timeout=400))
    except AssertionError:
        print(diagnosis(env, wid))
        raise
    assert status.endswith("SUCCEEDED"), diagnosis(env, wid)
    rec = ctl.explain(wid)
    admitted = [sorted(e["placement"]) for e in rec["journal"] if e["kind"] == "admitted"]
    assert admitted == [sorted([a, b]), sorted([a, c])], rec["journal"]
    assert rec["restarts"] == 0  # a lost node is not the gang's failure
    # Every step reported once: the resumed gang started at step 11, after its checkpoint at step 10 (a restart
    # from scratch would report steps 1-10 twice, a lost step would leave a gap).
    steps, _ = steps_and_losses(env, wid)
    assert steps == list(range(1, 31))
    after = [e["step"] for e in rec["journal"] if e["kind"] == "checkpointed" and e["ts"] > lost[0]["ts"]]
    assert after == [20, 30], rec["journal"]
