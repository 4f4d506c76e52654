"""The control actor on a real multi-node Ray cluster: submit, admit into a real placement group, cancel, quota
refusal, infeasible rejection, preemption of a reservation, a kill-and-restart with the queue intact, and when a
resize of an elastic gang is carried out."""
import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import ControlClient, EndState, Outcome, State, start_control, stop_control  # noqa: E402
from raylane.errors import InfeasibleError, NotFoundError, ValidationError  # noqa: E402
from tests.raytest import local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    cluster = start_cluster()
    ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
    journal = str(tmp_path_factory.mktemp("journal") / "journal.db")
    # No minimum runtime for pretrain so that preemption is immediate in these tests.
    policy = local_policy(pretrain={"min_runtime": 0})
    policy["scheduler"]["resize_interval"] = "1s"  # elastic gangs grow a second after they start (only one test has one)
    client = start_control(policy, journal, tick_s=0.2)
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


def test_quota_refusal_gives_reason_and_position(ctl):
    drain(ctl)
    ids = [ctl.submit(spec(f"q{i}", "team-a", "pretrain", workers=2)).id for i in range(3)]
    # team-a: nominal 2 + borrowing 2 = 4 GPUs: two gangs of 2 run, the third waits on quota.
    wait_for(lambda: sum(r.state is State.ADMITTED for r in ctl.queue()) == 2, what="two admitted")
    row = wait_for(lambda: next((r for r in ctl.queue() if r.state is State.PENDING and r.reason), None),
                   what="pending reason")
    assert row.id == ids[2] and row.position == 1
    assert "team team-a uses 4 of 2 GPU nominal + 0 borrowable; this gang needs 2" in row.reason
    explained = ctl.explain(ids[2])
    assert explained["reason_data"]["type"] == "QuotaExceeded"
    assert explained["team_quota"]["gpu"]["used"] == 4


def test_infeasible_and_invalid_requests_are_refused_at_submit(ctl):
    with pytest.raises(InfeasibleError, match="fits no set of nodes"):
        ctl.submit(spec("big", "team-a", "pretrain", workers=3, placement="strict-pack"))
    with pytest.raises(ValidationError) as err:
        ctl.submit(spec("nope", "team-zzz", "pretrain"))
    assert "team" in str(err.value) and "team-zzz" in str(err.value)
    rejected = [r for r in ctl.queue(include_done=True) if r.state is State.REJECTED]
    assert any(r.id.startswith("big-") for r in rejected)
    with pytest.raises(NotFoundError):
        ctl.status("no-such-workload")


def test_cancel_releases_and_next_is_admitted(ctl):
    drain(ctl)
    first = [ctl.submit(spec(f"c{i}", "team-a", "pretrain", workers=2)).id for i in range(2)]
    wait_for(lambda: all(ctl.status(i).state is State.ADMITTED for i in first), what="two admitted")
    waiting = ctl.submit(spec("c-wait", "team-a", "pretrain", workers=2)).id
    assert ctl.cancel(first[0]).state is State.CANCELLED
    wait_for(lambda: ctl.status(waiting).state is State.ADMITTED, what="waiting one admitted")
    assert f"raylane-{first[0]}" not in pg_table()


def test_higher_class_of_other_team_reclaims_borrowed_gpus(ctl):
    drain(ctl)
    a = [ctl.submit(spec(f"p{i}", "team-a", "pretrain", workers=2)).id for i in range(2)]
    wait_for(lambda: all(ctl.status(i).state is State.ADMITTED for i in a), what="team-a holds 4 GPUs")
    b = ctl.submit(spec("ft", "team-b", "finetune", workers=2)).id
    wait_for(lambda: ctl.status(b).state is State.ADMITTED, what="team-b admitted")
    states = sorted(ctl.status(i).state.value for i in a)
    assert states == ["ADMITTED", "PENDING"]  # exactly one victim: the borrowed gang
    victim = next(i for i in a if ctl.status(i).state is State.PENDING)
    assert ctl.status(victim)["preemptions"] == 1
    assert f"raylane-{victim}" not in pg_table()


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

    from raylane.cli_cluster import stranded_footer

    drain(ctl)
    holes = [ctl.submit(spec(f"hole-{f}", "team-a", "pretrain", features=[f])).id for f in ("nvlink", "ssd")]
    wait_for(lambda: all(ctl.status(i).state is State.ADMITTED for i in holes), what="one GPU taken on each node")
    big = ctl.submit(spec("two-gpus", "team-a", "pretrain", gpu=2)).id
    info = wait_for(lambda: (i := ctl.info()) and sum(i["stranded_gpus"].values()) == 2 and i,
                    what="2 stranded GPUs in info")
    assert sum(info["free_gpus"].values()) == 2 and ctl.status(big).state is State.PENDING
    assert stranded_footer(info).startswith("stranded GPUs: 2 of 2 free (")
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

def _checkpoint(run_dir, step):
    d = run_dir / f"checkpoint_{step:08d}"
    d.mkdir(parents=True)
    (d / "state.pt").write_bytes(f"weights at {step}".encode())
    (d / "meta.json").write_text(f'{{"step": {step}}}')
    return str(d)


