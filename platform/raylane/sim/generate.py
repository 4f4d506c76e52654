"""Synthetic job traces: named workload mixes that differ from Philly, drawn from a seed, for checking that a policy
holds beyond one trace.

This module owns the mixes and how a trace is drawn from one. It returns an ordinary ``Trace`` of ``TraceJob``
(what ``load_trace`` returns) and can write it in the generic CSV format (``write_csv``), so a generated trace
replays, plots and compares like a real one. It knows nothing of policies.

Determinism: ``generate(mix, seed=s, ...)`` draws every number from one ``random.Random(s)`` of its own (never the
global random state), in a fixed order, so the same arguments give the same trace, job for job, on every machine.

Words
- *load*: the GPU-time the jobs ask for within the span of their submits, over the GPU-time a cluster of
  ``cluster_gpus`` GPUs has in that span; a job longer than the span counts for the span's length only (a job of
  weeks loads a two-day trace for two days, and runs on after it). The submit times are a Poisson process (bursts,
  for ``shared-burst``) whose span is chosen so that the trace has this load.
- *shared job*: a job whose workers each ask for a share of one GPU (0.25 or 0.5: ``TraceJob.gpus`` is then the
  total, e.g. 4 workers x 0.25 = 1.0, with ``workers`` set).

Mixes (``MIXES``)
- ``heavy-tail``: durations heavy-tailed: most jobs are short (log-normal, median 12 minutes), some run hours, and
  about 1% run for one to four weeks; 1 to 8 GPUs, mostly 1.
- ``shared-burst``: Philly-like jobs (mostly 1 GPU, median 30 minutes) beside bursts of shared-GPU jobs: every few
  hours 20 to 80 jobs arrive within ten minutes, each 1 to 4 workers of 0.25 or 0.5 GPU, median 15 minutes.
- ``big-gangs``: Philly-like jobs beside gangs of 16, 32 and 64 GPUs (whole 8-GPU nodes, median 2 hours); about
  12% of the jobs are such gangs, and they ask for most of the GPU-time.
"""
from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Tuple, Union

from raylane.errors import UnknownNameError, ValidationError
from raylane.sim.traces import Trace, TraceJob

__all__ = ["MIXES", "Mix", "generate", "write_csv", "GENERIC_COLUMNS"]

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0

# The columns ``write_csv`` writes (the generic format of ``raylane.sim.traces``).
GENERIC_COLUMNS = ("id", "submit_time", "duration", "gpus", "workers", "team")

# What a mix draws for one job: (duration seconds, GPUs in total, workers or None, kind); kind "burst" asks the
# arrival process to put the job in a burst.
_Draw = Tuple[float, float, Union[int, None], str]


def _lognormal(rng: random.Random, median: float, sigma: float, lo: float, hi: float) -> float:
    return min(max(median * math.exp(rng.gauss(0.0, sigma)), lo), hi)


def _philly_like(rng: random.Random) -> _Draw:
    """Philly's body: 1 GPU mostly, some 2/4/8; log-normal durations (median 30 minutes, up to 3 days)."""
    gpus = rng.choices((1, 2, 4, 8), weights=(80, 8, 7, 5))[0]
    return _lognormal(rng, 30 * MINUTE, 1.6, MINUTE, 3 * DAY), gpus, None, "body"


def _heavy_tail(rng: random.Random) -> _Draw:
    gpus = rng.choices((1, 2, 4, 8), weights=(70, 12, 10, 8))[0]
    u = rng.random()
    if u < 0.01:
        # A job of weeks: log-uniform between one and four weeks.
        duration = 7 * DAY * math.exp(rng.random() * math.log(4.0))
    elif u < 0.15:
        duration = _lognormal(rng, 3 * HOUR, 1.0, 20 * MINUTE, 3 * DAY)
    else:
        duration = _lognormal(rng, 12 * MINUTE, 1.0, 30.0, 6 * HOUR)
    return duration, gpus, None, "body"


def _shared_burst(rng: random.Random) -> _Draw:
    if rng.random() < 0.6:
        workers = rng.choice((1, 2, 4))
        share = rng.choice((0.25, 0.5))
        return _lognormal(rng, 15 * MINUTE, 1.0, MINUTE, 12 * HOUR), workers * share, workers, "burst"
    return _philly_like(rng)


