"""Every decision of a set of replays, job for job, as JSON: what a refactor of the core, the simulator or their
drivers must leave unchanged (issue 46's check: "the simulator's reports for the Philly day under every preset and
for the mixes identical before and after").

    python -m tests.bench.sim_decisions OUT.json          # write the decisions
    python -m tests.bench.sim_decisions OUT.json --diff BEFORE.json   # and compare with an earlier run

Replays: the Philly day (2017-10-09, 16 x 8 GPUs) under every preset; the three generated mixes (300 jobs, load
1.1, 12 x 8, seeds 1 and 2) under every preset; the mixes under ``policies/default.yaml`` (4 teams with quotas,
classes with priorities and grace periods, the trace's teams renamed to the policy's and a class drawn per job),
with elastic gangs, with node failures (MTBF) and with a stop delay. Per job: first start, finish, preemptions,
lost work and resizes; per run the summary's figures (wall times left out).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

from raylane.config.loader import load_policy
from raylane.scheduling.types import SchedulerConfig
from raylane.sim import (PRESETS, Outages, SimOptions, Simulator, apply_preset, cluster_from_flags, get_preset,
                         load_trace, summarize)
from raylane.sim.generate import generate
from raylane.sim.traces import Trace

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT / "examples" / "traces" / "philly.csv.gz"
MIXES = ("heavy-tail", "shared-burst", "big-gangs")


def _drop_wall(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_wall(v) for k, v in x.items() if "wall" not in k and not k.endswith("_ms")}
    if isinstance(x, list):
        return [_drop_wall(v) for v in x]
    if isinstance(x, float):
        return None if x != x else round(x, 6)  # NaN: None, which equals itself
    if isinstance(x, str):
        return x.replace(str(ROOT) + "/", "")
    return x


def _run(tr: Trace, nodes, teams, cfg, opts, classes=None) -> Dict[str, Any]:
    r = Simulator(tr, nodes, teams, cfg, classes=classes or {}, options=opts).run()
    jobs = {job.id: [round(r.first_start[k], 6), round(r.finish[k], 6), r.preemptions[k], round(r.lost_work[k], 6),
                     r.resizes[k] if r.resizes else 0] for k, job in enumerate(r.jobs)}
    return {"jobs": jobs, "summary": _drop_wall(json.loads(json.dumps(summarize(r), default=str))),
            "cycles": r.cycles}


def _policy_trace(mix: str, seed: int, policy, elastic: bool) -> Trace:
    """A generated mix on the policy's teams, each job of a class drawn from the policy's (seeded)."""
    tr = generate(mix, seed=seed, jobs=300, cluster_gpus=96, load=1.1, teams=len(policy.teams))
    names = sorted(policy.teams)
    classes = ["pretrain", "finetune", "sweep", "eval", "batch-inference", "data-prep"]
    rng = random.Random(seed)
    jobs = []
    for j in tr.jobs:
        t = names[int(j.team.split("-")[1]) % len(names)]
        kw = dict(team=t, cls=rng.choice(classes))
        if elastic and kw["cls"] in ("pretrain", "finetune", "sweep") and j.gpus >= 8 and rng.random() < 0.5:
            w = max(1, int(j.gpus // 8))
            kw.update(workers=w, min_workers=max(1, w // 2), max_workers=w * 2)
        jobs.append(replace(j, **kw))
    return Trace(jobs, tr.source + f":policy:elastic={elastic}", tr.format)


def runs() -> List[Tuple[str, Any]]:
    out = []
    day = load_trace(str(PHILLY), start="2017-10-09", end="2017-10-10")
    n16 = cluster_from_flags(16, 8).nodes()
    n12 = cluster_from_flags(12, 8).nodes()
    for name in sorted(PRESETS):
        cfg, opts = apply_preset(get_preset(name), SchedulerConfig(admission="none"), SimOptions())
        out.append((f"philly-day/{name}", lambda cfg=cfg, opts=opts: _run(day, n16, {}, cfg, opts)))
    for mix in MIXES:
        for seed in (1, 2):
            tr = generate(mix, seed=seed, jobs=300, cluster_gpus=96, load=1.1)
            for name in sorted(PRESETS):
                cfg, opts = apply_preset(get_preset(name), SchedulerConfig(admission="none"), SimOptions())
                out.append((f"{mix}-{seed}/{name}", lambda tr=tr, cfg=cfg, opts=opts: _run(tr, n12, {}, cfg, opts)))
    pol = load_policy(ROOT / "policies" / "default.yaml")
    cfg = pol.to_scheduler_config()
    teams = pol.core_teams()
    # Elastic gangs need a resizable class: the training classes are made so.
    classes = {name: replace(pol.workload_class(name), resizable=name in ("pretrain", "finetune", "sweep"))
               for name in pol.classes}
    variants = {
        "default": SimOptions(),
        "stop-delay": SimOptions(stop_delay_s=120.0),
        "tick-1s": SimOptions(tick_s=1.0),
        "mtbf": SimOptions(outages=Outages(mtbf_s=20 * 3600.0, repair_s=1800.0), seed=3),
    }
    for mix in MIXES:
        for seed in (0, 1, 2):
            for elastic in (False, True):
                tr = _policy_trace(mix, seed, pol, elastic)
                for vname, opts in variants.items():
                    if vname != "default" and seed != 0:
                        continue
                    if vname in ("tick-1s", "mtbf") and mix != "shared-burst":
                        # a 1 s tick over a trace of days: minutes of replay; failures under a job of days that
                        # restarts from scratch (class eval): it never ends
                        continue
                    out.append((f"{mix}-{seed}/policy{'-elastic' if elastic else ''}/{vname}",
                                lambda tr=tr, opts=opts: _run(tr, n12, teams, cfg, opts, classes)))
    return out


def diff(a: Dict[str, Any], b: Dict[str, Any]) -> List[str]:
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            lines.append(f"{key}: only in {'before' if key not in a else 'after'}")
            continue
        ja, jb = a[key]["jobs"], b[key]["jobs"]
        differ = [j for j in ja if ja[j] != jb.get(j)]
        if differ or a[key]["summary"] != b[key]["summary"]:
            lines.append(f"{key}: {len(differ)} of {len(ja)} jobs differ" + (
                f" (first: {differ[0]} {jb.get(differ[0])} -> {ja[differ[0]]})" if differ else " (summary only)"))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--diff", help="an earlier output to compare with")
    ap.add_argument("--only", help="run only the replays whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    got = {}
    for name, fn in runs():
        if a.only is None or a.only in name:
            t1 = time.perf_counter()
            got[name] = fn()
            if a.verbose:
                print(f"{name}: {time.perf_counter() - t1:.1f} s", flush=True)
    Path(a.out).write_text(json.dumps(got, sort_keys=True))
    print(f"{len(got)} replays, {sum(len(v['jobs']) for v in got.values())} job outcomes in "
          f"{time.perf_counter() - t0:.0f} s -> {a.out}")
    if a.diff:
        before = json.loads(Path(a.diff).read_text())
        if a.only:
            before = {k: v for k, v in before.items() if a.only in k}
        lines = diff(got, before)
        print("\n".join(lines) if lines else f"identical: {len(got)} replays, job for job")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
