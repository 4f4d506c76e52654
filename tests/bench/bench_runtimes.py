"""Runtimes learned from history (issue 43): how good the predictor is, what it does for queue ETAs, and for
schedules, on traces with no runtime estimates at all.

Every replay learns as the live plane does: ``--estimates predicted`` (``raylane.runtimes.RuntimeModel`` trained on
each job's end, nothing else; ``tests/sim/test_predicted.py`` holds it to that). Scenes: the Philly jobs submitted on
2017-10-09 on 16 x 8 GPUs, the three generated mixes (2,000 jobs, seed 0, load 1.1, 32 x 8 GPUs) with 64 users and
their job names (``generate(..., users=64)``: owner-level history exists), and with ``--philly-months`` the Philly
jobs of 2017-10-01 to 2017-11-30 on 70 x 8 GPUs (``deploy/clusters/philly-560.yaml``; minutes per replay). One
shared cluster (admission none), default class.

Parts
- ``predictor``: each job's prediction at its arrival (the median of its distribution) against its runtime: median
  and p90 of |predicted - actual| / actual, by the basis that answered (``RuntimeDist.level``), and with none.
- ``eta``: every ``k``-th job's ETA at its submit (``forecast_interval``, method replay: what ``raylane queue``
  shows right after submit), against the start the replay gave it, for jobs that waited at least 10 minutes:
  median and p90 relative error of the wait, the share whose start fell inside the 10-90% interval, and the share
  of intervals open-ended (past the horizon). Policies: ``las-easy`` (LAS with EASY), the default policy file's
  scheduler (priority, EASY, default preemption) and FIFO + EASY; each with no estimates (the model alone), noisy
  estimates (log-normal, sigma 0.5) and exact ones, folded in by the model (``predicted-declared``).
  ``--arrivals-h H`` forecasts expecting the work of the last H hours to come again in the next H
  (``forecast.expected_arrivals``), to measure whether expecting arrivals helps.
- ``jct``: average JCT over the SRTF oracle's for every preset of ``COMPARISON``, each duration-aware one on
  learned runtimes (``easy`` and ``easy-noisy`` become FIFO + EASY on predictions; the oracle keeps its exact ones).

    python -m tests.bench.bench_runtimes [--part all|predictor|eta|jct|speed] [--samples N] [--philly-months]
                                         [--only SCENE] [--presets P,Q] [--plot PATH] [--arrivals-h H]
"""
from __future__ import annotations

import argparse
import bisect
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import raylane.forecast as fc
from raylane.config.loader import load_policy
from raylane.runtimes import RuntimeModel
from raylane.scheduling.types import SchedulerConfig, Workload
from raylane.sim import COMPARISON, SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset, load_trace
from raylane.sim import summarize
from raylane.sim.cluster import load_cluster
from raylane.sim.generate import MIXES, generate
from tests.bench.bench_eta import tapped

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT / "examples" / "traces" / "philly.csv.gz"
PHILLY_560 = ROOT / "deploy" / "clusters" / "philly-560.yaml"
POLICY = ROOT / "policies" / "default.yaml"
MIN_WAIT_S = 600.0
GOAL_MEDIAN, GOAL_COVER, GOAL_JCT = 0.25, 0.75, 1.10


