"""SRTF: shortest remaining time first, from the runtime estimate.

Given exact estimates (the simulator's oracle mode) this is the shortest-remaining-time-first reference that no
policy without knowledge of durations can beat on average JCT; with estimates from users it is SJF-by-estimate.
Remaining time is the estimate minus the time already run (attained GPU-seconds over the gang's GPUs). A workload
with no estimate goes after every one that has one. A workload with a learned prediction (``Workload.predicted``)
ranks by the median of its remaining time given the service it had (``RuntimeDist.remaining``).
"""
import math

from raylane.scheduling.ordering.base import ORDERINGS


def remaining_s(w, attained_gpu_s: float) -> float:
    gpus = max(w.gang.total.gpu, 1e-9)
    if w.predicted is not None:
        return w.predicted.remaining(attained_gpu_s / gpus)
    if w.runtime_estimate_s is None:
        return math.inf
    return max(0.0, w.runtime_estimate_s - attained_gpu_s / gpus)


@ORDERINGS.register("srtf")
class Srtf:
    def queue_key(self, w, cfg):
        return (remaining_s(w, w.attained_gpu_s), w.submit_time, w.id)

    def head_key(self, w, team, cfg):
        return self.queue_key(w, cfg)

    def rank(self, w, attained_gpu_s, cfg):
        return (remaining_s(w, attained_gpu_s), w.submit_time, w.id)
