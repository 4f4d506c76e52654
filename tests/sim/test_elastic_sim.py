"""Elastic jobs in the simulator (issue 15): size bounds and speedup curves in traces, and the engine applying the
core's ``Resize`` decisions (progress kept, the rate at each size integrated over time, a restart overhead).

A fake core is patched in where the engine looks ``cycle`` up: the real ``cycle`` with its own sizing switched off
(it sees every class as not resizable), plus resizes the test chooses, so every expected time below is worked out by
hand. tests/sim/test_elastic_core_sim.py replays the real core's own sizing.
"""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.sim.builders import job, replay, trace

import raylane.sim.engine as engine
from raylane.errors import FatalError, ValidationError
from raylane.scheduling.types import Resize, WorkloadClass
from raylane.sim import SimOptions, SimulationError, load_trace, summarize
from raylane.sim.engine import gang_for, speedup_table
from raylane.sim.traces import Speedup, parse_speedup

REAL_CYCLE = engine.cycle


def elastic(b, lo: int, hi: int, speedup=None):
    return replace(b.obj(), min_workers=lo, max_workers=hi, speedup=speedup)


def resize_at(monkeypatch, plan):
    """Patch in a core that adds ``plan``'s resizes: {(time, job id): new size}, each applied once, growing or
    shrinking the gang on the nodes it already has (the first node repeated for new workers)."""
    seen = []
    left = dict(plan)

    def fake(snap, now, **kw):
        result = REAL_CYCLE(fixed_size(snap), now, **kw)
        seen.append((now, snap.pending() == (), len(snap.leases)))
        resized = []
        for lease in snap.leases:
            to = left.pop((now, lease.id), None)
            if to is not None:
                n = lease.workload.gang.workers
                placement = (lease.placement + (lease.placement[0],) * to)[:to]
                resized.append(Resize(lease.workload, n, to, placement, (), "test"))
        return replace(result, resized=tuple(resized)) if resized else result

    monkeypatch.setattr(engine, "cycle", fake)
    return seen


def fixed_size(snap):
    """``snap`` with every class seen as not resizable: the core admits, grows and shrinks no gang itself."""
    def fixed(w):
        return replace(w, cls=replace(w.cls, resizable=False))
    return replace(snap, queues={t: tuple(map(fixed, q)) for t, q in snap.queues.items()},
                   leases=tuple(replace(l, workload=fixed(l.workload)) for l in snap.leases),
                   leases_by_team=None)


def finish_of(r, jid):
    return r.finish[[j.id for j in r.jobs].index(jid)]


# A job of 2 workers (1 GPU each) and 100 s at that size, elastic in [1, 4]; a 1-GPU job of 10 s arriving at 50 s
# gives the core a cycle halfway.
def halfway(speedup=None):
    return trace(elastic(job("a").gpus(2).workers(2).runs(100), 1, 4, speedup), job("b").gpus(1).at(50).runs(10))


def test_doubling_halfway_with_linear_speedup_finishes_at_the_computed_time(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(), resize_overhead_s=0.0)
    # 50 s of work done at 2 workers; the other 50 s at 4 workers go twice as fast: 25 s.
    assert finish_of(r, "a") == pytest.approx(75.0)
    assert r.resizes == [1, 0]
    # GPU-seconds held: a 2 x 50 + 4 x 25, b 1 x 10.
    assert r.team_gpu_s["default"] == pytest.approx(210.0)
    s = summarize(r)
    assert s["resizes"]["total"] == 1 and s["resizes"]["jobs_resized"] == 1
    assert s["resizes"]["per_job"] == pytest.approx(0.5)
    assert s["utilization"]["gpu_s_used"] == pytest.approx(210.0)
    assert s["utilization"]["mean"] == pytest.approx(210.0 / (8 * 75.0))


def test_amdahl_speedup(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(), resize_overhead_s=0.0, elastic_speedup="amdahl:0.1")
    # speedup(n) = 1 / (0.1 + 0.9 / n): 1 / 0.55 at 2 workers, 1 / 0.325 at 4; 50 s of work at rate 0.55 / 0.325.
    assert finish_of(r, "a") == pytest.approx(50.0 + 50.0 * 0.325 / 0.55)


