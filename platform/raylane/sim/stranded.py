"""Stranded GPUs during a replay: ``raylane.scheduling.fragmentation`` over the gang shapes that wait.

This module owns the count of pending workloads per *shape* (a team and a gang), kept as workloads enter and leave
the queues, so that measuring after an instant looks at the distinct shapes waiting, not at every pending workload.
Jobs of one shape share one ``Gang`` object: shapes are keyed by its id, not by its value, which is slower to hash.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

from raylane.scheduling.fragmentation import admissible, fragmentation, takes_any_gpu
from raylane.scheduling.types import Gang, Node, Workload

__all__ = ["StrandedShapes"]


class StrandedShapes:
    """The shapes of ``workloads`` (``shape_of``, in their order), which of them wait, and the stranded GPUs."""

    def __init__(self, workloads: Iterable[Workload], nodes: Iterable[Node], admission: str):
        self.admission = admission
        self.shape_of: List[int] = []
        ids: Dict[Tuple[str, int], int] = {}
        self.shapes: List[Tuple[str, Gang]] = []
        for w in workloads:
            key = (w.team, id(w.gang))
            s_id = ids.get(key)
            if s_id is None:
                s_id = ids[key] = len(self.shapes)
                self.shapes.append((w.team, w.gang))
            self.shape_of.append(s_id)
        self.count = [0] * len(self.shapes)
        self.waiting: Dict[int, None] = {}
        # Shapes of one worker of one GPU, waiting: when the free GPU counts are whole numbers (whole nodes, whole
        # GPUs per worker), one of these that its quota admits could take any free GPU, so nothing is stranded.
        self.any_gpu = [takes_any_gpu(g) for _, g in self.shapes]
        self.waiting_any_gpu: Dict[int, None] = {}
        self.whole_gpus = (all(nd.capacity.gpu % 1 == 0 for nd in nodes)
                           and all(g.per_worker.gpu % 1 == 0 for _, g in self.shapes))

    def queued(self, s_id: int, k: int) -> None:
        """``k`` workloads of shape ``s_id`` entered (1) or left (-1) the queues."""
        c = self.count[s_id] = self.count[s_id] + k
        if c == 0:
            del self.waiting[s_id]
            self.waiting_any_gpu.pop(s_id, None)
        elif c == k == 1:
            self.waiting[s_id] = None
            if self.any_gpu[s_id]:
                self.waiting_any_gpu[s_id] = None

    def measure(self, state, free_gpus: float) -> float:
        """Stranded GPUs of ``state`` (a ``ClusterState``) with ``free_gpus`` free on the nodes that are up."""
        if not self.waiting or free_gpus <= 1e-9:
            return 0.0  # nothing waits, or no GPU is free
        shapes = self.shapes
        if self.whole_gpus and self.waiting_any_gpu:
            per_team = {}
            for s_id in self.waiting_any_gpu:
                per_team.setdefault(shapes[s_id][0], []).append(shapes[s_id][1])
            if admissible(per_team, state.teams, state.usage, self.admission):
                return 0.0
        per_team: Dict[str, List[Gang]] = {}
        for s_id in self.waiting:
            team, gang = shapes[s_id]
            per_team.setdefault(team, []).append(gang)
        gangs = admissible(per_team, state.teams, state.usage, self.admission)
        return fragmentation(state.nodes.values(), gangs).total