def _rotate(ctl, wid, run_dir, step, keep=3):
    """The source's gang writes a checkpoint and Ray Train's retention deletes all but the newest ``keep``."""
    import shutil

    path = _checkpoint(run_dir, step)
    for old in sorted(run_dir.glob("checkpoint_*"))[:-keep]:
        shutil.rmtree(old)
    ctl.checkpoint_saved(wid, path, {"step": step})
    return path


def test_checkpoint_reference_is_pinned_against_retention_until_loaded(ctl, tmp_path):
    drain(ctl)
    runs = tmp_path / "runs" / "src"
    cfg = {"max_steps": 200, "checkpoint_every": 10}
    src = ctl.submit(spec("src", "team-a", "pretrain", config=cfg)).id
    for step in (10, 20):
        _rotate(ctl, src, runs, step)
    # Waits for a step still to come: held out of the queue with the reason, not admitted.
    later = ctl.submit(spec("ft-later", "team-b", "finetune", config={"init_from": {"workload": "src", "step": 40}})).id
    # Names a step on disk now: pinned (copied) at once.
    now = ctl.submit(spec("ft-now", "team-b", "finetune", config={"init_from": {"workload": src, "step": 20}})).id
    row = wait_for(lambda: next(r for r in ctl.queue() if r.id == later).reason, what="reason")
    assert row == f"waiting for {src}'s checkpoint at step 40 (last checkpoint at step 20)"
    assert ctl.status(later).state is State.PENDING
    for step in (30, 40, 50, 60, 70):  # the source trains on; its retention deletes 20 and 40 meanwhile
        _rotate(ctl, src, runs, step)
    assert not (runs / "checkpoint_00000020").exists() and not (runs / "checkpoint_00000040").exists()
    wait_for(lambda: ctl.status(later).state is State.ADMITTED, what="the consumer admitted once step 40 was written")
    for wid, step in ((now, 20), (later, 40)):
        got = ctl.resolve_checkpoint(wid)
        assert got == {"path": str(runs / "_pinned" / f"checkpoint_{step:08d}"), "step": step, "source": src}
        assert (runs / "_pinned" / f"checkpoint_{step:08d}" / "state.pt").read_bytes() == f"weights at {step}".encode()
    # A consumer's own first checkpoint means it has loaded what it was promised: the copy goes.
    _checkpoint(tmp_path / "runs" / later, 5)
    ctl.checkpoint_saved(later, str(tmp_path / "runs" / later / "checkpoint_00000005"), {"step": 5})
    assert not (runs / "_pinned" / "checkpoint_00000040").exists()
    assert (runs / "_pinned" / "checkpoint_00000020").exists()
    ctl.cancel(now)  # ended without loading: its copy goes too
    assert not (runs / "_pinned" / "checkpoint_00000020").exists()
    kinds = [e["kind"] for e in ctl.explain(later)["journal"]]
    assert kinds[:4] == ["submitted", "pinned", "pinned", "admitted"] and "unpinned" in kinds


def test_checkpoint_reference_that_can_never_resolve_is_refused_or_failed(ctl, tmp_path):
    drain(ctl)
    runs = tmp_path / "runs" / "src2"
    src = ctl.submit(spec("src2", "team-a", "pretrain", config={"max_steps": 100, "checkpoint_every": 10}))
    for step in (10, 20, 30, 40):
        _rotate(ctl, src.id, runs, step)
    refused = {
        "nobody": "which is not known to the control plane",
        ("src2", 10): "was deleted by its retention",
        ("src2", 500): "trains to step 100 only",
        ("src2", 45): "checkpoints every 10 steps",
    }
    for target, why in refused.items():
        name, step = (target, "latest") if isinstance(target, str) else target
        with pytest.raises(InfeasibleError, match=why):
            ctl.submit(spec("ft-bad", "team-b", "finetune", config={"init_from": {"workload": name, "step": step}}))
    with pytest.raises(ValidationError, match="config.init_from.step"):
        ctl.submit(spec("ft-bad", "team-b", "finetune", config={"init_from": {"workload": "src2", "step": -1}}))
    # Promised a step, then the source ends before writing it: the consumer fails with the reason, unqueued.
    waiting = ctl.submit(spec("ft-wait", "team-b", "finetune",
                              config={"init_from": {"workload": "src2", "step": 90}})).id
    ctl.release(src.id, Outcome.FAILED, state=EndState.FAILED, detail="crashed")
    rec = wait_for(lambda: (r := ctl.status(waiting)).state is State.FAILED and r, what="consumer failed")
    assert any("failed: config.init_from src2@90: " in note and "ended without a checkpoint at step 90" in note
               for _, note in rec["events"]), rec["events"]
    assert rec["attempts"] == 0


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


