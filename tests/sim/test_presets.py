"""Every preset names registered policies and replays a trace to the end; strict-order presets may look less deep
per cycle without changing what they decide (beyond ties between equally free nodes)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from raylane.errors import UnknownNameError
from raylane.scheduling import ADMISSIONS, BACKFILLS, ORDERINGS, PREEMPTIONS
from raylane.scheduling.cycle import MAX_EXAMINED
from raylane.scheduling.types import SchedulerConfig
from raylane.sim import COMPARISON, PRESETS, SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset
from raylane.sim import load_trace, summarize
from raylane.sim.presets import HYSTERESIS

from tests.scheduling.builders import team
from tests.sim.builders import PHILLY, TIRESIAS, job, outcome, replay, trace



@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_names_registered_policies(name):
    cfg, opts = apply_preset(get_preset(name), SchedulerConfig(admission="none"), SimOptions())
    assert cfg.ordering in ORDERINGS and cfg.backfill in BACKFILLS and cfg.preemption in PREEMPTIONS
    assert cfg.admission in ADMISSIONS


def test_comparison_lists_known_presets_and_unknown_names_are_refused():
    assert set(COMPARISON) <= set(PRESETS)
    with pytest.raises(UnknownNameError, match="known: .*fifo"):
        get_preset("lifo")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_replays_the_tiresias_trace_to_the_end(name):
    tr = load_trace(TIRESIAS)
    cfg, opts = apply_preset(get_preset(name), SchedulerConfig(admission="none"), SimOptions())
    r = Simulator(tr, cluster_from_flags(4, 4).nodes(), {}, cfg, options=opts).run()
    assert not r.partial and all(f >= 0 for f in r.finish)
    assert all(r.first_start[k] >= job.submit for k, job in enumerate(r.jobs))
    assert all(r.finish[k] - r.first_start[k] >= job.duration - 1e-6 for k, job in enumerate(r.jobs))


def test_strict_fifo_decides_alike_at_any_depth():
    tr = load_trace(PHILLY, start="2017-10-09", end="2017-10-10")
    cfg, opts = apply_preset(get_preset("fifo"), SchedulerConfig(admission="none"), SimOptions())
    nodes = cluster_from_flags(16, 8).nodes()
    shallow = summarize(Simulator(tr, nodes, {}, cfg, options=opts).run())
    deep = summarize(Simulator(tr, nodes, {}, cfg, options=replace(opts, max_examined=MAX_EXAMINED)).run())
    for key in ("mean", "p50", "p95"):
        assert shallow["jct"][key] == pytest.approx(deep["jct"][key], rel=0.01)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preemptive_presets_that_learn_hold_the_hysteresis(name):
    cfg, _ = apply_preset(get_preset(name), SchedulerConfig(admission="none"), SimOptions())
    held = (cfg.hysteresis_min_run_s, cfg.hysteresis_service_fraction)
    if cfg.ordering in ("las", "gittins") or name == "srtf-predicted":
        assert held == (HYSTERESIS["hysteresis_min_run_s"], 0.0) and held[0] == 3600.0
    else:  # the SRTF oracle stays the unconstrained reference
        assert held == (0.0, 0.0)


def test_the_priority_preset_under_quotas_decides_as_a_deep_window_would():
    # Philly 2017-10-09 on 16 x 8 with a nominal quota per virtual cluster livelocked here (the cycles at one instant
    # never settled). In miniature: a's four borrowers fill the priority preset's window of 4; b's job, within b's
    # nominal, waits past it. When x ended, a3 was admitted (a borrower: nothing in quota had been examined), then
    # b0, now inside the window, reclaimed it; a3, requeued ahead of b0, pushed it out again, and so on. In-quota
    # work past the window is examined before any borrower is admitted: b0 reclaims when it arrives, as it would at
    # the live depth.
    tr = trace(*[job(f"a{i}").team("a").runs(1000) for i in range(3)], job("x").team("a").runs(50),
               *[job(f"a{i}").team("a").at(10).runs(100) for i in range(3, 7)], job("b0").team("b").at(20).runs(100))
    teams = {"a": team("a", gpu=2), "b": team("b", gpu=2)}
    shallow = replay(tr, nodes=1, gpus=4, preset="priority", config=dict(admission="quota"), teams=teams)
    deep = replay(tr, nodes=1, gpus=4, preset="priority", config=dict(admission="quota"), teams=teams,
                  max_examined=MAX_EXAMINED)
    assert outcome(shallow) == outcome(deep)
    assert outcome(shallow)["b0"] == (20.0, 120.0, 0) and sum(shallow.preemptions) == 1
