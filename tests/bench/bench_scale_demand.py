"""Autoscaling demand on learned runtimes (issue 43 item 3): should a gang that waits for room ask for new nodes
when its room is predicted to come sooner than a new node would join?

Today every gang that waits for capacity makes demand (``raylane.scheduling.autoscale.compute_demand``). With
runtimes learned from history, the head of the queue under EASY backfill carries its reservation's start
(``Reserved.start``: when the leases it waits for are predicted to end). The variant measured here withholds the
demand of such a head whose reserved start is within ``--join-s`` (the node groups' start-up time) of now: a node
bought for it would arrive after its room. Both runs replay the same trace on the same autoscaled cluster file
(the big-gangs scene of docs/autoscaling.md, or ``--trace``/``--cluster``) under a preset that learns runtimes
(EASY backfill on predictions), and print GPU-hours bought, cost and average JCT, and the ratios of the variant to
today's rule. The variant is played by filtering the pending decisions the simulator's fleet hands the demand
computation (``Fleet.rescale``); nothing in the product changes.

    python -m tests.bench.bench_scale_demand [--preset srtf-predicted] [--join-s 180] [--seed 1]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import raylane.sim.autoscaled as autoscaled
from raylane.scheduling.types import Reserved, SchedulerConfig
from raylane.sim import SimOptions, Simulator, apply_preset, get_preset, summarize
from raylane.sim.cluster import load_cluster
from raylane.sim.generate import generate

ROOT = Path(__file__).resolve().parents[2]


def run(trace, spec, preset: str, seed: int):
    cfg, opts = apply_preset(get_preset(preset), SchedulerConfig(admission="none"), SimOptions(seed=seed))
    r = Simulator(trace, spec.nodes(), {}, cfg, options=opts, cluster=spec).run()
    s = summarize(r)
    return s


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="srtf-predicted")
    ap.add_argument("--join-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cluster", default=str(ROOT / "deploy" / "clusters" / "big-gangs-autoscaled.yaml"))
    args = ap.parse_args(argv)
    spec = load_cluster(args.cluster)
    trace = generate("big-gangs", seed=args.seed, jobs=2000, cluster_gpus=320, load=0.4, users=64)
    base = run(trace, spec, args.preset, args.seed)
    real = autoscaled.Fleet.rescale
    withheld = [0]

    def rescale(self, now, pending, nodes, flavor_room=()):
        kept = []
        for p in pending:
            if isinstance(p.reason, Reserved) and p.reason.start - now <= args.join_s:
                withheld[0] += 1
                continue
            kept.append(p)
        return real(self, now, kept, nodes, flavor_room)

    autoscaled.Fleet.rescale = rescale
    try:
        variant = run(trace, spec, args.preset, args.seed)
    finally:
        autoscaled.Fleet.rescale = real
    print(f"big-gangs (2,000 jobs, seed {args.seed}, 64 users) on {Path(args.cluster).name}, preset {args.preset}, "
          f"heads withheld {withheld[0]} times")
    print()
    print("| rule | GPU-h bought | cost | JCT avg (s) |")
    print("|---|---|---|---|")
    for name, s in (("every capacity wait asks (today)", base), ("a head whose room comes within the join time "
                                                               "does not", variant)):
        c = s["capacity"]
        print(f"| {name} | {c['gpu_hours']:,.0f} | {c['cost']:,.0f} | {s['jct']['mean']:,.0f} |")
    cb, cv = base["capacity"], variant["capacity"]
    print(f"\nvariant / today: cost {cv['cost'] / cb['cost']:.3f}x, GPU-hours {cv['gpu_hours'] / cb['gpu_hours']:.3f}x, "
          f"JCT {variant['jct']['mean'] / base['jct']['mean']:.3f}x")


if __name__ == "__main__":
    main()
