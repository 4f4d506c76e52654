"""Fidelity of the simulator to the live control plane (issue 27, item 3).

A live run on a local multi-node cluster (3 nodes x 2 logical GPUs, the real control actor and placement groups):
two teams submit, an elastic gang grows, a higher class of the other team reclaims its borrowed GPUs (a preemption
or a shrink, whichever the core chooses), and a node is lost under running leases. The gangs are played by this test
as a driver would (hand-over, a checkpoint every second of run, stop when asked, release), so each gang's work is
known. Then the journal the run left is replayed through the simulator (``raylane.sim.journal``) under the same
policy: the same admission order, the same preemptions and resizes per workload, and first starts and ends within
the gangs' measured stop delays (plus the control loop's tick) of the live ones.
"""
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import EndState, Outcome, State, start_control, stop_control  # noqa: E402
from tests.raytest import local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TICK_S = 0.2
POLL_S = 0.1
CHECKPOINT_S = 1.0


class Gangs:
    """The test's stand-in for the gangs' drivers: each admitted workload is handed over, runs its work (seconds at
    its submitted size, faster in proportion when it holds more workers), checkpoints every ``CHECKPOINT_S`` of run
    and when asked to stop (a preemption or a resize: nothing is lost, as with Raylane's training loop), yields
    then, and releases when its work is done. A lease lost with a node comes back PENDING: the work since its last
    checkpoint is lost, as for a real gang."""

    def __init__(self, ctl):
        self.ctl = ctl
        self.work, self.size, self.done, self.kept, self.steps = {}, {}, {}, {}, {}
        self.workers, self.since, self.last, self.last_ckpt = {}, {}, {}, {}
        self.errors = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def add(self, wid, work, size):
        with self._lock:
            self.work[wid], self.size[wid], self.done[wid], self.kept[wid], self.steps[wid] = work, size, 0.0, 0.0, 0

    def start(self):
        self.thread.start()

    def stop(self):
        self._stop.set()
        self.thread.join(30)

    def _run(self):
        try:
            while not self._stop.is_set():
                with self._lock:
                    wids = list(self.work)
                for wid in wids:
                    self._step(wid, time.time())
                time.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            self.errors.append(exc)

    def _step(self, wid, now):
        ctl = self.ctl
        rec = ctl.status(wid)
        if rec.terminal:
            return
        if rec.state in (State.PENDING, State.ADMITTED) and wid in self.since:
            # Requeued under it (a lost node: back to its last checkpoint), or restarted at a new size.
            del self.since[wid]
            self.done[wid] = self.kept[wid]
        if rec.state is State.ADMITTED:
            if ctl.wait_admission(wid, 0.0).ready:
                ctl.running(wid, job_id=None)
                self.since[wid] = self.last[wid] = self.last_ckpt[wid] = now
                self.workers[wid] = len(rec["placement"])
            return
        if wid not in self.since:
            return
        # Running, or asked to stop: the progress since the last poll, at its size.
        self.done[wid] += self.workers[wid] / self.size[wid] * (now - self.last[wid])
        self.last[wid] = now
        if rec.state.stopping or ctl.should_stop(wid):
            self._checkpoint(wid)
            del self.since[wid]
            ctl.release(wid, Outcome.YIELDED, state=EndState.SUCCEEDED, step=self.steps[wid])
        elif self.done[wid] >= self.work[wid]:
            del self.since[wid]
            ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED, step=self.steps[wid])
        elif now - self.last_ckpt[wid] >= CHECKPOINT_S:
            self._checkpoint(wid)
            self.last_ckpt[wid] = now

    def _checkpoint(self, wid):
        self.steps[wid] += 1
        self.kept[wid] = self.done[wid]
        self.ctl.checkpoint_saved(wid, f"/nonexistent/{wid}/checkpoint_{self.steps[wid]:06d}",
                                  {"step": self.steps[wid]})


