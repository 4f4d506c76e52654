"""The lifecycle of a lease: the ``ClusterState`` transitions a driver applies for a cycle's decisions and for what
the gangs then do, each written once.

A cycle returns decisions; a driver (the control plane, the simulator, the test driver) carries them out and tells
the state what the gangs did. This module owns how each of those steps changes the state, so that every driver
books them alike; the driver keeps what only it knows (a journal, a clock, simulated work, Ray's tables) and the
order in which it calls these.

Words
- *lease*: a workload holding its placement (``ClusterState.leases``), ``RUNNING`` or ``TERMINATING``.
- *stop*: a lease told to stop (a preemption, a shrink, a drain) stays booked whole, ``TERMINATING``, until its
  gang has stopped, so that what it frees is never promised twice.
- *end*: the lease's resources go back (``ClusterState.finish``): its work is done, it was cancelled, or it stopped.
- *requeue*: an ended lease's workload goes back to its team queue at its original place (its submit time), with
  the GPU-seconds of service it has had (``attained_gpu_s``), which least-attained-service orderings read.
- *resize*: an elastic gang goes on at another size on the placement the core chose; a restart, so the new lease
  starts ``now`` and keeps the service of the old one.

Pure: no Ray, no clock (every transition that needs time takes ``now``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, List, Optional

from raylane.scheduling.types import Admit, Lease, LeaseState, Resize, Workload

if TYPE_CHECKING:  # the state may import this module's formula
    from raylane.scheduling.state import ClusterState

__all__ = ["attained_gpu_s", "admit", "begin_stop", "resize", "begin_resize", "finish_shrink", "end", "requeue",
           "end_and_requeue", "lose_node"]


def attained_gpu_s(lease: Lease, now: float) -> float:
    """The GPU-seconds of service ``lease``'s workload has had by ``now``: what it had when the lease started, plus
    the lease's GPUs for the time since (none before its start)."""
    w = lease.workload
    return w.attained_gpu_s + w.gang.total.gpu * max(0.0, now - lease.start_time)


def admit(state: "ClusterState", a: Admit, now: float) -> Lease:
    """An ``Admit``: the workload leaves its queue and holds its placement from ``now``."""
    return state.start(a, now)


def begin_stop(state: "ClusterState", workload_id: str) -> Lease:
    """A preemption, a drain or a shrink: the lease is told to stop and stays booked whole (``TERMINATING``) until
    its gang has stopped. A lease already stopping is left as it is."""
    lease = state.leases.get(workload_id)
    if lease is not None and lease.state is LeaseState.TERMINATING:
        return lease
    return state.mark_terminating(workload_id)


def resize(state: "ClusterState", rz: Resize, now: float) -> Lease:
    """The gang goes on at ``rz.to_workers`` on ``rz.placement`` from ``now``, its service so far kept: a growth at
    once, a shrink once its gang has stopped (``finish_shrink``), or a resize whose stop a driver does not model
    (the simulator's, in either direction). ValueError for a size the lease cannot take."""
    return state.resize(rz, now)


def begin_resize(state: "ClusterState", rz: Resize, now: float) -> Optional[Lease]:
    """A ``Resize`` as a live driver carries it out: a growth books the new size at once (nothing else is admitted
    into it while the gang restarts) and returns the new lease; a shrink keeps the whole gang booked while it stops
    (``begin_stop``) and returns None, to be finished by ``finish_shrink`` once it has stopped."""
    if rz.to_workers > rz.from_workers:
        return resize(state, rz, now)
    begin_stop(state, rz.workload.id)
    return None


def finish_shrink(state: "ClusterState", rz: Resize, now: float) -> Optional[Lease]:
    """The gang stopped for its resize: a lease still larger than ``rz.to_workers`` goes on at that size (a growth
    was booked when it began and is returned as it is). None when the lease ended meanwhile."""
    lease = state.leases.get(rz.workload.id)
    if lease is None:
        return None
    if rz.to_workers < lease.workload.gang.workers:
        return resize(state, rz, now)
    return lease


def end(state: "ClusterState", workload_id: str, now: float) -> Lease:
    """The lease is over (done, failed, cancelled or stopped): its resources go back; returns it."""
    return state.finish(workload_id, now)


def requeue(state: "ClusterState", lease: Lease, now: float, attained: float,
            workload: Optional[Workload] = None) -> Workload:
    """Put an ended lease's workload back in its queue at its original place, with ``attained`` GPU-seconds of
    service (``attained_gpu_s`` of the lease, at the time its service stopped). ``workload``: what goes back in
    its place, when the driver changes it (the simulator's requested size, a grown estimate); default the lease's."""
    if workload is not None and workload is not lease.workload:
        lease = replace(lease, workload=workload)
    return state.requeue(lease, now, attained)


def end_and_requeue(state: "ClusterState", workload_id: str, now: float) -> Workload:
    """A stopped lease (a preemption's victim, a drained lease) ends and goes back to its queue, with the service it
    had until ``now``."""
    lease = end(state, workload_id, now)
    return requeue(state, lease, now, attained_gpu_s(lease, now))


def lose_node(state: "ClusterState", node_id: str, now: float) -> List[Lease]:
    """The node is gone: every lease with a worker there ends now (a gang cannot run short of a worker) and is
    returned, for the driver to ``requeue`` each (after journaling it, or with its simulated losses). A node the
    state does not hold ends nothing."""
    if node_id not in state.nodes:
        return []
    return state.remove_node(node_id, now)
