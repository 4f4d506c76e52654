"""The control actor on a real multi-node Ray cluster: what needs Ray. Admission into a real placement group pinned
to the chosen nodes, readiness only once Ray has placed it, a kill-and-restart of the actor with the queue and the
placement groups intact, metrics reaching the nodes' Prometheus endpoints, and the actor class's surface.

The control plane's logic (quota, refusals, cancel, preemption, resizes, checkpoint references, ids) is tested without
Ray in tests/control/test_control_state.py."""
import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import ControlClient, State, start_control, stop_control  # noqa: E402
from tests.raytest import local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    cluster = start_cluster()
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    journal = str(tmp_path_factory.mktemp("journal") / "journal.db")
    client = start_control(local_policy(), journal, tick_s=0.2)
    yield client
    stop_control()
    stop_cluster(cluster)


def pg_table():
    return {v["name"]: v for v in ray.util.placement_group_table().values() if v["state"] != "REMOVED"}


def node_by_feature(feature):
    for n in ray.nodes():
        if n["Alive"] and n["Labels"].get(f"feature.raylane.io/{feature}") == "true":
            return n["NodeID"]
    raise AssertionError(feature)


def drain(ctl):
    for row in ctl.queue():
        ctl.cancel(row.id)
    wait_for(lambda: not pg_table(), what="all reservations released")


def test_submit_admits_into_pinned_placement_group(ctl):
    drain(ctl)
    rec = ctl.submit(spec("feat", "team-a", "pretrain", workers=2, features=["nvlink"]))
    rec = wait_for(lambda: (r := ctl.wait_admission(rec.id, 2.0)).ready and r, what="admission")
    assert rec.state is State.ADMITTED
    pg = pg_table()[rec["pg_name"]]
    assert pg["state"] == "CREATED"
    # Both bundles sit on the node the core chose, the only one with the nvlink feature.
    assert set(pg["bundles_to_node_id"].values()) == {node_by_feature("nvlink")} == set(rec["placement"])
    assert [b.get("GPU") for b in pg["bundles"].values()] == [1.0, 1.0]


def test_kill_and_restart_keeps_queue_and_leases(ctl):
    drain(ctl)
    ids = [ctl.submit(spec(f"k{i}", "team-a", "pretrain", workers=2)).id for i in range(3)]
    wait_for(lambda: sum(ctl.status(i).state is State.ADMITTED for i in ids) == 2, what="two admitted")
    before = {r.id: r.state for r in ctl.queue()}
    pgs_before = set(pg_table())
    ray.kill(ctl.handle, no_restart=False)
    after = wait_for(lambda: _try_queue(ctl), timeout=60, what="control actor back")
    assert {r.id: r.state for r in after} == before
    assert set(pg_table()) == pgs_before
    # The restarted actor still schedules: cancelling a running gang admits the waiting one.
    running = [i for i in ids if before[i] is State.ADMITTED]
    waiting = next(i for i in ids if before[i] is State.PENDING)
    # The operator's token was journaled: it still works after the restart.
    ctl.cancel(running[0])
    wait_for(lambda: ctl.status(waiting).state is State.ADMITTED, what="admission after restart")


def _try_queue(ctl):
    try:
        return ControlClient(ctl.handle, ctl.credential, timeout=5).queue()
    except Exception:  # noqa: BLE001 - restarting
        return None


def test_metrics_reach_the_nodes_prometheus_endpoint(ctl):
    """The control actor's counters and gauges are scraped from Ray's per-node metrics export port."""
    import urllib.request

    drain(ctl)
    rid = ctl.submit(spec("metered", "team-b", "finetune")).id
    wait_for(lambda: ctl.status(rid).state is State.ADMITTED, what="admission")
    ports = {n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]}

    def scrape():
        text = ""
        for port in ports:
            try:
                text += urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                pass
        lines = text.splitlines()
        admitted = [l for l in lines if l.startswith("ray_raylane_admissions_total{") and 'team="team-b"' in l
                    and 'workload_class="finetune"' in l]
        held = [float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("ray_raylane_team_gpus{")
                and 'what="held"' in l and 'team="team-b"' in l]
        return admitted and held and held[0] >= 1.0 and text
    text = wait_for(scrape, timeout=60, every=1.0, what="team-b's admission and held GPU on /metrics")
    assert "# HELP ray_raylane_team_gpus GPUs a team's leases hold, and its quota. Labels: team, what" in text



