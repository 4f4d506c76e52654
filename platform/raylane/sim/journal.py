"""A control plane's own journal as a simulator trace: ``raylane sim --from-journal JOURNAL``.

An operator replays what their cluster actually ran (last week's submissions, with their specs, teams and classes)
under a policy they are thinking of switching on. The journal (``raylane.control.journal``) holds every submission
with its spec and submit time, every admission, checkpoint, preemption, requeue and end; this module turns it into
a ``Trace`` of ``TraceJob``s and the cluster's nodes, read-only (a running control plane's journal may be read).

What each job becomes:
- *submit*: its submit time, counted from the first submission (``Trace.origin`` is that wall-clock time).
- *gang*: its spec's gang (workers, per-worker GPUs, CPUs and memory, placement, node features, elastic bounds),
  as the control plane's scheduling core saw it (``spec.to_core`` under the policy).
- *duration* (its work): the time its gang ran in its last attempt (from its hand-over to Ray Train, ``running``,
  to its end; from its admission in journals that record no hand-over), plus, for each earlier attempt that was
  stopped (preempted or lost with a node), the time up to that attempt's last checkpoint: the work it kept. What a
  stopped attempt ran past its last checkpoint was lost and is not work; a resize keeps it all (the gang saves a
  checkpoint as it stops). An elastic gang's time counts in proportion to its workers over its submitted size
  (the simulator's linear speedup). A workload still running at the
  journal's end counts what it ran so far (its duration is a lower bound; ``Trace.notes`` says how many).
- *estimate*: the spec's runtime estimate, if it gave one.
Left out (counted in ``Trace.skipped``, named in ``Trace.notes``): rejected submissions (refused at submit, they
never queued), and workloads still pending at the journal's end (no runtime is known).

What the live plane did, for ``raylane sim --from-journal`` to print beside the replay (``JournalReplay.live``):
each job's first admission and end and its preemptions; and how long its gangs took to start (admission to
``running``: ``handover_s``, the median) and to stop when asked (``stop_delay_s``, the median): what a replay with
``fidelity="live"`` plays.

Nodes: every node the journal saw join (``node`` entries), with its GPUs, node type, and (in journals from this
release on) its CPUs, memory and feature tags; where those are missing they are not modelled (give ``--cluster``
for a cluster file instead).
"""
from __future__ import annotations

import os
import sqlite3
from statistics import median
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from raylane.control.journal import Entry, read_history
from raylane.errors import NotFoundError, ValidationError
from raylane.runtimes import entry_digest
from raylane.scheduling.types import Node, Resources, device_count
from raylane.sim.outages import NodeDrain, NodeFailure, Outages
from raylane.sim.traces import Trace, TraceJob

# Entries that end a lease: the attempt that ended keeps its work up to its last checkpoint (or all of it: an end).
_STOPS = ("requeued", "resized")
_ENDS = ("finished", "cancelled")


@dataclass
class JournalReplay:
    trace: Trace
    nodes: List[Node]
    # The last policy the journal recorded (at a start or a ``raylane policy reload``), if any: what the cluster ran
    # under then.
    policy: Optional[Dict[str, Any]] = None
    # Workload id -> when it was first admitted, as the journal says (seconds from the trace's origin): what a
    # replay's starts are compared with.
    starts: Dict[str, float] = field(default_factory=dict)
    # The nodes the journal saw lost (failures, never back: Ray gives a node that returns a new id) and drained
    # (back in service when uncordoned), in the trace's time.
    outages: Outages = Outages()
    # Workload id -> when it ended and how many times it was preempted, live (seconds from the trace's origin).
    ends: Dict[str, float] = field(default_factory=dict)
    preemptions: Dict[str, int] = field(default_factory=dict)
    # The medians of the gangs' measured hand-over (admission to running) and stop delay (a stop asked to the
    # attempt's end); None where the journal has none.
    handover_s: Optional[float] = None
    stop_delay_s: Optional[float] = None

    def live_summary(self) -> Dict[str, Any]:
        """The live plane's figures over the jobs of the trace: JCT (submit to end), queueing (submit to first
        admission), preemptions, makespan (first submit to last end), in the shape of ``summarize``'s."""
        from raylane.sim.metrics import dist

        jobs = [j for j in self.trace.jobs if j.id in self.ends]
        return {"jobs": {"finished": len(jobs)},
                "jct": dist([self.ends[j.id] - j.submit for j in jobs]),
                "queueing": dist([self.starts[j.id] - j.submit for j in jobs if j.id in self.starts]),
                "preemptions": {"total": sum(self.preemptions.get(j.id, 0) for j in self.trace.jobs)},
                "makespan_s": max(self.ends.values(), default=0.0),
                "handover_s": self.handover_s, "stop_delay_s": self.stop_delay_s}

    def cluster(self) -> "JournalCluster":
        """The journal's nodes as the simulator command's cluster."""
        return JournalCluster(self.nodes)