def test_the_trace_curve_wins_over_the_replays(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(speedup="amdahl:0.1"), resize_overhead_s=0.0, elastic_speedup="linear")
    assert finish_of(r, "a") == pytest.approx(50.0 + 50.0 * 0.325 / 0.55)


def test_a_curve_per_class(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(), resize_overhead_s=0.0, elastic_speedup="train=amdahl:0.1,linear")
    assert finish_of(r, "a") == pytest.approx(50.0 + 50.0 * 0.325 / 0.55)
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(), resize_overhead_s=0.0, elastic_speedup="other=amdahl:0.1,linear")
    assert finish_of(r, "a") == pytest.approx(75.0)


def test_a_resize_costs_the_restart_overhead(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    r = replay(halfway(), resize_overhead_s=10.0)
    # 10 s of restart at 4 workers with no progress, then 25 s of work.
    assert finish_of(r, "a") == pytest.approx(85.0)
    assert r.team_gpu_s["default"] == pytest.approx(2 * 50 + 4 * 35 + 10)
    assert summarize(r)["resizes"]["overhead_gpu_hours"] == pytest.approx(4 * 10 / 3600.0)


def test_the_default_overhead_is_a_minute(monkeypatch):
    resize_at(monkeypatch, {(50.0, "a"): 4})
    assert finish_of(replay(halfway()), "a") == pytest.approx(50.0 + 60.0 + 25.0)


def test_shrinking_then_growing_integrates_the_rate_at_each_size(monkeypatch):
    # 2 -> 1 at 50 s (half speed), 1 -> 4 at 70 s (twice the requested speed); b and c give the cycles.
    resize_at(monkeypatch, {(50.0, "a"): 1, (70.0, "a"): 4})
    tr = trace(elastic(job("a").gpus(2).workers(2).runs(100), 1, 4), job("b").gpus(1).at(50).runs(10),
               job("c").gpus(1).at(70).runs(10))
    r = replay(tr, resize_overhead_s=0.0)
    # work: 50 by t=50, + 20 x 0.5 = 60 by t=70; the last 40 at rate 2: 20 s.
    assert finish_of(r, "a") == pytest.approx(90.0)
    assert r.resizes[0] == 2


def test_a_preemption_after_a_resize_keeps_the_work_to_the_last_checkpoint(monkeypatch):
    # Checkpoints every 20 s of progress, counted from the end of the restart overhead (10 s) of the resize at
    # 50 s: at 80 s. A high-priority job at 95 s preempts a; it keeps the work up to 80 s.
    resize_at(monkeypatch, {(50.0, "a"): 4})
    cls = WorkloadClass("train", 100, True, checkpoint_interval_s=20.0, grace_period_s=0.0, resizable=True)
    urgent = WorkloadClass("urgent", 1000, False)
    tr = trace(elastic(job("a").gpus(2).workers(2).runs(200), 1, 4), job("b").gpus(1).at(50).runs(10),
               job("u").gpus(8).at(95).runs(10).cls("urgent"))
    r = replay(tr, resize_overhead_s=10.0, classes={"train": cls, "urgent": urgent}, default_class=cls,
               config=dict(preemption="default"), tick_s=1000.0)
    i = [j.id for j in r.jobs].index("a")
    assert r.preemptions[i] == 1
    # a's work by the checkpoint at 80 s: 50 (to t=50) + 20 s x rate 2 = 90; lost: 15 s of progress at 4 GPUs.
    assert r.lost_work[i] == pytest.approx(15.0)
    assert r.lost_gpu_s["preemption"] == pytest.approx(15.0 * 4)
    # Back in its queue at 2 workers after u (95..105): the 110 s of work left at the requested size.
    assert finish_of(r, "a") == pytest.approx(105.0 + 110.0)


def test_a_cycle_runs_for_growth_when_nothing_is_pending(monkeypatch):
    # c ends at 20 s with nothing queued: the engine still runs a cycle, since a may grow into c's GPUs.
    seen = resize_at(monkeypatch, {(20.0, "a"): 4})
    tr = trace(elastic(job("a").gpus(2).workers(2).runs(100), 1, 4), job("c").gpus(6).runs(20))
    r = replay(tr, resize_overhead_s=0.0)
    assert (20.0, True, 1) in seen
    assert finish_of(r, "a") == pytest.approx(20.0 + 80.0 / 2)


def test_a_fixed_trace_replays_as_before_with_elastic_options():
    tr = trace(job("a").gpus(2).workers(2).runs(100), job("b").gpus(8).at(10).runs(10))
    base = replay(tr)
    other = replay(tr, elastic_speedup="amdahl:0.3", resize_overhead_s=5.0)
    assert (base.finish, base.first_start) == (other.finish, other.first_start)
    assert summarize(other)["resizes"]["total"] == 0


def test_a_resize_the_lease_cannot_take_is_a_simulation_error(monkeypatch):
    def fake(snap, now, **kw):
        result = REAL_CYCLE(fixed_size(snap), now, **kw)
        lease = next((le for le in snap.leases if le.id == "a"), None)
        if lease is None or now != 50.0:
            return result
        return replace(result, resized=(Resize(lease.workload, 3, 4, lease.placement * 2, (), "wrong from"),))

    monkeypatch.setattr(engine, "cycle", fake)
    with pytest.raises(SimulationError, match=r"from its size now \(2\) to a size in \[1, 4\]"):
        replay(halfway())


# ----------------------------------------------------------------------------------------------- curves, bounds

@pytest.mark.parametrize("text, want", [
    ("linear", Speedup()),
    (" Linear ", Speedup()),
    ("amdahl:0.05", Speedup("amdahl", 0.05)),
    ("amdahl:0", Speedup("amdahl", 0.0)),
])
def test_good_curves(text, want):
    assert parse_speedup(text) == want


def test_curve_values():
    a = parse_speedup("amdahl:0.5")
    assert a(1) == pytest.approx(1.0) and a(2) == pytest.approx(1 / 0.75) and a(1e9) == pytest.approx(2.0)
    assert parse_speedup("linear").rate(4, 2) == 2.0
    assert a.rate(3, 3) == 1.0


@pytest.mark.parametrize("text", ["", "quadratic", "amdahl", "amdahl:", "amdahl:x", "amdahl:1", "amdahl:-0.1",
                                  "amdahl:nan", "amdahl:inf", "linear:2"])
def test_bad_curves_are_refused(text):
    with pytest.raises(ValueError, match="allowed: linear, or amdahl:P with a serial fraction P >= 0 and < 1"):
        parse_speedup(text)


@pytest.mark.parametrize("text, says", [
    ("amdahl:2", "'amdahl:2' is not a curve"),
    ("pretrain=fast", "'pretrain=fast' is not a curve"),
    ("linear,amdahl:0.1", "two curves for the other classes"),
    ("a=linear,a=linear", "each class once"),
    ("=linear", "each class once"),
])
def test_bad_elastic_speedup_options_are_refused(text, says):
    with pytest.raises(FatalError, match=says):
        SimOptions(elastic_speedup=text)


def test_speedup_table():
    default, by_class = speedup_table("pretrain=amdahl:0.05, linear")
    assert default == Speedup() and by_class == {"pretrain": Speedup("amdahl", 0.05)}
    assert speedup_table("amdahl:0.2") == (Speedup("amdahl", 0.2), {})


@pytest.mark.parametrize("overhead", [-1.0, float("nan"), float("inf")])
def test_bad_overhead_is_refused(overhead):
    with pytest.raises(FatalError, match="resize overhead .*allowed: seconds >= 0"):
        SimOptions(resize_overhead_s=overhead)


def test_gang_bounds_from_a_trace_job():
    g = gang_for(elastic(job("a").gpus(4).workers(2), 1, 8), 8)
    assert (g.workers, g.lo, g.hi, g.elastic, g.per_worker.gpu) == (2, 1, 8, True, 2.0)
    fixed = gang_for(elastic(job("a").gpus(4).workers(2), 2, 2), 8)
    assert (fixed.min_workers, fixed.max_workers, fixed.elastic) == (None, None, False)
    with pytest.raises(SimulationError, match="4 workers, outside min_workers 1 .. max_workers 2"):
        gang_for(elastic(job("a").gpus(4).workers(4), 1, 2), 8)


def test_an_elastic_job_of_a_class_that_is_not_resizable_is_refused():
    fixed = WorkloadClass("train", 100, True)
    with pytest.raises(SimulationError, match="on class train, which is not resizable"):
        replay(trace(elastic(job("a").gpus(2).workers(2), 1, 4)), default_class=fixed)


def test_a_bad_curve_on_a_trace_job_is_refused():
    with pytest.raises(SimulationError, match="job a: speedup 'fast'"):
        replay(trace(elastic(job("a").gpus(2).workers(2), 1, 4, "fast")))


# ------------------------------------------------------------------------------------------------------ traces

HEADER = "id,submit_time,duration,gpus,workers,min_workers,max_workers,speedup\n"


def test_generic_trace_reads_elastic_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "a,0,100,4,2,1,8,amdahl:0.05\nb,5,10,1,,,,\nc,6,10,2,2,,4,LINEAR\n")
    jobs = {j.id: j for j in load_trace(p).jobs}
    assert (jobs["a"].min_workers, jobs["a"].max_workers, jobs["a"].speedup) == (1, 8, "amdahl:0.05")
    assert (jobs["b"].min_workers, jobs["b"].max_workers, jobs["b"].speedup) == (None, None, None)
    assert (jobs["c"].min_workers, jobs["c"].max_workers, jobs["c"].speedup) == (None, 4, "linear")


