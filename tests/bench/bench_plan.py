"""Pipeline planners against the exact optimum, and their speed.

Clusters (``tests/planning/gen.py``, ``random_instance``): 3-5 nodes of 8 or 16 cpu, 32 or 64 GB, features gpu and
ssd each with probability 0.4 (4 GPUs with gpu); links of 10, 20, 30 or 60 GB/h (half the pairs drawn, the rest at
a drawn default); about one node in three has storage of 10 or 20 GB/h (``storage_gbps`` 10/3600 or 20/3600), which
binds on links faster than that. The 1,000-stage cluster (``large_instance``) has no storage limits.

Printed:
- over ``--n`` seeded random pipelines of 2-10 stages on those clusters (durations in quarter hours, transfers in
  whole minutes, so CP-SAT's minute resolution is exact), in two families (``dense``: each stage needs each earlier
  one with probability 0.4; ``tight``: 0.15, and stages that take half to all of a node's cpu, so capacity binds):
  the gap of HEFT and OLB to CP-SAT's makespan (mean, max, how often optimal), how many CP-SAT proved optimal within
  ``--time-limit`` seconds, and in how many storage changed the optimum (CP-SAT again with no storage limits);
- CP-SAT's time to proof on random pipelines of exactly 10 stages (median, max), beside HEFT's time on the same;
- CP-SAT on 50 and 100 tight stages on 10 nodes within ``--time-limit``: status, makespan, bound, HEFT beside it;
- HEFT's and OLB's wall time for one pipeline of 1,000 stages on 100 nodes (each stage needs up to 3 of the 50
  stages before it), and the ratio between them.

    python -m tests.bench.bench_plan [--n 100] [--time-limit 10] [--workers 2] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from typing import List, Optional

from raylane.planning import (
    CpSatPlanner, HeftPlanner, Network, OlbPlanner, Pipeline, PlanNode, PlanStatus, Stage, verify,
)
from tests.planning.gen import FEATURES, random_instance


def large_instance(rng: random.Random, n_stages: int = 1000, n_nodes: int = 100):
    nodes = []
    for i in range(n_nodes):
        feats = {f for f in FEATURES if rng.random() < 0.3}
        nodes.append(PlanNode(f"n{i}", rng.choice("abc"), cpu=rng.choice((32, 64)), memory_gb=rng.choice((128, 256)),
                              gpu=8 if "gpu" in feats else 0, features=feats))
    stages = []
    for i in range(n_stages):
        feats = {f for f in FEATURES if rng.random() < 0.15}
        window = range(max(0, i - 50), i)
        needs = tuple(f"s{j}" for j in sorted(rng.sample(window, min(len(window), rng.randint(0, 3)))))
        stages.append(Stage(f"s{i}", cpu=rng.choice((4, 8, 16)), memory_gb=rng.choice((16, 32, 64)),
                            gpu=rng.choice((1, 4)) if "gpu" in feats else 0, features=feats,
                            duration_h=rng.randint(1, 40) / 4, output_gb=rng.randint(0, 50), needs=needs))
    links = {(f"n{rng.randrange(n_nodes)}", f"n{rng.randrange(n_nodes)}"): rng.choice((20.0, 60.0)) for _ in range(200)}
    links = {k: v for k, v in links.items() if k[0] != k[1]}
    return Pipeline(tuple(stages)), nodes, Network(default_gb_per_h=10.0, links=links)


def _fmt(xs: List[float]) -> str:
    return f"mean {statistics.mean(xs):6.1%}  max {max(xs):6.1%}  optimal in {sum(x < 1e-9 for x in xs)}/{len(xs)}"


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100, help="random pipelines for the gap figures")
    ap.add_argument("--time-limit", type=float, default=10.0, help="CP-SAT seconds per pipeline")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT search workers")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cpsat = CpSatPlanner(time_limit_s=args.time_limit, workers=args.workers)
    heft, olb = HeftPlanner(), OlbPlanner()

    for family, tight in (("dense", False), ("tight", True)):
        gaps = {"heft": [], "olb": []}
        proven, sizes, limited, bound_by_storage = 0, [], 0, 0
        for i in range(args.n):
            inst = random_instance(random.Random(args.seed * 100_003 + i), max_stages=10, min_nodes=3, max_nodes=5,
                                   tight=tight)
            sizes.append(len(inst[0].stages))
            best = cpsat.plan(*inst)
            proven += best.status is PlanStatus.OPTIMAL
            if any(n.storage_gbps for n in inst[1]):
                limited += 1
                free = [replace(n, storage_gbps=0.0) for n in inst[1]]
                bound_by_storage += cpsat.plan(inst[0], free, inst[2]).makespan_h < best.makespan_h - 1e-9
            for name, planner in (("heft", heft), ("olb", olb)):
                report = verify(*inst, planner.plan(*inst), best_known_h=best.makespan_h)
                if not report.ok:
                    raise RuntimeError(f"{name} plan fails the verifier on instance {i}:\n{report.render()}")
                gaps[name].append(report.gap)
        print(f"gap to CP-SAT over {args.n} {family} random pipelines of {min(sizes)}-{max(sizes)} stages (mean "
              f"{statistics.mean(sizes):.1f}) on 3-5 nodes; CP-SAT proved {proven}/{args.n} optimal "
              f"within {args.time_limit:g} s each; {limited} have nodes with storage limits, which lengthen the "
              f"optimum of {bound_by_storage}")
        for name in ("heft", "olb"):
            print(f"  {name:5s} {_fmt(gaps[name])}")

    t_proof, t_heft, unproven = [], [], 0
    rng = random.Random(args.seed + 7)
    k = 0
    while len(t_proof) + unproven < min(args.n, 20):
        inst = random_instance(random.Random(rng.randrange(1 << 30)), max_stages=10, min_nodes=3, max_nodes=5)
        k += 1
        if len(inst[0].stages) != 10:
            continue
        t0 = time.perf_counter()
        plan = cpsat.plan(*inst)
        t1 = time.perf_counter()
        heft.plan(*inst)
        t_heft.append(time.perf_counter() - t1)
        if plan.status is PlanStatus.OPTIMAL:
            t_proof.append(t1 - t0)
        else:
            unproven += 1
    if t_proof:
        print(f"CP-SAT time to proof at 10 stages, 3-5 nodes ({len(t_proof)} pipelines, {args.workers} workers): "
              f"median {statistics.median(t_proof) * 1e3:.0f} ms, max {max(t_proof) * 1e3:.0f} ms; "
              f"{unproven} not proven within {args.time_limit:g} s; HEFT on the same: median "
              f"{statistics.median(t_heft) * 1e3:.2f} ms (CP-SAT/HEFT {statistics.median(t_proof) / statistics.median(t_heft):.0f}x)")

    for n_stages in (50, 100):
        inst = random_instance(random.Random(n_stages), n_stages=n_stages, min_nodes=10, max_nodes=10, tight=True)
        t0 = time.perf_counter()
        plan = cpsat.plan(*inst)
        took = time.perf_counter() - t0
        h = heft.plan(*inst).makespan_h
        print(f"CP-SAT at {n_stages} stages x 10 nodes (tight): {plan.status.value} in {took:.1f} s, makespan "
              f"{plan.makespan_h:.2f} h, bound {plan.bound_h:.2f} h (gap to bound "
              f"{plan.makespan_h / plan.bound_h - 1:.1%}); HEFT {h:.2f} h ({h / plan.makespan_h - 1:+.1%})"
              + (f"; {plan.note}" if plan.note else ""))

    inst = large_instance(random.Random(args.seed))
    times = {}
    for name, planner in (("heft", heft), ("olb", olb)):
        t0 = time.perf_counter()
        plan = planner.plan(*inst)
        times[name] = time.perf_counter() - t0
        print(f"{name} on 1,000 stages x 100 nodes: {times[name]:.2f} s, makespan {plan.makespan_h:.1f} h, "
              f"verifier {'ok' if verify(*inst, plan).ok else 'FAILED'}")
    print(f"  heft/olb time ratio {times['heft'] / times['olb']:.2f}")


if __name__ == "__main__":
    main()