@dataclass
class JournalCluster:
    """The nodes a journal saw join, in the shape ``raylane sim`` reads a cluster file's (``ClusterSpec``)."""

    node_list: List[Node]
    name: str = "journal"

    def nodes(self) -> List[Node]:
        return list(self.node_list)

    @property
    def total_gpus(self) -> float:
        return sum(n.capacity.gpu for n in self.node_list)

    @property
    def max_node_gpus(self) -> float:
        return max((n.capacity.gpu for n in self.node_list), default=0.0)

    def describe(self) -> str:
        gpu_nodes = [n for n in self.node_list if n.capacity.gpu > 0]
        return (f"the journal's nodes: {len(self.node_list)} ({len(gpu_nodes)} with GPUs) = {self.total_gpus:g} "
                "GPUs")


def read_entries(path: str) -> Iterator[Entry]:
    """The journal's entries, oldest first, read-only (the file is not created, changed or locked for writing): the
    archived workloads and audit entries (``raylane.control.archive``) with the live tail, in journal order."""
    p = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(p):
        raise NotFoundError(f"journal {p} not found" + (" (it is a directory)" if os.path.exists(p) else ""))
    try:
        db = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        rows = list(read_history(db))
    except sqlite3.DatabaseError as exc:
        raise ValidationError(f"journal {p}", [("(file)", os.path.basename(p),
                                                f"a Raylane control-plane journal (sqlite): {exc}")]) from None
    finally:
        try:
            db.close()
        except UnboundLocalError:
            pass
    yield from rows


def read_nodes_snapshot(path: str) -> List[Dict[str, Any]]:
    """The node book of the journal's last compaction (``raylane.control.archive.snapshot_nodes``), read-only; []
    when it has none."""
    import json

    p = os.path.abspath(os.path.expanduser(path))
    db = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT data FROM snapshot WHERE name = 'nodes'").fetchone()
    except sqlite3.DatabaseError:  # a journal from before compaction: no snapshot table
        row = None
    finally:
        db.close()
    return json.loads(bytes(row[0]))["book"] if row else []


@dataclass
class _Life:
    spec: Dict[str, Any]
    submit: float
    worker_s: float = 0.0  # work kept, in worker-seconds (an elastic gang's size changes)
    held_from: Optional[float] = None
    workers: int = 0
    last_checkpoint: Optional[float] = None
    first_start: Optional[float] = None
    ended: bool = False
    rejected: bool = False
    admitted_at: Optional[float] = None  # the current attempt's admission, until its gang runs
    end: Optional[float] = None
    preemptions: int = 0

    def hold(self, ts: float, workers: int) -> None:
        self.held_from, self.workers = ts, workers
        self.last_checkpoint = None
        self.admitted_at = ts
        if self.first_start is None:
            self.first_start = ts

    def running(self, ts: float) -> Optional[float]:
        """Its gang runs from ``ts`` (the hand-over): its work counts from there; the hand-over's seconds."""
        if self.admitted_at is None or self.held_from is None:
            return None
        took = ts - self.admitted_at
        self.held_from, self.admitted_at = ts, None
        return took

    def apply(self, e: Entry) -> Optional[float]:
        """One entry of the workload's; the seconds of a hand-over it ends (``running``), else None."""
        if e.kind == "rejected":
            self.rejected = True
        elif e.kind == "admitted":
            self.hold(e.ts, len(e.data.get("placement") or ()) or 1)
        elif e.kind == "checkpointed":
            self.last_checkpoint = e.ts
        elif e.kind == "running":
            return self.running(e.ts)
        elif e.kind == "preempting" and e.data.get("preemption", True):
            self.preemptions += 1
        elif e.kind in _STOPS:
            # A resize stops the gang after a checkpoint and restarts it (kept: up to the stop); a requeue keeps the
            # work up to the last checkpoint of the attempt.
            self.stop(e.ts, kept_all=e.kind == "resized")
            if e.kind == "resized":
                self.hold(e.ts, len(e.data.get("placement") or ()) or 1)
        elif e.kind in _ENDS:
            self.stop(e.ts, kept_all=True)
            self.ended = True
            self.end = e.ts
        return None

    def stop(self, ts: float, kept_all: bool) -> None:
        self.admitted_at = None
        if self.held_from is None:
            return
        upto = ts if kept_all else (self.last_checkpoint if self.last_checkpoint is not None else self.held_from)
        self.worker_s += max(0.0, upto - self.held_from) * self.workers
        self.held_from = None


