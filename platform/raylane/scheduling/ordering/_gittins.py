"""Gittins: Tiresias' 2D-Gittins index over runtimes learned from history, in LAS's discretized queues.

Service is GPU-time (the gang's GPUs times its seconds of run), as in Tiresias' 2D schedulers. A workload's queue is
LAS's (``cfg.las_thresholds`` over its attained GPU-seconds); inside a queue the highest Gittins index goes first:
the chance it ends within the quantum left to the queue's next threshold, over the GPU-time it is expected to use
of that quantum, from its learned runtime distribution conditional on the service it had
(``RuntimeDist.gittins``). Tiresias assumes the distribution given; here it is learned online
(``raylane.runtimes``). A workload with no prediction has index 0 and waits behind, FIFO among its like. With the
``ordering`` preemption policy, a waiting workload preempts running ones that rank after it.
"""
import bisect
import math

from raylane.scheduling.ordering._las import las_queue
from raylane.scheduling.ordering.base import ORDERINGS


def gittins_index(w, attained_gpu_s: float, thresholds) -> float:
    """``w``'s Gittins index per GPU-second at ``attained_gpu_s`` of service, its quantum up to the next threshold."""
    p = w.predicted
    gpus = w.gang.total.gpu
    if p is None or gpus <= 0:
        return 0.0
    i = bisect.bisect_right(thresholds, attained_gpu_s)
    quantum = (thresholds[i] - attained_gpu_s) / gpus if i < len(thresholds) else math.inf
    return p.gittins(attained_gpu_s / gpus, quantum) / gpus


@ORDERINGS.register("gittins")
class Gittins:
    def queue_key(self, w, cfg):
        return self.rank(w, w.attained_gpu_s, cfg)

    def head_key(self, w, team, cfg):
        return self.queue_key(w, cfg)

    def rank(self, w, attained_gpu_s, cfg):
        return (las_queue(attained_gpu_s, cfg.las_thresholds), -gittins_index(w, attained_gpu_s, cfg.las_thresholds),
                w.submit_time, w.id)