@pytest.mark.parametrize("row, column, value, allowed", [
    ("a,0,100,4,2,3,8,", "min_workers", "3", "min_workers <= workers <= max_workers"),
    ("a,0,100,4,2,1,1,", "max_workers", "1", "holds its workers (2): min_workers <= workers <= max_workers"),
    ("a,0,100,4,2,4,3,", "max_workers", "3", "an integer >= min_workers (4)"),
    ("a,0,100,4,2,0,3,", "min_workers", "0", "an integer >= 1"),
    ("a,0,100,4,2,1,2.5,", "max_workers", "2.5", "an integer >= 1"),
    ("a,0,100,4,2,1,4,amdahl:1.5", "speedup", "amdahl:1.5", "linear, or amdahl:P"),
    ("a,0,100,4,2,1,4,fast", "speedup", "fast", "linear, or amdahl:P"),
])
def test_bad_elastic_rows_name_row_column_value_and_allowed(tmp_path, row, column, value, allowed):
    p = tmp_path / "t.csv"
    p.write_text(HEADER + row + "\n")
    with pytest.raises(ValidationError) as info:
        load_trace(p)
    errors = info.value.errors
    assert any(path == f"row 2, column {column}" and v == value and allowed in a for path, v, a in errors), errors


def test_windowed_trace_keeps_the_elastic_columns(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "a,0,100,4,2,1,8,linear\nb,50,100,4,2,1,8,amdahl:0.1\n")
    (b,) = load_trace(p, start=10).jobs
    assert (b.submit, b.min_workers, b.max_workers, b.speedup) == (40.0, 1, 8, "amdahl:0.1")