def trace_from_journal(path: str, policy=None) -> JournalReplay:
    """The journal at ``path`` as a trace (see the module's docstring). ``policy``: a loaded ``ClusterPolicy`` to read
    the specs under (default: the journal's last recorded policy; a journal with none, whose cluster never reloaded
    its policy, needs one: ValidationError)."""
    from raylane.config.loader import load_policy_from_dict, load_spec_from_dict

    lives: Dict[str, _Life] = {}
    nodes: Dict[str, Tuple[Resources, str, frozenset]] = {}
    last_policy: Optional[Dict[str, Any]] = None
    node_events: List[Tuple[float, str, str]] = []
    handovers: List[float] = []
    entries = list(read_entries(path))
    last_ts = 0.0
    for e in entries:
        last_ts = max(last_ts, e.ts)
        if e.kind == "policy":
            last_policy = e.data.get("policy")
            continue
        if e.kind == "node":
            ev = e.data.get("event")
            if ev in ("lost", "draining"):
                node_events.append((e.ts, e.data["node"], ev))
            elif ev == "uncordoned":
                node_events.append((e.ts, e.data["node"], ev))
            if ev == "joined":
                d = e.data
                nodes[d["node"]] = (Resources(float(d.get("gpus") or 0.0), float(d.get("cpus") or 0.0),
                                              float(d.get("memory_gib") or 0.0)),
                                    d.get("node_type") or "", frozenset(d.get("features") or ()))
            continue
        if e.kind == "submitted":
            lives[e.workload_id] = _Life(e.data["spec"], float(e.data["submit_time"]))
            continue
        life = lives.get(e.workload_id)
        took = life.apply(e) if life is not None else None
        if took is not None:
            handovers.append(took)
    for st in read_nodes_snapshot(path):
        # A node whose `joined` entry passed the retention: the last compaction's node book still knows it.
        if st.get("state") != "lost" and st["id"] not in nodes:
            j = st.get("joined") or {}
            nodes[st["id"]] = (Resources(float(st.get("gpus") or 0.0), float(j.get("cpus") or 0.0),
                                         float(j.get("memory_gib") or 0.0)),
                               st.get("node_type") or "", frozenset(j.get("features") or ()))
    if policy is None:
        if last_policy is None:
            raise ValidationError(f"journal {path}", [(
                "--policy", None, "the policy file the cluster ran under: the journal records the policy at each "
                                  "start and reload of the control plane, and this one (written before it did) "
                                  "has none")])
        policy = load_policy_from_dict(last_policy, "the journal's policy")
    jobs: List[TraceJob] = []
    skipped, running, pending = 0, 0, 0
    origin = min((l.submit for l in lives.values()), default=0.0)
    # CPUs and memory are modelled only where the journal gave the nodes' (a job asking for what no node is said to
    # have would fit nowhere).
    with_cpu = any(cap.cpu > 0 for cap, _, _ in nodes.values())
    with_memory = any(cap.memory > 0 for cap, _, _ in nodes.values())
    starts: Dict[str, float] = {}
    ends: Dict[str, float] = {}
    preemptions: Dict[str, int] = {}
    for wid, life in lives.items():
        if life.rejected:
            skipped += 1
            continue
        if life.first_start is None:
            pending += 1
            skipped += 1
            continue
        if not life.ended:
            running += 1
            life.stop(last_ts, kept_all=True)
        w = load_spec_from_dict(life.spec, f"workload {wid}", policy=policy).to_core(wid, policy, life.submit)
        g = w.gang
        jobs.append(TraceJob(
            id=wid, submit=life.submit - origin, duration=max(life.worker_s / g.workers, 1e-3), gpus=g.total.gpu, team=w.team,
            cls=w.cls.name, workers=g.workers, cpus=g.total.cpu if with_cpu else 0.0,
            memory=g.total.memory if with_memory else 0.0, features=g.features,
            estimate=w.runtime_estimate_s, placement=g.strategy,
            min_workers=g.min_workers, max_workers=g.max_workers, user=w.user, name=life.spec.get("name"),
            entry=entry_digest(life.spec.get("entrypoint") or life.spec.get("command"), life.spec.get("config"))))
        starts[wid] = life.first_start - origin
        preemptions[wid] = life.preemptions
        if life.end is not None:
            ends[wid] = life.end - origin
    jobs.sort(key=lambda j: (j.submit, j.id))
    notes = []
    if skipped - pending:
        notes.append(f"{skipped - pending} rejected submissions left out (refused at submit, they never queued)")
    if pending:
        notes.append(f"{pending} workloads still pending at the journal's end left out (no runtime known)")
    if running:
        notes.append(f"{running} workloads still running at the journal's end: their durations are what they ran "
                     "so far")
    trace = Trace(jobs, source=os.path.abspath(path), format="journal", origin=origin if lives else None,
                  skipped=skipped, notes=notes)
    node_list = [Node(nid, cap, cap, feats, node_type=ntype, devices=(1.0,) * device_count(cap.gpu))
                 for nid, (cap, ntype, feats) in sorted(nodes.items())]
    stops = stop_delays(entries)
    return JournalReplay(trace, node_list, last_policy, starts, _outages(node_events, origin), ends, preemptions,
                         median(handovers) if handovers else None, median(stops) if stops else None)


