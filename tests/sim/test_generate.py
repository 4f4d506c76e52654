"""The trace generator: each mix has the shape it promises, a seed gives the same trace everywhere, bad parameters
are refused naming the field, and a generated trace written as CSV replays like the one in memory. Pure: no Ray."""
from __future__ import annotations

import random
import statistics

import pytest

from raylane.errors import UnknownNameError, ValidationError
from raylane.sim import SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset, load_trace, summarize
from raylane.sim.generate import MIXES, generate, write_csv
from raylane.scheduling.types import SchedulerConfig

DAY = 86400.0


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_a_seed_gives_the_same_trace_and_another_seed_another(mix):
    a = generate(mix, seed=7, jobs=500)
    random.seed(123)  # the global random state plays no part
    b = generate(mix, seed=7, jobs=500)
    assert a.jobs == b.jobs and a.source == b.source
    assert generate(mix, seed=8, jobs=500).jobs != a.jobs


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_every_trace_is_sorted_from_zero_with_the_asked_load(mix):
    tr = generate(mix, seed=1, jobs=1000, cluster_gpus=256, load=0.8)
    submits = [j.submit for j in tr.jobs]
    assert len(tr.jobs) == 1000 and submits == sorted(submits) and submits[0] == 0.0
    assert len({j.id for j in tr.jobs}) == 1000
    assert all(j.duration > 0 and j.gpus > 0 for j in tr.jobs)
    # The load counts each job up to the span's length; Poisson arrivals (and bursts) end near, not exactly at, the
    # span the load asks for.
    span = tr.span()
    asked = sum(j.gpus * min(j.duration, span) for j in tr.jobs)
    assert asked / (span * 256) == pytest.approx(0.8, rel=0.25)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_heavy_tail_has_jobs_of_weeks_beside_many_short_ones(seed):
    tr = generate("heavy-tail", seed=seed, jobs=2000)
    d = [j.duration for j in tr.jobs]
    weeks = [x for x in d if x >= 7 * DAY]
    assert statistics.median(d) < 3600
    assert 5 <= len(weeks) <= 60  # about 1% of 2,000
    assert max(d) <= 28 * DAY + 1
    # The few long jobs ask for most of the GPU-time.
    assert sum(j.duration * j.gpus for j in tr.jobs if j.duration >= 7 * DAY) > 0.5 * tr.gpu_seconds()


@pytest.mark.parametrize("seed", [0, 1])
def test_shared_burst_has_bursts_of_fractional_jobs(seed):
    tr = generate("shared-burst", seed=seed, jobs=2000)
    shared = [j for j in tr.jobs if j.workers and j.gpus / j.workers < 1]
    assert {j.gpus / j.workers for j in shared} == {0.25, 0.5}
    assert 0.5 < len(shared) / len(tr.jobs) < 0.7
    assert all(j.gpus == int(j.gpus) for j in tr.jobs if j not in shared)
    # Bursts: most shared jobs arrive within ten minutes of 20 others.
    times = sorted(j.submit for j in shared)
    crowded = sum(1 for k, t in enumerate(times) if k + 19 < len(times) and times[k + 19] - t <= 600)
    assert crowded > 0.5 * len(times)


@pytest.mark.parametrize("seed", [0, 1])
def test_big_gangs_has_gangs_up_to_64_gpus_on_whole_nodes(seed):
    tr = generate("big-gangs", seed=seed, jobs=2000)
    gangs = [j for j in tr.jobs if j.gpus >= 16]
    assert {j.gpus for j in gangs} == {16, 32, 64}
    assert all(j.workers == j.gpus // 8 for j in gangs)
    assert 0.08 < len(gangs) / len(tr.jobs) < 0.16
    assert max(j.gpus for j in tr.jobs) == 64


def test_bad_parameters_are_refused_naming_each():
    with pytest.raises(ValidationError) as exc:
        generate("big-gangs", jobs=0, cluster_gpus=32, load=-1, teams=0)
    text = str(exc.value)
    for field, value in (("jobs", "0"), ("cluster_gpus", "32"), ("load", "-1"), ("teams", "0")):
        assert f"{field}: got {value}" in text
    assert ">= 64" in text  # big-gangs needs room for its 64-GPU gang
    with pytest.raises(UnknownNameError, match="heavy-tail"):
        generate("long-tail")


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_written_csv_reads_back_as_the_same_trace(mix, tmp_path):
    tr = generate(mix, seed=3, jobs=300)
    back = load_trace(write_csv(tr, tmp_path / "t.csv"))
    assert back.format == "generic"
    assert [(j.id, j.submit, j.duration, j.gpus, j.team) for j in back.jobs] == \
        [(j.id, j.submit, j.duration, j.gpus, j.team) for j in tr.jobs]
    assert [j.workers or None for j in back.jobs] == [j.workers for j in tr.jobs]


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_every_mix_replays_to_the_end_under_las_easy(mix):
    tr = generate(mix, seed=0, jobs=200, cluster_gpus=128)
    cfg, opts = apply_preset(get_preset("las-easy"), SchedulerConfig(admission="none"), SimOptions())
    r = Simulator(tr, cluster_from_flags(16, 8).nodes(), {}, cfg, options=opts).run()
    s = summarize(r)
    assert not r.partial and not r.rejected and s["jobs"]["unfinished"] == 0
    assert s["preemptions"]["per_hour"]["max"] <= 1.0