def _big_gangs(rng: random.Random) -> _Draw:
    if rng.random() < 0.12:
        gpus = rng.choices((16, 32, 64), weights=(50, 30, 20))[0]
        return _lognormal(rng, 2 * HOUR, 1.0, 10 * MINUTE, 4 * DAY), gpus, gpus // 8, "body"
    return _philly_like(rng)


@dataclass(frozen=True)
class Mix:
    name: str
    summary: str
    draw: Callable[[random.Random], _Draw]
    # Whether some jobs ask for a share of one GPU.
    fractional: bool = False
    # The largest gang, in GPUs (a cluster must have at least this many).
    max_gang_gpus: int = 8


MIXES: Dict[str, Mix] = {m.name: m for m in (
    Mix("heavy-tail", "mostly short jobs (median 12 min) beside ~1% that run one to four weeks", _heavy_tail),
    Mix("shared-burst", "Philly-like jobs beside bursts of shared-GPU jobs (0.25 or 0.5 GPU per worker)",
        _shared_burst, fractional=True),
    Mix("big-gangs", "Philly-like jobs beside gangs of 16, 32 and 64 GPUs", _big_gangs, max_gang_gpus=64),
)}

# Bursts of shared-burst: jobs per burst and the window a burst's submits fall in.
_BURST_SIZE = (20, 80)
_BURST_WINDOW_S = 10 * MINUTE


def _check(mix: str, jobs: int, cluster_gpus: float, load: float, teams: int) -> Mix:
    m = MIXES.get(mix)
    if m is None:
        raise UnknownNameError("workload mix", mix, list(MIXES))
    errors = []
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        errors.append(("jobs", jobs, "an integer >= 1"))
    if not isinstance(cluster_gpus, (int, float)) or not math.isfinite(cluster_gpus) or cluster_gpus < m.max_gang_gpus:
        errors.append(("cluster_gpus", cluster_gpus, f"a number >= {m.max_gang_gpus} (the largest gang of {mix})"))
    if not isinstance(load, (int, float)) or not math.isfinite(load) or not 0 < load <= 10:
        errors.append(("load", load, "a number > 0 and <= 10 (GPU-time asked over GPU-time the cluster has)"))
    if not isinstance(teams, int) or isinstance(teams, bool) or teams < 1:
        errors.append(("teams", teams, "an integer >= 1"))
    if errors:
        raise ValidationError(f"mix {mix}", errors)
    return m


def generate(mix: str, *, seed: int = 0, jobs: int = 2000, cluster_gpus: float = 256, load: float = 0.9,
             teams: int = 8, users: int = 0) -> Trace:
    """A trace of ``jobs`` jobs of workload mix ``mix`` (one of ``MIXES``), drawn from ``seed``, whose submits are
    spread so that it asks for ``load`` times the GPU-time of a ``cluster_gpus``-GPU cluster over its submit span.
    Jobs belong to ``teams`` teams (``team-0`` ...), drawn uniformly. Sorted by submit time; the first at 0.
    ``users`` > 0: each job also gets a user and a job name (``assign_users``), drawn from a stream of their own,
    so that the trace is otherwise the same as with none."""
    if not (isinstance(users, int) and users >= 0):
        raise ValidationError("generate", [("users", users, "an integer >= 0 (0: no users)")])
    trace = _generate(mix, seed=seed, jobs=jobs, cluster_gpus=cluster_gpus, load=load, teams=teams)
    return assign_users(trace, users, seed) if users else trace