def _outages(events: List[Tuple[float, str, str]], origin: float) -> Outages:
    failures, drains, draining = [], [], {}
    for ts, node, ev in events:
        if ev == "lost":
            failures.append(NodeFailure(node, ts - origin))
        elif ev == "draining":
            draining[node] = ts
        elif ev == "uncordoned" and node in draining:
            at = draining.pop(node)
            drains.append(NodeDrain(node, at - origin, ts - at))
    drains += [NodeDrain(node, at - origin) for node, at in draining.items()]
    return Outages(tuple(failures), tuple(sorted(drains, key=lambda d: d.at)))



def stop_delays(entries) -> List[float]:
    """Seconds from each stop the control plane asked of a gang (``preempting``, ``resizing``, ``run_limit``) to the
    end of that attempt (its ``requeued``, ``resized`` or end): the gangs' measured stop delays, what
    ``--stop-delay`` stands for."""
    asked: Dict[str, float] = {}
    out: List[float] = []
    for e in entries:
        if e.kind in ("preempting", "resizing", "run_limit"):
            asked.setdefault(e.workload_id, e.ts)
        elif e.kind in ("requeued", "resized", "finished", "cancelled") and e.workload_id in asked:
            out.append(e.ts - asked.pop(e.workload_id))
    return out


def simulate_journal(replay: JournalReplay, policy, **options):
    """Replay ``replay`` (``trace_from_journal``) through the simulator under ``policy`` (a ``ClusterPolicy``), on
    the journal's nodes and outages, with runtimes as the control plane knows them: learned from the workloads
    that ended before each instant, the declared estimates folded in (``predicted-declared``, what the live plane's
    ``raylane.control.learned`` does), and as the live plane runs (``fidelity="live"``, the gangs' measured
    hand-over and stop delay; a resize restarts the gang: a hand-over again); ``options``: more ``SimOptions``."""
    from raylane.sim.engine import SimOptions, simulate

    live = {"fidelity": "live", "handover_s": replay.handover_s or 0.0, "stop_delay_s": replay.stop_delay_s or 0.0,
            "resize_overhead_s": replay.handover_s or 0.0}
    opts = SimOptions(**{"estimates": "predicted-declared", **live, **options, "outages": replay.outages})
    classes = {name: policy.workload_class(name) for name in policy.classes}
    return simulate(replay.trace, replay.nodes, policy.to_scheduler_config(), teams=policy.core_teams(),
                    options=opts, classes=classes)
