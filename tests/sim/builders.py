"""Small builders for the simulator tests.

    job("a").gpus(8).at(10).runs(100).team("nlp")      -> a TraceJob builder (``.obj()`` builds)
    trace(job(...), job(...))                         -> a Trace sorted by submit time
    replay(trace, nodes=2, gpus=8, preset="fifo", config=dict(...), **options) -> a SimResult
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Optional

from raylane.scheduling.types import SchedulerConfig
from raylane.sim import SimOptions, Simulator, Trace, TraceJob, apply_preset, cluster_from_flags, get_preset

# The real traces the tests replay ship with the repository (examples/traces/README.md says where they come from).
TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
PHILLY = str(TRACES / "philly.csv.gz")
TIRESIAS = str(TRACES / "tiresias_60_job.csv")


class JobBuilder:
    def __init__(self, id: str):
        self._kw: Dict[str, Any] = dict(id=id, submit=0.0, duration=100.0, gpus=1, team="default")

    def at(self, t: float): self._kw["submit"] = float(t); return self
    def runs(self, s: float): self._kw["duration"] = float(s); return self
    def gpus(self, n: int): self._kw["gpus"] = n; return self
    def team(self, t: str): self._kw["team"] = t; return self
    def user(self, u: str): self._kw["user"] = u; return self
    def workers(self, n: int): self._kw["workers"] = n; return self
    def cls(self, c: str): self._kw["cls"] = c; return self
    def estimate(self, s: float): self._kw["estimate"] = float(s); return self

    def obj(self) -> TraceJob:
        return TraceJob(**self._kw)


def job(id: str) -> JobBuilder:
    return JobBuilder(id)


def trace(*jobs) -> Trace:
    objs = [j.obj() if isinstance(j, JobBuilder) else j for j in jobs]
    return Trace(sorted(objs, key=lambda j: j.submit), "test", "generic")


def replay(tr: Trace, *, nodes: int = 1, gpus: int = 8, preset: Optional[str] = None,
           config: Optional[Dict[str, Any]] = None, teams=None, classes=None, default_class=None,
           progress=None, should_stop=None, **options):
    cfg = SchedulerConfig(ordering="fifo", admission="none", backfill="none", preemption="none")
    opts = SimOptions()
    if preset is not None:
        cfg, opts = apply_preset(get_preset(preset), cfg, opts)
    cfg = replace(cfg, **(config or {}))
    opts = replace(opts, **options)
    kw = {}
    if default_class is not None:
        kw["default_class"] = default_class
    sim = Simulator(tr, cluster_from_flags(nodes, gpus).nodes(), teams or {}, cfg, classes=classes or {},
                    options=opts, **kw)
    return sim.run(progress=progress, should_stop=should_stop)


def outcome(r) -> Dict[str, tuple]:
    """job id -> (first start, finish, preemptions)."""
    return {j.id: (r.first_start[k], r.finish[k], r.preemptions[k]) for k, j in enumerate(r.jobs)}