# --------------------------------------------------------------------------------------------------------- CLI


def test_cli_elastic_flags(tmp_path):
    from typer.testing import CliRunner

    from raylane.cli.sim import app

    p = tmp_path / "t.csv"
    p.write_text(HEADER + "a,0,100,4,2,1,8,\nb,5,10,1,,,,\n")
    runner = CliRunner()
    bad = runner.invoke(app, [str(p), "--nodes", "1", "--elastic-speedup", "amdahl:2", "--resize-overhead", "soon",
                              "--no-progress"])
    assert bad.exit_code == 1
    out = " ".join((bad.output or "").split())
    assert "--elastic-speedup: got 'amdahl:2'" in out and "--resize-overhead: got 'soon'" in out
    ok = runner.invoke(app, [str(p), "--nodes", "1", "--elastic-speedup", "train=amdahl:0.05,linear",
                             "--resize-overhead", "2m", "--json", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    (summary,) = json.loads(ok.stdout)["runs"].values()
    assert summary["options"]["elastic_speedup"] == "train=amdahl:0.05,linear"
    assert summary["options"]["resize_overhead_s"] == 120.0
    # b (1 GPU, a's class and priority) takes back what a grew into: a shrinks from 4 workers to 3 and pays the
    # 2-minute resize overhead on its 6 GPUs.
    assert summary["resizes"]["total"] == 1
    assert summary["resizes"]["overhead_gpu_hours"] == pytest.approx(120 * 6 / 3600)