def assign_users(trace: Trace, users: int, seed: int = 0, spread: float = 0.6) -> Trace:
    """``trace`` with each job given a user and a name, as people's work looks: each user works mostly on jobs of a
    typical length (a centre, the log-duration of one of their team's jobs), on three named projects a factor of
    e apart around it. A job goes to the user of its team whose centre is nearest its log-duration blurred by a
    normal noise of sigma ``spread`` (so a user's runs vary, and overlap other users'), then to that user's nearest
    project in the same way. Drawn from ``random.Random(seed)`` of its own; durations, sizes and times unchanged."""
    rng = random.Random(f"users:{seed}")
    by_team: Dict[str, List[int]] = {}
    for k, j in enumerate(trace.jobs):
        by_team.setdefault(j.team, []).append(k)
    per_team = max(1, users // max(1, len(by_team)))
    out = list(trace.jobs)
    for t, (team, ks) in enumerate(sorted(by_team.items())):
        centres = [(f"u{t}-{i}", math.log(max(trace.jobs[rng.choice(ks)].duration, 1.0))) for i in range(per_team)]
        for k in ks:
            j = trace.jobs[k]
            x = math.log(max(j.duration, 1.0))
            user, c = min(centres, key=lambda uc: (abs(x + rng.gauss(0, spread) - uc[1]), uc[0]))
            p = min(range(3), key=lambda i: abs(x + rng.gauss(0, spread / 2) - (c + (i - 1))))
            out[k] = replace(j, user=user, name=f"{user}-p{p}")
    return replace(trace, jobs=out)


def _generate(mix: str, *, seed: int, jobs: int, cluster_gpus: float, load: float, teams: int) -> Trace:
    m = _check(mix, jobs, cluster_gpus, load, teams)
    rng = random.Random(seed)
    drawn = [m.draw(rng) for _ in range(jobs)]
    owners = [f"team-{rng.randrange(teams)}" for _ in range(jobs)]
    span = _span(drawn, load * cluster_gpus)
    # Arrivals: the body is a Poisson process over the span; burst jobs come in bursts (a Poisson process of bursts,
    # each burst's jobs uniform in a short window), so both kinds spread over the same span.
    body = [i for i, d in enumerate(drawn) if d[3] != "burst"]
    burst = [i for i, d in enumerate(drawn) if d[3] == "burst"]
    submit = [0.0] * jobs
    for i, t in zip(body, _poisson(rng, len(body), span)):
        submit[i] = t
    k = 0
    while k < len(burst):
        size = rng.randint(*_BURST_SIZE)
        members = burst[k:k + size]
        k += size
        submit_at = rng.random() * span
        for i in members:
            submit[i] = submit_at + rng.random() * _BURST_WINDOW_S
    order = sorted(range(jobs), key=lambda i: (submit[i], i))
    t0 = submit[order[0]]
    out = [TraceJob(f"{mix}-{n}", round(submit[i] - t0, 1), round(drawn[i][0], 1), drawn[i][1], owners[i],
                    workers=drawn[i][2]) for n, i in enumerate(order)]
    return Trace(out, source=f"generated:{mix}:seed={seed}:jobs={jobs}:load={load:g}:cluster_gpus={cluster_gpus:g}",
                 format="generated", notes=[f"{mix}: {m.summary}"])


def _span(drawn: List[_Draw], capacity: float) -> float:
    """The span S at which sum(gpus x min(duration, S)) = capacity x S (unique: the left side over S falls as S
    grows), by bisection; deterministic."""
    def over(span: float) -> bool:
        return sum(g * min(d, span) for d, g, _, _ in drawn) > capacity * span

    lo, hi = 0.0, sum(g * d for d, g, _, _ in drawn) / capacity
    for _ in range(100):
        mid = (lo + hi) / 2
        if over(mid):
            lo = mid
        else:
            hi = mid
    return hi


def _poisson(rng: random.Random, n: int, span: float) -> List[float]:
    """``n`` arrival times of a Poisson process of mean gap ``span / n``, the first at 0."""
    t, out = 0.0, []
    gap = span / n if n else 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(1.0 / gap) if gap > 0 else 0.0
    return out


def write_csv(trace: Trace, path: Union[str, Path]) -> Path:
    """Write ``trace`` in the generic CSV format (``GENERIC_COLUMNS``), which ``load_trace`` reads back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    named = any(j.user is not None or j.name is not None for j in trace.jobs)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(GENERIC_COLUMNS + (("user", "name") if named else ()))
        for j in trace.jobs:
            row = [j.id, f"{j.submit:.1f}", f"{j.duration:.1f}", f"{j.gpus:g}", j.workers or "", j.team]
            w.writerow(row + ([j.user or "", j.name or ""] if named else []))
    return path
