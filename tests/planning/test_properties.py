"""Property tests on seeded random small pipelines (<= 5 stages, 2-3 nodes); purity is in tests/scheduling/test_purity.py."""
import random

import pytest

from raylane.planning import PLANNERS, PlanStatus, exhaustive_plan, verify
from tests.planning.gen import random_instance

SEEDS = range(60)
TIGHT_SEEDS = range(40)  # few dependencies, big stages: capacity binds the optimum in 13 of these 40


@pytest.fixture(scope="module")
def instances():
    out = []
    for seed in SEEDS:
        inst = random_instance(random.Random(seed))
        out.append((seed, inst, exhaustive_plan(*inst)))
    for seed in TIGHT_SEEDS:
        inst = random_instance(random.Random(seed), tight=True)
        out.append((f"tight-{seed}", inst, exhaustive_plan(*inst)))
    return out


def test_cpsat_equals_exhaustive(instances):
    cpsat = PLANNERS.get("cpsat")
    for seed, inst, best in instances:
        plan = cpsat.plan(*inst)
        assert plan.status is PlanStatus.OPTIMAL, seed
        assert plan.makespan_h == pytest.approx(best.makespan_h), seed
        assert verify(*inst, plan).ok, (seed, verify(*inst, plan).render())


@pytest.mark.parametrize("name", ["heft", "olb"])
def test_heuristic_plans_pass_the_verifier_and_never_beat_the_optimum(instances, name):
    planner = PLANNERS.get(name)
    worse = 0
    for seed, inst, best in instances:
        plan = planner.plan(*inst)
        report = verify(*inst, plan, best_known_h=best.makespan_h)
        assert report.ok, (seed, report.render())
        assert report.gap >= -1e-9, seed
        worse += report.gap > 1e-9
    # The instances are varied enough that a heuristic misses the optimum somewhere.
    assert worse > 0


def test_exhaustive_plans_pass_the_verifier(instances):
    for seed, inst, best in instances:
        assert verify(*inst, best).ok, seed


@pytest.mark.parametrize("name", PLANNERS.names())
def test_conformance_every_registered_planner(instances, name):
    """Every planner: deterministic, every stage placed once, the verifier accepts it, the makespan claimed exactly."""
    planner = PLANNERS.get(name)
    for seed, inst, best in instances[:20]:
        plan = planner.plan(*inst)
        assert [p.stage for p in plan.placements] == [s.name for s in inst[0].stages], seed
        assert verify(*inst, plan).ok, seed
        again = planner.plan(*inst)
        assert again.makespan_h == plan.makespan_h, seed
        assert plan.planner == name


def test_cpsat_under_a_short_time_limit_still_returns_a_valid_plan_with_its_bound():
    from raylane.planning import CpSatPlanner

    inst = random_instance(random.Random(30), n_stages=30, min_nodes=6, max_nodes=6, tight=True)
    plan = CpSatPlanner(time_limit_s=0.05, workers=1).plan(*inst)
    heft = PLANNERS.get("heft").plan(*inst)
    assert verify(*inst, plan).ok
    assert plan.makespan_h <= heft.makespan_h + 1e-9  # HEFT is its hint: never worse
    assert plan.bound_h is not None and plan.bound_h <= plan.makespan_h + 1e-9
    assert (plan.status is PlanStatus.OPTIMAL) == (plan.bound_h >= plan.makespan_h - 1e-9)


def test_storage_limits_bind_in_some_instances(instances):
    """The generator's slow storage changes the optimum somewhere: without it, some optima are shorter."""
    from dataclasses import replace

    shorter = 0
    for seed, (pipeline, nodes, network), best in instances:
        assert network.storage_gb_per_h == {}  # storage comes from the nodes only
        free = [replace(n, storage_gbps=0.0) for n in nodes]
        shorter += exhaustive_plan(pipeline, free, network).makespan_h < best.makespan_h - 1e-9
    assert shorter > 0
