"""The backfill axis: may a workload start ahead of a gang that is waiting for capacity?

When the first workload in queue order cannot be placed for lack of capacity (not quota), the backfill policy says
what the workloads behind it may do:
- ``none``: nothing starts behind it (strict order; head-of-line blocking, the FIFO baseline).
- ``easy``: EASY backfilling. The blocked head gets a reservation: the earliest time (the *shadow time*) at which,
  as running leases end by their runtime estimates, its whole gang can be placed, and on which nodes. A later
  workload may start now if it fits now and either ends, by its own estimate, before the shadow time, or uses only
  what the head will not need on those nodes at the shadow time. A workload with no estimate can only use the latter.
- ``greedy``: anything that fits starts (Kueue's BestEffortFIFO); large gangs can starve.
What the head leaves spare is counted per GPU device too: on a node the head is planned on, a workload may use the
spare only if, with it holding its devices (a share of a GPU stays on the device it takes now), the head's workers
there still fit on the devices at the shadow time.
Leases with no runtime estimate are assumed to end ``cfg.default_runtime_s`` after they started; leases already
terminating are assumed gone now.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Protocol, Sequence, Tuple

from raylane.scheduling.capacity import Capacity, Devices, WorkerDevices, choose_devices, gpu_slots, shift_devices
from raylane.scheduling.leaseorder import InEndOrder, static_end
from raylane.scheduling.placement import place
from raylane.scheduling.registry import Registry
from raylane.scheduling.types import Lease, LeaseState, Resources, SchedulerConfig, Workload


@dataclass
class Reservation:
    head: str
    # None: the head can never start on what runs now (its start is unknown); nothing may delay it.
    shadow_time: Optional[float]
    # What the head leaves unused at the shadow time on the nodes it is planned on; other nodes are not limited.
    spare: Dict[str, Resources]
    # On those nodes: the free share of each GPU device at the shadow time without the head (less what backfilled
    # work took), and how many of the head's workers, of ``head_gpu`` GPUs each, go there.
    devices: Dict[str, Devices] = field(default_factory=dict)
    head_workers: Dict[str, int] = field(default_factory=dict)
    head_gpu: float = 0.0

    def copy(self) -> "Reservation":
        """A copy whose spare can be used up without changing this one."""
        return Reservation(self.head, self.shadow_time, dict(self.spare), dict(self.devices),
                           self.head_workers, self.head_gpu)


class BackfillPolicy(Protocol):
    def reserve(self, head: Workload, cap: Capacity, leases: Iterable[Lease], now: float,
                cfg: SchedulerConfig) -> Optional[Reservation]:
        """Called once per cycle for the first capacity-blocked workload. None: nothing is reserved."""

    def allows(self, w: Workload, placement: Tuple[str, ...], res: Optional[Reservation], now: float,
               devices: Sequence[WorkerDevices] = ()) -> bool:
        """Whether ``w`` may start now on ``placement`` (each worker on ``devices``, when given) given the
        reservation; may consume the reservation's spare."""


BACKFILLS: Registry[BackfillPolicy] = Registry("backfill", default="easy")


@BACKFILLS.register("none")
class NoBackfill:
    def reserve(self, head, cap, leases, now, cfg):
        return Reservation(head.id, None, {})

    def allows(self, w, placement, res, now, devices=()):
        return res is None


@BACKFILLS.register("greedy")
class Greedy:
    def reserve(self, head, cap, leases, now, cfg):
        return None

    def allows(self, w, placement, res, now, devices=()):
        return True


def expected_end(lease: Lease, now: float, cfg: SchedulerConfig) -> float:
    if lease.state is LeaseState.TERMINATING:
        return now
    return max(static_end(lease, cfg), now)


def shadow(head: Workload, cap: Capacity, leases: Iterable[Lease], now: float,
           cfg: SchedulerConfig) -> Reservation:
    """The earliest time the head's gang fits as leases end by their estimates, and where."""
    scratch = cap.copy()
    need_gpu = head.gang.total.gpu
    free_gpu = sum(r.gpu for r in scratch.free.values())
    # In expected-end order: as given when the driver keeps them so (``leaseorder.InEndOrder``), else sorted.
    ordered = leases if isinstance(leases, InEndOrder) else sorted(leases, key=lambda l: expected_end(l, now, cfg))
    for lease in ordered:
        scratch.give_placement(lease.placement, lease.workload.gang.per_worker, lease.devices)
        free_gpu += lease.workload.gang.total.gpu
        if free_gpu + 1e-9 < need_gpu:
            continue
        plan = place(head.gang, scratch, head.data_snapshot)
        if plan is not None:
            spare: Dict[str, Resources] = {}
            workers: Dict[str, int] = {}
            for nid in plan:
                spare[nid] = spare.get(nid, scratch.free[nid]) - head.gang.per_worker
                workers[nid] = workers.get(nid, 0) + 1
            return Reservation(head.id, expected_end(lease, now, cfg), spare,
                               {nid: scratch.dev[nid] for nid in workers}, workers, head.gang.per_worker.gpu)
    return Reservation(head.id, None, {})


@BACKFILLS.register("easy")
class Easy:
    # The shadow time reads the leases in expected-end order: a driver keeps them so (``Snapshot.lease_order``).
    reads_lease_order = True

    def reserve(self, head, cap, leases, now, cfg):
        return shadow(head, cap, leases, now, cfg)

    def allows(self, w, placement, res, now, devices=()):
        if res is None:
            return True
        est = w.planned_s()
        if res.shadow_time is not None and est is not None and now + est <= res.shadow_time:
            return True
        # Otherwise it may only use what the head leaves spare on its planned nodes.
        use: Dict[str, Resources] = {}
        for nid in placement:
            if nid in res.spare:
                use[nid] = use.get(nid, Resources()) + w.gang.per_worker
        if res.shadow_time is None and use:
            return False
        if not all(u.fits_in(res.spare[nid]) for nid, u in use.items()):
            return False
        devs = {nid: res.devices[nid] for nid in use if nid in res.devices}
        g = w.gang.per_worker.gpu
        if g > 0 and devs:
            for i, nid in enumerate(placement):
                if nid not in devs:
                    continue
                d = devs[nid]
                # A share stays on the device it takes now; whole GPUs are alike, any free ones will do.
                idx = devices[i] if devices and g < 1 else None
                if idx is None or any(d[k] < g - 1e-9 for k in idx):
                    idx = choose_devices(d, g)
                if idx is None:
                    return False
                devs[nid] = shift_devices(d, idx, g, -1)
            if any(gpu_slots(d, res.head_gpu) < res.head_workers[nid] for nid, d in devs.items()):
                return False  # room in the sum, but the head's workers would not fit on the devices left
        for nid, u in use.items():
            res.spare[nid] = res.spare[nid] - u
        res.devices.update(devs)
        return True