def test_stranded_gpus_reach_info_metrics_and_the_queue_footer(ctl):
    """One GPU taken on each 2-GPU node and a 1 x 2-GPU gang waiting: the two free GPUs are stranded (info, the
    queue footer, /metrics); once a node empties the gang runs and nothing is stranded."""
    import urllib.request

    from raylane.cli.cluster import stranded_footer

    drain(ctl)
    holes = [ctl.submit(spec(f"hole-{f}", "team-a", "pretrain", features=[f])).id for f in ("nvlink", "ssd")]
    wait_for(lambda: all(ctl.status(i).state is State.ADMITTED for i in holes), what="one GPU taken on each node")
    big = ctl.submit(spec("two-gpus", "team-a", "pretrain", gpu=2)).id
    info = wait_for(lambda: (i := ctl.info()) and sum(i["stranded_gpus"].values()) == 2 and i,
                    what="2 stranded GPUs in info")
    assert sum(info["free_gpus"].values()) == 2 and ctl.status(big).state is State.PENDING
    assert stranded_footer(info).startswith("stranded GPUs: 2 of 2 free (")
    # Its ETA, forecast on the actor's forecast thread (RayHost.forecast) and answered by a later call: after a
    # hole's lease ends, at the class's default runtime (none of these has an estimate).
    row = wait_for(lambda: next((r for r in ctl.queue() if r.id == big and r.get("eta_start")), None),
                   what="an ETA for the waiting gang")
    assert row["eta_start"] > min(ctl.status(i)["admitted_at"] for i in holes)
    ports = {n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]}

    def scraped():
        values = []
        for port in ports:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
            values += [float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                       if l.startswith("ray_raylane_stranded_gpus{")]
        return sum(values) == 2 and values
    wait_for(scraped, timeout=60, every=1.0, what="ray_raylane_stranded_gpus summing to 2 on /metrics")
    ctl.cancel(holes[0])
    wait_for(lambda: ctl.status(big).state is State.ADMITTED, what="the 2-GPU gang admitted on the emptied node")
    info = wait_for(lambda: (i := ctl.info()) and sum(i["stranded_gpus"].values()) == 0 and i,
                    what="nothing stranded")
    assert stranded_footer(info).startswith("stranded GPUs: 0 of ")


def test_admission_is_ready_only_once_the_reservation_is_placed(ctl):
    # After a forced stop the lease is free in the ledger at once, but the stopped gang's own placement group
    # (Ray Train's, unknown to the control actor) holds the GPUs until Train tears it down. The preemptor's
    # driver must not start, and hand over its reservation, before the reservation is placed.
    from ray.util.placement_group import placement_group, remove_placement_group

    drain(ctl)
    stopped_gang = placement_group([{"GPU": 2}], bundle_label_selector=[{"ray.io/node-id": node_by_feature("nvlink")}])
    ray.get(stopped_gang.ready(), timeout=30)
    try:
        wid = ctl.submit(spec("next", "team-b", "finetune", gpu=2, features=["nvlink"])).id
        rec = wait_for(lambda: (r := ctl.wait_admission(wid, 0.5)).state is State.ADMITTED and r,
                       what="admitted in the ledger")
        assert not rec.ready, "ready while its reservation cannot be placed"
        assert pg_table()[rec["pg_name"]]["state"] == "PENDING"
    finally:
        remove_placement_group(stopped_gang)
    rec = wait_for(lambda: (r := ctl.wait_admission(wid, 1.0)).ready and r, what="reservation placed")
    assert rec.state is State.ADMITTED and pg_table()[rec["pg_name"]]["state"] == "CREATED"
    drain(ctl)