def test_a_live_run_replayed_through_the_simulator_makes_the_same_decisions(tmp_path):
    from raylane.config.loader import load_policy_from_dict
    from raylane.sim.journal import simulate_journal, trace_from_journal

    policy = local_policy(pretrain={"min_runtime": 0, "checkpoint_every": "1s", "grace_period": "10s"},
                          finetune={"min_runtime": 0, "checkpoint_every": "1s", "grace_period": "10s"},
                          serving={"checkpoint_every": "1s"})
    policy["teams"]["team-a"]["quotas"]["gpu"] = {"nominal": 3, "borrowing_limit": 3}
    policy["teams"]["team-b"]["quotas"]["gpu"] = {"nominal": 3, "borrowing_limit": 3}
    policy["scheduler"]["resize_interval"] = "2s"
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]), ("gpu-b", ["gpu-sim"]), ("gpu-c", ["gpu-sim"])))
    journal = str(tmp_path / "journal.db")
    gangs = None
    try:
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        ctl = start_control(policy, journal, tick_s=TICK_S)
        gangs = Gangs(ctl)
        gangs.start()

        def submit(name, team, cls, work, workers=1, gpu=1, elastic=None):
            s = spec(name, team, cls, workers=workers, gpu=gpu, cpu=0.1)
            if elastic:
                s["gang"]["workers"] = elastic
            rec = ctl.submit(s)
            gangs.add(rec.id, work, workers if not elastic else elastic["min"])
            return rec.id

        # Both teams start a 2-GPU gang; team A's elastic gang starts at 2 in the last 2 GPUs and grows into team B's
        # when that one ends. Team A's fixed gang is of a class that is never preempted, so that what team B's
        # finetune reclaims later is decided by the quotas alone, not by which gang checkpointed last (a live
        # race of a fraction of a second that no replay can reproduce).
        a1 = submit("a-fixed", "team-a", "serving", 20.0, workers=2)
        b0 = submit("b-fixed", "team-b", "pretrain", 5.0, workers=2)
        time.sleep(1.0)
        a2 = submit("a-elastic", "team-a", "pretrain", 30.0, elastic={"min": 2, "max": 4})
        wait_for(lambda: ctl.status(a2)["resizes"] >= 1 and ctl.status(a2).state is State.RUNNING, timeout=30,
                 what="the elastic gang grown", explain=lambda: _story(ctl, [a1, b0, a2]))
        # Team B's higher class wants 3 GPUs: team A borrowed 3 beyond its nominal 3.
        time.sleep(1.0)
        b1 = submit("b-finetune", "team-b", "finetune", 6.0, workers=3)
        wait_for(lambda: ctl.status(b1).state is State.RUNNING, timeout=40, what="team B's finetune running",
                 explain=lambda: _story(ctl, [a1, b0, a2, b1]))
        time.sleep(2.0)
        # A node is lost under running leases.
        victim_node = next(n for n in cluster.worker_nodes if any(
            any(p == n.node_id for p in ctl.status(w)["placement"]) for w in (a1, a2, b1)))
        cluster.remove_node(victim_node)
        wids = [a1, b0, a2, b1]
        wait_for(lambda: all(ctl.status(w).terminal for w in wids), timeout=150, every=0.5,
                 what="every workload ended", explain=lambda: _story(ctl, wids))
        assert not gangs.errors, gangs.errors
        live = {w: ctl.status(w) for w in wids}
    finally:
        if gangs is not None:
            gangs.stop()
        stop_control()
        stop_cluster(cluster)

    assert all(r.state is State.SUCCEEDED for r in live.values()), {w: r.state for w, r in live.items()}
    got = trace_from_journal(journal, load_policy_from_dict(policy))
    assert got.outages.failures, "the journal records the lost node"
    preempted = sum(r["preemptions"] for r in live.values())
    resized = sum(r["resizes"] for r in live.values())
    assert resized >= 1 and preempted >= 1, (preempted, resized)

    # The gangs' measured stop delays: from each preempting/resizing entry to the release that answered it.
    from raylane.sim.journal import read_entries, stop_delays

    delays = stop_delays(read_entries(journal))
    assert delays, "the run had stops to measure"
    stop_delay = sorted(delays)[len(delays) // 2]
    result = simulate_journal(got, load_policy_from_dict(policy), stop_delay_s=stop_delay, resize_overhead_s=0.0)
    index = {j.id: i for i, j in enumerate(result.jobs)}
    # The same admission order, preemptions and resizes.
    live_order = sorted(wids, key=lambda w: got.starts[w])
    sim_order = sorted(wids, key=lambda w: result.first_start[index[w]])
    assert sim_order == live_order
    assert {w: result.preemptions[index[w]] for w in wids} == {w: live[w]["preemptions"] for w in wids}
    assert {w: result.resizes[index[w]] for w in wids} == {w: live[w]["resizes"] for w in wids}
    # Times within the measured stop delays (and the live loop's tick and the gangs' poll).
    slack = max(delays) + 2 * (TICK_S + POLL_S) + 0.5
    origin = got.trace.origin
    for w in wids:
        assert abs(result.first_start[index[w]] - got.starts[w]) <= slack, (w, result.first_start[index[w]],
                                                                          got.starts[w], slack)
        assert abs(result.finish[index[w]] - (live[w]["ended_at"] - origin)) <= 2 * slack, (
            w, result.finish[index[w]], live[w]["ended_at"] - origin, slack)


def _story(ctl, wids):
    """What the control plane says of each workload, for a failed wait's message."""
    out = []
    for w in wids:
        e = ctl.explain(w)
        out.append(f"{w}: {e.state.value} {e.reason!r} " + "; ".join(
            f"{j['kind']}{' ' + j['note'] if j.get('note') else ''}" for j in e["journal"]))
    return "\n".join(out)