def _q(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def scenes(args) -> List[Tuple[str, object, list]]:
    out = [("Philly 2017-10-09", load_trace(PHILLY, start="2017-10-09", end="2017-10-10"),
            cluster_from_flags(16, 8).nodes())]
    for mix in MIXES:
        out.append((f"{mix} (64 users)", generate(mix, seed=args.seed, jobs=args.mix_jobs, cluster_gpus=32 * 8,
                                                  load=1.1, users=64), cluster_from_flags(32, 8).nodes()))
    if args.philly_months:
        out.append(("Philly Oct-Nov", load_trace(PHILLY, start="2017-10-01", end="2017-12-01"),
                    load_cluster(PHILLY_560).nodes()))
    if args.only:
        out = [s for s in out if args.only.lower() in s[0].lower()]
    return out


class Recording(RuntimeModel):
    """The replay's model, keeping each prediction it made (in arrival order)."""

    def __init__(self):
        super().__init__()
        self.made: List = []

    def predict(self, f, estimate_s=None):
        d = super().predict(f, estimate_s)
        self.made.append(d)
        return d


def _with_estimates(trace, mode: str, seed: int):
    if mode == "none":
        return trace
    rng = random.Random(seed)
    jobs = [replace(j, estimate=j.duration if mode == "exact" else j.duration * rng.lognormvariate(0.0, 0.5))
            for j in trace.jobs]
    return replace(trace, jobs=jobs)


def _config(policy: str) -> Tuple[SchedulerConfig, SimOptions]:
    base = SchedulerConfig(admission="none")
    if policy == "default policy":
        cfg = replace(load_policy(POLICY).to_scheduler_config(), admission="none")
        return cfg, SimOptions()
    name = {"FIFO + EASY": "easy"}.get(policy, policy)
    return apply_preset(get_preset(name), base, SimOptions())


# ------------------------------------------------------------------------------------------------- predictor


def predictor(args) -> None:
    print("## The predictor's own error: its median at arrival against the runtime, under las-easy")
    print()
    print("| scene | jobs | basis | share | median error | p90 error |")
    print("|---|---|---|---|---|---|")
    for name, trace, nodes in scenes(args):
        cfg, opts = apply_preset(get_preset("las-easy"), SchedulerConfig(admission="none"),
                                 SimOptions(estimates="predicted"))
        sim = Simulator(trace, nodes, {}, cfg, options=opts)
        model = sim.runtime_model = Recording()
        r = sim.run()
        order = sorted(range(len(r.jobs)), key=lambda k: (r.jobs[k].submit, k))
        by: Dict[str, List[float]] = {}
        for k, d in zip(order, model.made):
            actual = max(r.jobs[k].duration, 1.0)
            if d is None:
                by.setdefault("(none yet)", []).append(math.nan)
                continue
            by.setdefault(d.level, []).append(abs(d.runtime() - actual) / actual)
        n = len(model.made)
        everything = [e for v in by.values() for e in v if not math.isnan(e)]
        for level, errs in sorted(by.items(), key=lambda kv: -len(kv[1])) + [("all", everything)]:
            errs = [e for e in errs if not math.isnan(e)]
            share = len(by.get(level, everything)) / n
            print(f"| {name} | {n} | {level} | {share:.0%} | {_q(errs, .5):.0%} | {_q(errs, .9):.0%} |")
    print()


# -------------------------------------------------------------------------------------------------------- eta


def _taker(kw: Dict, window_s: float):
    """A ``bench_eta.Taken`` whose forecasts are ``forecast_interval``'s ETAs (with the expected arrivals of the
    last ``window_s``, when > 0): ``bench_eta.tapped`` takes them as the sampled jobs arrive."""
    from tests.bench.bench_eta import Taken

    def take(state, now, batch, method):
        more = {}
        if window_s > 0:
            i = bisect.bisect_left(taken.history, now - window_s, key=lambda w: w.submit_time)
            more = dict(arrivals=fc.expected_arrivals(taken.history[i:], now, window_s))
        return fc.forecast_interval(state, now, only=list(batch), method=method, **kw, **more)

    taken = Taken(kw, set(), ("replay",), forecast=take)
    return taken


def eta_scene(trace, nodes, policy: str, mode: str, args) -> Dict:
    """``mode``: none, noisy or exact, optionally ``@RULE`` (the model's ``estimate_rule``: learn, trust, cap)."""
    mode, _, rule = mode.partition("@")
    cfg, opts = _config(policy)
    opts = replace(opts, estimates="predicted" if mode == "none" else "predicted-declared", seed=args.seed)
    sim = Simulator(_with_estimates(trace, mode, args.seed), nodes, {}, cfg, options=opts)
    if rule:
        sim.runtime_model = RuntimeModel(estimate_rule=rule)
    every = max(1, len(sim.jobs) // args.samples)
    kw = dict(horizon_s=args.horizon_h * 3600, max_examined=opts.max_examined)
    taken = _taker(kw, args.arrivals_h * 3600)
    taken.sampled = {job.id for job in sim.jobs[::every]}
    t0 = time.perf_counter()
    with tapped(taken):
        r = sim.run()
    wall = time.perf_counter() - t0
    got: Dict[str, Tuple[float, Optional[fc.Eta]]] = taken.got.get("replay", {})
    cpu = [taken.cpu_s.get("replay", 0.0), taken.calls]
    start = {job.id: r.first_start[k] for k, job in enumerate(r.jobs)}
    errs, signed, inside, open_ = [], [], 0, 0
    for wid, (submit, eta) in got.items():
        s = start.get(wid, -1.0)
        if s < 0 or eta is None:
            continue
        actual = s - submit
        if actual < MIN_WAIT_S:
            continue
        f = (eta.start - submit) if eta.start is not None else kw["horizon_s"]
        errs.append(abs(f - actual) / actual)
        signed.append((f - actual) / actual)
        lo = eta.start_low if eta.start_low is not None else eta.start
        hi = eta.start_high
        if hi is None:
            open_ += 1
        if lo is not None and lo <= s + 1e-6 and (hi is None or s <= hi + 1e-6):
            inside += 1
    n = len(errs)
    return dict(errs=errs, signed=signed, waited=n, sampled=len(got), cover=inside / n if n else math.nan,
                open=open_ / n if n else math.nan, ms=1e3 * cpu[0] / max(1, cpu[1]), wall=wall,
                rows=[(start[w] - s0, (e.start - s0) if e and e.start is not None else None)
                      for w, (s0, e) in got.items() if start.get(w, -1) >= 0])


def eta(args) -> Dict:
    print("## Queue ETA at submit with learned runtimes (jobs that waited >= 10 min)")
    print()
    print("| scene | policy | estimates | waited | median error | p90 error | signed median | inside 80% "
          "interval | open-ended | CPU per forecast |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for name, trace, nodes in scenes(args):
        for policy in args.policies:
            for mode in args.modes:
                m = eta_scene(trace, nodes, policy, mode, args)
                results[(name, policy, mode)] = m
                print(f"| {name} | {policy} | {mode} | {m['waited']} | {_q(m['errs'], .5):.0%} | "
                      f"{_q(m['errs'], .9):.0%} | {_q(m['signed'], .5):+.0%} | {m['cover']:.0%} | "
                      f"{m['open']:.0%} | {m['ms']:.1f} ms |", flush=True)
    print()
    for name, trace, nodes in scenes(args) if args.jct_rules else ():
        for mode in [m for m in args.modes if "@" in m]:
            cfg, opts = _config("FIFO + EASY")
            sim = Simulator(_with_estimates(trace, mode.partition("@")[0], args.seed), nodes, {}, cfg,
                            options=replace(opts, estimates="predicted-declared", seed=args.seed))
            sim.runtime_model = RuntimeModel(estimate_rule=mode.partition("@")[2])
            print(f"JCT {name} FIFO + EASY {mode}: {summarize(sim.run())['jct']['mean']:,.0f} s")
    none = [(k, m) for k, m in results.items() if k[2] == "none" and m["errs"]]
    worst_med = max(((_q(m["errs"], .5), k) for k, m in none), default=(math.nan, None))
    worst_cov = min(((m["cover"], k) for k, m in none), default=(math.nan, None))
    print(f"goal, no estimates: median error <= {GOAL_MEDIAN:.0%} on every scene and policy: "
          f"{'met' if worst_med[0] <= GOAL_MEDIAN else 'NOT met'} (worst {worst_med[0]:.0%}: {worst_med[1]})")
    print(f"goal, no estimates: >= {GOAL_COVER:.0%} of starts inside the interval: "
          f"{'met' if worst_cov[0] >= GOAL_COVER else 'NOT met'} (worst {worst_cov[0]:.0%}: {worst_cov[1]})")
    print()
    return results


# -------------------------------------------------------------------------------------------------------- jct


def jct(args) -> None:
    print("## Average JCT over the SRTF oracle's, duration-aware presets on learned runtimes")
    print()
    names = [p for p in args.presets.split(",") if p]
    if "srtf-oracle" not in names:
        names.append("srtf-oracle")
    table = []
    for name, trace, nodes in scenes(args):
        row = {}
        for p in names:
            cfg, opts = apply_preset(get_preset(p), SchedulerConfig(admission="none"), SimOptions(seed=args.seed))
            if opts.estimates in ("exact", "noisy") and p != "srtf-oracle":
                opts = replace(opts, estimates="predicted")
            t0 = time.perf_counter()
            row[p] = summarize(Simulator(trace, nodes, {}, cfg, options=opts).run())["jct"]["mean"]
            print(f"  {name}: {p} {row[p]:,.0f} s ({time.perf_counter() - t0:.0f} s)", flush=True)
        table.append((name, row))
    print()
    print("| scene | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for name, row in table:
        o = row["srtf-oracle"]
        print(f"| {name} | " + " | ".join(f"{row[p] / o:.2f}x" for p in names) + " |")
    print()
    learned = [p for p in names if p != "srtf-oracle"]
    for name, row in table:
        best = min(learned, key=lambda p: row[p])
        r = row[best] / row["srtf-oracle"]
        print(f"{name}: best without durations {best} {r:.2f}x the oracle "
              f"({'within' if r <= GOAL_JCT else 'NOT within'} {GOAL_JCT:.2f}x)")
    print()


# ------------------------------------------------------------------------------------------------------ speed


def speed(args) -> None:
    """bench_eta's speed scene (100 nodes x 8 GPUs, 1,000 pending, the default policy's scheduler and quotas), every
    workload with a learned runtime (a model fed 3,000 runs of the scene's own duration law by team, class and gang
    shape), forecast by the plan (what the control plane uses past 100 pending): ``forecast`` and
    ``forecast_interval`` against the same scene without predictions, CPU time, min and median of ``--runs``."""
    import tests.bench.bench_eta as be
    from raylane.runtimes import RunFeatures

    rng = random.Random(7)
    model = RuntimeModel()
    real = be.Workload
    for _ in range(3000):
        g = rng.choices((1, 2, 4, 8, 16, 32), weights=(60, 10, 10, 10, 6, 4))[0]
        cls = rng.choice(("pretrain", "finetune", "sweep", "eval", "batch-inference"))
        model.observe(RunFeatures(f"team-{rng.randrange(8)}", cls, float(g), max(1, g // 8)),
                      min(max(1800 * math.exp(rng.gauss(0, 1.4)), 60), 4 * 86400))

    def learned(*a, **kw):
        w = real(*a, **kw)
        f = RunFeatures(w.team, w.cls.name, w.gang.total.gpu, w.gang.workers)
        return replace(w, predicted=model.predict(f, w.runtime_estimate_s))

    plain, now = be.speed_scene()
    be.Workload = learned
    try:
        scene, _ = be.speed_scene()
    finally:
        be.Workload = real

    def cpu(f) -> Tuple[float, float]:
        xs = []
        for _ in range(args.runs):
            c = time.process_time()
            f()
            xs.append(1e3 * (time.process_time() - c))
        return min(xs), sorted(xs)[len(xs) // 2]

    print("## Forecast speed, 1,000 pending on 100 nodes (plan), CPU ms min / median of", args.runs)
    print()
    print("| state | forecast | forecast_interval | interval / plain forecast |")
    print("|---|---|---|---|")
    base = cpu(lambda: fc.forecast(plain, now, method="plan"))
    one = cpu(lambda: fc.forecast(scene, now, method="plan"))
    three = cpu(lambda: fc.forecast_interval(scene, now, method="plan"))
    print(f"| estimates only (no predictions) | {base[0]:.1f} / {base[1]:.1f} | (= forecast) | |")
    print(f"| learned runtimes | {one[0]:.1f} / {one[1]:.1f} | {three[0]:.1f} / {three[1]:.1f} | "
          f"{three[1] / base[1]:.2f}x |")
    print(f"goal: a forecast of 1,000 pending on 100 nodes at most 50 ms: median forecast {one[1]:.1f} ms "
          f"({'met' if one[1] <= 50 else 'NOT met'}), with the interval {three[1]:.1f} ms "
          f"({'met' if three[1] <= 50 else 'NOT met'})")
    print()


def plot(results: Dict, path: Path) -> None:
    """A calibration plot: forecast wait against actual wait, per policy, no estimates."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    policies = list(dict.fromkeys(k[1] for k in results))
    fig, axes = plt.subplots(1, len(policies), figsize=(5.5 * len(policies), 5), sharey=True, squeeze=False)
    for ax, policy in zip(axes[0], policies):
        for (name, pol, mode), m in results.items():
            if pol != policy or mode != "none":
                continue
            pts = [(a / 3600, f / 3600) for a, f in m["rows"] if f is not None and a >= MIN_WAIT_S]
            if pts:
                ax.scatter([a for a, _ in pts], [max(f, 1e-3) for _, f in pts], s=8, alpha=0.6, label=name)
        lim = [MIN_WAIT_S / 3600, 200]
        ax.plot(lim, lim, color="black", lw=0.8)
        ax.plot(lim, [0.75 * x for x in lim], color="gray", lw=0.6, ls="--")
        ax.plot(lim, [1.25 * x for x in lim], color="gray", lw=0.6, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{policy}: no estimates, learned runtimes")
        ax.set_xlabel("actual wait (hours)")
        ax.grid(True, which="both", alpha=0.25)
    axes[0][0].set_ylabel("wait forecast at submit (hours)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Queue ETA at submit vs actual start (waited >= 10 min; dashed: +-25%)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "predictor", "eta", "jct", "speed"), default="all")
    ap.add_argument("--runs", type=int, default=7, help="--part speed: timed runs of each")
    ap.add_argument("--samples", type=int, default=300, help="jobs forecast per scene, policy and estimate mode")
    ap.add_argument("--mix-jobs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--horizon-h", type=float, default=fc.DEFAULT_HORIZON_S / 3600)
    ap.add_argument("--philly-months", action="store_true", help="add Philly Oct-Nov on 560 GPUs (slow)")
    ap.add_argument("--only", default="", help="only the scenes whose name contains this")
    ap.add_argument("--presets", default=",".join(COMPARISON), help="--part jct: the presets to compare")
    ap.add_argument("--policies", default="las-easy,default policy,FIFO + EASY")
    ap.add_argument("--modes", default="none,noisy,exact",
                    help="estimate modes, each none, noisy or exact, optionally @learn, @trust or @cap")
    ap.add_argument("--jct-rules", action="store_true", help="with @RULE modes: also each rule's average JCT")
    ap.add_argument("--plot", default=None, help="write the calibration plot (PNG) here")
    ap.add_argument("--arrivals-h", type=float, default=0.0,
                    help="forecast expecting the arrivals of the last H hours to come again (0: none)")
    args = ap.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    args.modes = [m for m in args.modes.split(",") if m]
    if args.part in ("all", "predictor"):
        predictor(args)
    if args.part in ("all", "eta"):
        results = eta(args)
        if args.plot:
            plot(results, Path(args.plot))
    if args.part in ("all", "jct"):
        jct(args)
    if args.part in ("all", "speed"):
        speed(args)


if __name__ == "__main__":
    main()