def test_a_departments_idle_quota_goes_to_its_sibling_team_and_is_reclaimed_when_its_owner_submits(ctl):
    """The quota tree live: two departments with two teams each (1 GPU nominal each) on the cluster's 4 GPUs."""
    from tests.control.test_control_cohorts import tree_policy

    drain(ctl)
    ctl.reload_policy(tree_policy())
    try:
        bs = [ctl.submit(spec(f"{t}-own", t, "pretrain", gpu=1)).id for t in ("b1", "b2")]
        wide = ctl.submit(spec("a1-wide", "a1", "pretrain", gpu=2)).id  # its own GPU and its sibling a2's
        wait_for(lambda: all(ctl.wait_admission(w, 0.5).ready for w in bs + [wide]), what="all three admitted")
        rows = {c["cohort"]: c for c in ctl.cohorts()}
        assert (rows["dept-1"]["used"]["gpu"], rows["dept-1"]["borrowed"]["gpu"]) == (2, 0)
        own = ctl.submit(spec("a2-own", "a2", "pretrain", gpu=1)).id
        wait_for(lambda: ctl.wait_admission(own, 0.5).ready, what="a2 admitted on what it reclaimed")
        assert ctl.status(wide).state is not State.ADMITTED  # its own department's borrower gave way
        assert all(ctl.status(w).state is State.ADMITTED for w in bs)  # the other department was not touched
        assert {t["team"]: t["cohorts"] for t in ctl.teams()}["a2"] == ["org", "dept-1"]
    finally:
        drain(ctl)
        ctl.reload_policy(local_policy())


def test_the_actor_class_exposes_request_and_ping_only():
    # Ray makes every method of an actor class callable through its handle: the state machine and the shell's own
    # methods are attributes, so the checked entry point is the only way in besides the health check.
    from raylane.control.actor import ControlActor

    methods = sorted(m for m in vars(ControlActor) if callable(getattr(ControlActor, m)) and not m.startswith("__"))
    assert methods == ["ping", "request"]


def test_the_raylane_command_answers_in_a_new_process_and_runs_the_other_exit_handlers(ctl, tmp_path):
    # `raylane` exits without Ray's driver teardown (raylane.cli.main), but every other exit handler runs: `raylane
    # submit` removes the folder that carried its credential to the job that way. A new process, as a user's shell
    # runs it, with a home of its own (no `raylane up` state) and the caller's token.
    import json
    import os
    import subprocess
    import sys

    drain(ctl)
    wid = ctl.submit(spec("cli-exit", "team-a", "pretrain")).id
    env = {k: v for k, v in os.environ.items() if k not in ("RAYLANE_CREDENTIALS", "RAY_AUTH_MODE", "RAYLANE_TOKEN")}
    env.update(HOME=str(tmp_path), RAY_ADDRESS=ray.get_runtime_context().gcs_address,
               RAYLANE_TOKEN=ctl.credential.token)

    def raylane(*args: str, mark: str) -> subprocess.CompletedProcess:
        code = ("import atexit, sys\n"
                f"atexit.register(lambda: open({str(tmp_path / mark)!r}, 'w').write('ran'))\n"
                f"sys.argv = ['raylane', *{list(args)!r}]\n"
                "from raylane.cli import main\nmain()\n")
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    try:
        out = raylane("queue", "--json", mark="queue")
        assert out.returncode == 0, out.stderr
        assert [r["state"] for r in json.loads(out.stdout) if r["id"] == wid] in (["PENDING"], ["ADMITTED"])
        assert (tmp_path / "queue").read_text() == "ran"
        refused = raylane("explain", "no-such-workload", mark="explain")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "no workload 'no-such-workload'" in refused.stderr
        assert (tmp_path / "explain").read_text() == "ran"
    finally:
        drain(ctl)