def test_a_resize_waits_until_the_gang_is_heard_from_after_its_hand_over(ctl):
    # Ray Train takes many seconds to start a gang's workers after the driver hands the reservation over; the loop
    # hears a stop only at its checkpoints once it runs. A resize asked before that would run out its grace period
    # and be forced, so the actor holds the core's resize until the gang polls (or checkpoints).
    drain(ctl)
    other = ctl.submit(spec("hold-b", "team-b", "pretrain", workers=2)).id
    wait_for(lambda: ctl.status(other).state is State.ADMITTED, what="team-b holds 2 of the 4 GPUs")
    s = spec("elastic", "team-a", "pretrain")
    s["gang"]["workers"] = {"min": 2, "max": 4}
    wid = ctl.submit(s).id
    rec = wait_for(lambda: (r := ctl.wait_admission(wid, 1.0)).ready and r, what="the elastic gang admitted")
    assert rec["workers"] == 2
    ctl.report(wid, "running")  # the driver's hand-over to Ray Train
    ctl.cancel(other)
    # The core asks for growth into the freed GPUs every cycle from a second after the start: held meanwhile.
    time.sleep(3.0)
    assert ctl.status(wid).state is State.RUNNING
    assert not [e for e in ctl.explain(wid)["journal"] if e["kind"] == "resizing"]
    assert ctl.should_stop(wid) is False  # the loop's first poll: it runs
    wait_for(lambda: ctl.status(wid).state is State.RESIZING, what="the growth carried out once heard from")
    got = [(e["from_workers"], e["to_workers"]) for e in ctl.explain(wid)["journal"] if e["kind"] == "resizing"]
    assert got == [(2, 4)]
    rec = ctl.release(wid, Outcome.YIELDED, step=0)
    assert rec.state is State.ADMITTED and rec["workers"] == 4 and rec["resizes"] == 1
    drain(ctl)


def test_a_burst_of_one_spec_name_keeps_every_workload(ctl):
    # Ids drawn with 6 hex digits collided 3 times in 10,000 submissions of one name: a record was overwritten and
    # the journal held two rows under one id. Every submission here must stay a workload of its own.
    drain(ctl)
    n = 300
    # One GPU each: four run within team-a's quota, the rest wait (no hundreds of reservations to place).
    wids = [ctl.submit(spec("burst", "team-a", "eval")).id for _ in range(n)]
    assert len(set(wids)) == n
    kept = {r.id for r in ctl.queue(include_done=True) if r.id.startswith("burst-")}
    assert kept == set(wids)
    rows = [sum(e["kind"] == "submitted" for e in ctl.explain(w)["journal"]) for w in wids]
    assert rows == [1] * n
    drain(ctl)


def test_an_id_in_use_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    # The control plane's state machine, on a journal that already holds a rejected workload, with a source of
    # randomness that draws that workload's id again and again.
    from raylane import ids
    from raylane.control.journal import Journal
    from raylane.control.state import ControlState
    from raylane.errors import ConflictError

    taken = "burst-0123456789ab"
    path = str(tmp_path / "journal.db")
    j = Journal(path)
    j.append("submitted", taken, spec=spec("burst", "team-a", "eval", gpu=0), submit_time=time.time(), owner="a")
    j.append("rejected", taken, reason="the earlier one")
    j.close()
    actor = ControlState(local_policy(), Journal(path), auth={"enabled": False})

    def request(call, args):
        try:
            return actor.handle(*actor.check(None, call, args))
        finally:
            actor.journal.commit()

    def rows(kind_is_audit=False):
        return [(e.seq, e.kind, e.workload_id, e.data) for e in actor.journal.replay()
                if (e.kind == "audit") == kind_is_audit]

    try:
        before = rows()
        rec = actor.records[taken]
        monkeypatch.setattr(ids, "suffix", lambda: taken.rsplit("-", 1)[1])
        with pytest.raises(ConflictError) as err:
            request("submit", {"spec": spec("burst", "team-a", "eval", gpu=0)})
        assert err.value.errors[0][:2] == ("id", taken)
        # No journal row but the refusal's audit, no record change: the earlier workload is as it was.
        assert rows() == before
        assert [(d["outcome"], d["reason"].split(":")[0]) for *_, d in rows(True)] == [("refused", "ConflictError")]
        assert list(actor.records) == [taken] and actor.records[taken] is rec
        assert (rec.state, rec.reason) == (State.REJECTED, "the earlier one")
        # A pipeline id is the caller's choice: one a workload goes by is refused the same way.
        with pytest.raises(ConflictError) as err:
            request("pipeline_submit", {"spec": {"name": "p"}, "pipeline_id": taken,
                                         "storage_path": str(tmp_path)})
        assert err.value.errors[0][:2] == ("pipeline_id", taken)
        assert rows() == before
    finally:
        actor.journal.close()


def test_the_actor_class_exposes_request_and_ping_only():
    # Ray makes every method of an actor class callable through its handle: the state machine and the shell's own
    # methods are attributes, so the checked entry point is the only way in besides the health check.
    from raylane.control.actor import ControlActor

    methods = sorted(m for m in vars(ControlActor) if callable(getattr(ControlActor, m)) and not m.startswith("__"))
    assert methods == ["ping", "request"]
