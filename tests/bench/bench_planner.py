"""The default planner (``best``) and HEFT against the proven optimum on small locality-heavy pipelines.

Instances: ``tests/planning/gen.py``'s ``locality_instance``, seeds ``--seed * 100_003 + i`` for ``i < --n``: 3-7
stages on 2-4 nodes of three types, outputs of 10-60 GB on links of 10-30 GB/h, chains and fork-joins, each stage
fastest on some node type. Durations are quarter hours and transfers whole minutes, so CP-SAT's model is exact and
its OPTIMAL a proof. The optimum: CP-SAT with ``--proof-limit`` seconds (a separate, longer run than the default
planner's own), checked against the exhaustive search (an independent solver) on every instance of at most 7 stages.

Printed: how many optima were proven, then for HEFT, OLB and the default planner the ratio of their makespan to the
optimum over the proven instances (mean, max, how many within 2%, how many optimal), and the default planner's wall
time beside HEFT's. No timing is asserted.

    python -m tests.bench.bench_planner [--n 44] [--seed 0] [--proof-limit 10]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Dict, List, Optional

from raylane.planning import PLANNERS, CpSatPlanner, PlanStatus, exhaustive_plan, verify
from raylane.planning.exhaustive import MAX_STAGES
from tests.planning.gen import locality_instance


def _fmt(ratios: List[float]) -> str:
    return (f"mean {statistics.mean(ratios):.3f}  max {max(ratios):.3f}  within 2% in "
            f"{sum(r <= 1.02 + 1e-9 for r in ratios)}/{len(ratios)}  optimal in "
            f"{sum(r <= 1 + 1e-9 for r in ratios)}/{len(ratios)}")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=44, help="locality-heavy pipelines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--proof-limit", type=float, default=10.0, help="CP-SAT seconds per pipeline for the optimum")
    args = ap.parse_args(argv)
    prover = CpSatPlanner(time_limit_s=args.proof_limit)
    planners = {name: PLANNERS.get(name) for name in ("heft", "olb", "best")}
    ratios: Dict[str, List[float]] = {name: [] for name in planners}
    seconds: Dict[str, float] = {name: 0.0 for name in planners}
    proven = checked = 0
    sizes = []
    for i in range(args.n):
        inst = locality_instance(random.Random(args.seed * 100_003 + i))
        sizes.append(len(inst[0].stages))
        optimum = prover.plan(*inst)
        if optimum.status is not PlanStatus.OPTIMAL:
            continue
        proven += 1
        if len(inst[0].stages) <= MAX_STAGES:
            exact = exhaustive_plan(*inst)
            if abs(exact.makespan_h - optimum.makespan_h) > 1e-6:
                raise RuntimeError(f"instance {i}: CP-SAT's optimum {optimum.makespan_h} h, exhaustive "
                                   f"{exact.makespan_h} h")
            checked += 1
        for name, planner in planners.items():
            t0 = time.perf_counter()
            plan = planner.plan(*inst)
            seconds[name] += time.perf_counter() - t0
            report = verify(*inst, plan, best_known_h=optimum.makespan_h)
            if not report.ok:
                raise RuntimeError(f"{name} plan fails the verifier on instance {i}:\n{report.render()}")
            ratios[name].append(plan.makespan_h / optimum.makespan_h)
    print(f"{args.n} locality-heavy pipelines of {min(sizes)}-{max(sizes)} stages (mean {statistics.mean(sizes):.1f}) "
          f"on 2-4 nodes: CP-SAT proved the optimum of {proven}/{args.n} within {args.proof_limit:g} s each; the "
          f"exhaustive search agrees on {checked}/{proven}")
    if not proven:
        return
    print("makespan / proven optimum:")
    for name in planners:
        label = f"{name} (default)" if name == PLANNERS.default else name
        print(f"  {label:14s} {_fmt(ratios[name])}")
    print(f"wall time over the {proven}: best {seconds['best'] * 1e3:.0f} ms, heft {seconds['heft'] * 1e3:.1f} ms "
          f"(best/heft {seconds['best'] / max(seconds['heft'], 1e-9):.0f}x)")


if __name__ == "__main__":
    main()
