"""Small builders for the pure scheduling tests, in the style of Kueue's ``utiltesting`` wrappers.

    wl("a").team("nlp").gpus(8).workers(2).cls(PRETRAIN).at(10)      -> a Workload builder (``.obj()`` builds)
    node("n1").gpus(8).features("a100").label(rack="r1")             -> a Node builder
    team("nlp", gpu=8, borrow=4, lend=2, weight=1.0)                  -> a Team
    running(wl(...), on=("n1", "n1"), since=0, ckpt=None)            -> a lease to put in a state
    make_state(nodes, teams, running=[...], pending=[...], **config)  -> a ClusterState
    decide(...)                                                       -> cycle() on make_state(...).snapshot(), summed up

Builders accept each other anywhere a value is expected: ``obj()`` turns a builder into its value.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from raylane.scheduling import (
    Admit,
    ClusterState,
    CycleResult,
    Gang,
    Node,
    Quota,
    Resources,
    SchedulerConfig,
    Snapshot,
    Team,
    Workload,
    WorkloadClass,
    cycle,
)

# Classes used across the tests. Priorities: CRITICAL > PROD > FINETUNE > PRETRAIN > SWEEP.
CRITICAL = WorkloadClass("critical", priority=100, preemptible=False)
PROD = WorkloadClass("prod", priority=50, preemptible=True)
FINETUNE = WorkloadClass("finetune", priority=30, preemptible=True, checkpoint_interval_s=300)
PRETRAIN = WorkloadClass("pretrain", priority=20, preemptible=True, checkpoint_interval_s=1800)
SWEEP = WorkloadClass("sweep", priority=5, preemptible=True)
# Elastic training: may run at any size within its gang's bounds.
ELASTIC = WorkloadClass("elastic", priority=20, preemptible=True, checkpoint_interval_s=1800, resizable=True)
# Like PRETRAIN, but must run 10 minutes before it may be preempted.
SLOW_START = WorkloadClass("slow-start", priority=20, preemptible=True, min_runtime_s=600)


class WorkloadBuilder:
    def __init__(self, id: str):
        self._id = id
        self._team = "nlp"
        self._cls = PRETRAIN
        self._workers = 1
        self._per = Resources(gpu=1)
        self._strategy = "pack"
        self._features: frozenset = frozenset()
        self._group_by = "rack"
        self._t = 0.0
        self._est: Optional[float] = None
        self._data: Optional[str] = None
        self._attained = 0.0
        self._bounds: Tuple[Optional[int], Optional[int]] = (None, None)
        self._user: Optional[str] = None

    def team(self, t: str): self._team = t; return self
    def user(self, u: Optional[str]): self._user = u; return self
    def cls(self, c: WorkloadClass): self._cls = c; return self
    def workers(self, n: int): self._workers = n; return self
    def gpus(self, g: float): self._per = replace(self._per, gpu=g); return self
    def cpus(self, c: float): self._per = replace(self._per, cpu=c); return self
    def mem(self, m: float): self._per = replace(self._per, memory=m); return self
    def strategy(self, s: str): self._strategy = s; return self
    def features(self, *f: str): self._features = frozenset(f); return self
    def group_by(self, label: str): self._group_by = label; self._strategy = "group"; return self
    def at(self, t: float): self._t = float(t); return self
    def est(self, s: Optional[float]): self._est = s; return self
    def data(self, snapshot: str): self._data = snapshot; return self
    def attained(self, gpu_s: float): self._attained = gpu_s; return self

    def elastic(self, lo: int, hi: int):
        """An elastic gang of ``lo``..``hi`` workers (queued, or running, at ``.workers(n)``; ``lo`` if not set)."""
        self._bounds = (lo, hi)
        if self._workers == 1:
            self._workers = lo
        return self

    def obj(self) -> Workload:
        return Workload(
            id=self._id, team=self._team, cls=self._cls,
            gang=Gang(self._workers, self._per, self._strategy, self._features, self._group_by,
                      min_workers=self._bounds[0], max_workers=self._bounds[1]),
            submit_time=self._t, runtime_estimate_s=self._est, data_snapshot=self._data,
            attained_gpu_s=self._attained, user=self._user,
        )


def wl(id: str) -> WorkloadBuilder:
    return WorkloadBuilder(id)


class NodeBuilder:
    def __init__(self, id: str):
        self._id = id
        self._cap = Resources(gpu=8, cpu=64, memory=512)
        self._features: frozenset = frozenset()
        self._labels: Dict[str, str] = {}
        self._datasets: frozenset = frozenset()
        self._free_gpu: Optional[float] = None

    def free(self, g: float):
        """Free GPUs, when less than the capacity (as if something outside the test held the rest)."""
        self._free_gpu = g
        return self

    def gpus(self, g: float): self._cap = replace(self._cap, gpu=g); return self
    def cpus(self, c: float): self._cap = replace(self._cap, cpu=c); return self
    def mem(self, m: float): self._cap = replace(self._cap, memory=m); return self
    def features(self, *f: str): self._features = frozenset(f); return self
    def label(self, **kv: str): self._labels.update(kv); return self
    def datasets(self, *d: str): self._datasets = frozenset(d); return self

    def obj(self) -> Node:
        free = self._cap if self._free_gpu is None else replace(self._cap, gpu=self._free_gpu)
        return Node(self._id, self._cap, free, self._features, dict(self._labels), "", self._datasets)


def node(id: str) -> NodeBuilder:
    return NodeBuilder(id)


def nodes(n: int, gpus: float = 8, prefix: str = "n", **kw) -> List[NodeBuilder]:
    """``n`` identical nodes n1..nN; ``features=(...)``, ``labels={...}`` apply to all."""
    out = []
    for i in range(1, n + 1):
        b = node(f"{prefix}{i}").gpus(gpus)
        if "features" in kw:
            b.features(*kw["features"])
        if "labels" in kw:
            b.label(**kw["labels"])
        out.append(b)
    return out


def team(name: str, gpu: Optional[float] = None, borrow: Optional[float] = None, lend: Optional[float] = None,
         weight: float = 1.0, decayed: float = 0.0, users=None, user_usage=None) -> Team:
    """A team with a GPU quota (``gpu`` nominal, ``borrow`` limit, ``lend`` limit); no quota when ``gpu`` is None.
    ``users``: its ``UserRule``; ``user_usage``: decayed GPU-seconds per user."""
    quotas = {} if gpu is None else {"gpu": Quota(gpu, borrow, lend)}
    return Team(name, quotas, weight, decayed, users=users, user_usage=dict(user_usage or {}))


@dataclass
class RunningSpec:
    workload: object
    on: Tuple[str, ...]
    since: float = 0.0
    ckpt: Optional[float] = None
    terminating: bool = False


def running(w, on: Sequence[str], since: float = 0.0, ckpt: Optional[float] = None,
            terminating: bool = False) -> RunningSpec:
    return RunningSpec(w, tuple(on), since, ckpt, terminating)


def obj(x):
    return x.obj() if hasattr(x, "obj") else x


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**kw)


def make_state(nodes: Iterable = (), teams: Iterable[Team] = (), running: Iterable[RunningSpec] = (),
               pending: Iterable = (), **cfg) -> ClusterState:
    """A ClusterState holding ``running`` leases (started at their ``since``) and ``pending`` workloads."""
    st = ClusterState([obj(n) for n in nodes], {t.name: t for t in teams}, SchedulerConfig(**cfg))
    for r in running:
        w = obj(r.workload)
        st.enqueue(w)
        st.start(Admit(w, r.on), r.since)
        if r.ckpt is not None:
            st.checkpointed(w.id, r.ckpt)
        if r.terminating:
            st.mark_terminating(w.id)
    for p in pending:
        st.enqueue(obj(p))
    return st


@dataclass
class Outcome:
    """A cycle's result, keyed by workload id, for compact expectations."""

    result: CycleResult
    admitted: Dict[str, Tuple[str, ...]]
    preempted: Dict[str, Tuple[str, ...]]
    pending: Dict[str, object]
    positions: Dict[str, int]

    @property
    def victims(self) -> set:
        return {v for vs in self.preempted.values() for v in vs}

    def reason(self, wid: str):
        return self.pending[wid]

    def reason_type(self, wid: str) -> str:
        return type(self.pending[wid]).__name__


def summarize(res: CycleResult) -> Outcome:
    return Outcome(
        res,
        {a.workload.id: a.placement for a in res.admitted},
        {p.preemptor.id: p.victims for p in res.preempted},
        {p.workload.id: p.reason for p in res.pending},
        {p.workload.id: p.position for p in res.pending},
    )


def decide(nodes=(), teams=(), running=(), pending=(), now: float = 1000.0, max_examined: int = 500,
           **cfg) -> Outcome:
    st = make_state(nodes, teams, running, pending, **cfg)
    return summarize(cycle(st.snapshot(), now, max_examined=max_examined))


def snapshot_of(nodes=(), teams=(), running=(), pending=(), **cfg) -> Snapshot:
    return make_state(nodes, teams, running, pending, **cfg).snapshot()
