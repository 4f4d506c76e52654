"""Per-flavor quotas: how many GPUs of each node type a team may hold (Kueue's resource flavors).

A team's ``flavors`` (``Team.flavors``: node type -> ``Quota`` of GPUs) limit the GPUs its leases hold on nodes of
each named type, beside its quota over all nodes (``Team.quotas``), which still applies. Each node type is a quota
pool of its own, with the model ``raylane.scheduling.admission`` gives the whole cluster: a team may hold up to its
flavor nominal plus borrowing limit of a type; what it does not use of its nominal beyond ``nominal -
lending_limit`` is lent to the other teams with a quota of that type. A node type a team names no quota for is not
limited for it by flavors. Flavor pools are flat: cohorts (``raylane.scheduling.cohorts``) shape the team quotas,
not the flavor ones.

The ledger (``QuotaLedger``) keeps the GPUs each flavored team holds per node type beside its usage; ``Working``
passes the node types a placement lands on (``placed_gpus``). The cycle asks ``restrict`` before it places a gang:
the node types the gang may use now (its ``node_types``, else every node type of the cluster) less those whose
quota cannot take the gang whole (a conservative test for a gang that could span types), and ``QuotaExceeded``
naming the flavor when none is left. Pure: no Ray, no clock.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from raylane.scheduling.types import Lease, Node, QuotaExceeded, Team, Workload


def flavored(teams: Mapping[str, Team]) -> bool:
    """Whether any team has a per-flavor quota."""
    return any(t.flavors for t in teams.values())


def placed_gpus(per_worker_gpu: float, placement: Sequence[str], node_type_of) -> Tuple[Tuple[str, float], ...]:
    """The GPUs a gang of ``per_worker_gpu`` per worker holds on each node type when placed on ``placement``
    (``node_type_of(node id)``: its type; None for a node no longer known, which is counted nowhere)."""
    if per_worker_gpu <= 0:
        return ()
    out: Dict[str, float] = {}
    for nid in placement:
        t = node_type_of(nid)
        if t is not None:
            out[t] = out.get(t, 0.0) + per_worker_gpu
    return tuple(out.items())


def flavor_usage(leases: Iterable[Lease], nodes: Iterable[Node], teams: Mapping[str, Team]
                 ) -> Dict[str, Dict[str, float]]:
    """GPUs each team with flavor quotas holds per node type, from its leases' placements on ``nodes``."""
    limited = {name for name, t in teams.items() if t.flavors}
    if not limited:
        return {}
    types = {n.id: n.node_type for n in nodes}
    out: Dict[str, Dict[str, float]] = {}
    for l in leases:
        if l.team not in limited:
            continue
        got = out.setdefault(l.team, {})
        for t, g in placed_gpus(l.workload.gang.per_worker.gpu, l.placement, types.get):
            got[t] = got.get(t, 0.0) + g
    return out


def flavor_rooms(teams: Mapping[str, Team], usage, leases: Iterable[Lease], nodes: Iterable[Node]
                 ) -> Tuple[Tuple[str, str, float], ...]:
    """(team, node type, GPUs) each flavor quota still has room for, given what ``leases`` hold on ``nodes`` (the
    scale-up demand's ``ScaleSnapshot.flavor_room``); () when no team has flavor quotas."""
    if not flavored(teams):
        return ()
    from raylane.scheduling.admission import QuotaLedger

    ledger = QuotaLedger(teams, usage, flavor_usage(leases, nodes, teams))
    return tuple((team, t, ledger.flavor_room(team, t)) for team, lim in sorted(ledger.flimits.items())
                 for t in sorted(lim))


def restrict(ledgers, w: Workload, need_gpu: float, all_types: Iterable[str]
             ) -> Tuple[Workload, Optional[QuotaExceeded]]:
    """``w`` as it may be placed now under its team's flavor quotas on every ledger of ``ledgers``: its gang kept to
    the node types with room for ``need_gpu`` more, and ``QuotaExceeded`` (for the first of its types) when no type
    it may use has room. ``w`` itself when nothing is limited for it."""
    gang = w.gang
    candidates = gang.node_types or tuple(sorted(set(all_types)))
    full = []
    first = None  # (node type, its room, the ledger that has too little): the figures of the reason
    for t in candidates:
        for ledger in ledgers:
            room = ledger.flavor_room(w.team, t)
            if room is not None and need_gpu > room + 1e-9:
                full.append(t)
                if first is None:
                    first = (t, room, ledger)
                break
    if not full:
        return w, None
    if len(full) == len(candidates):
        t, room, ledger = first
        nominal, _, _ = ledger.flimits[w.team][t]
        used = ledger.flavor_used(w.team, t)
        borrowable = max(0.0, room - max(0.0, nominal - used))
        return w, QuotaExceeded(w.team, "gpu", used, nominal, borrowable, need_gpu, t,
                                tuple(x for x in full if x != t))
    if gang.node_types:
        keep = tuple(t for t in gang.node_types if t not in full)
        return replace(w, gang=replace(gang, node_types=keep)), None
    return replace(w, gang=replace(gang, avoid_types=gang.avoid_types | frozenset(full))), None


def flavor_errors(teams: Mapping[str, Team], node_types: Iterable[str]) -> Tuple[Tuple[str, str, str], ...]:
    """(team, flavor, what is allowed) for each flavor quota naming a node type not among ``node_types``."""
    known = sorted(set(node_types) - {""})
    return tuple((name, t, f"a node type of the cluster: {', '.join(known) or '(none has a node type)'}")
                 for name, team in sorted(teams.items()) for t in sorted(team.flavors) if t not in known)


__all__ = ["flavored", "placed_gpus", "flavor_usage", "flavor_rooms", "restrict", "flavor_errors"]
