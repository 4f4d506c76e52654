"""LAS: least attained service first, in discretized queues (Tiresias' 2D-LAS).

A workload's attained service is GPU-seconds received so far (all attempts). ``cfg.las_thresholds`` split it
into queues: below the first threshold is queue 0 (first served), and so on. Inside a queue, FIFO by submit time,
which keeps long jobs from thrashing as they would under pure LAS. With the ``ordering`` preemption policy, a
waiting job in a lower queue preempts running jobs that have been demoted to a higher one.
"""
import bisect

from raylane.scheduling.ordering.base import ORDERINGS


def las_queue(attained_gpu_s: float, thresholds) -> int:
    return bisect.bisect_right(thresholds, attained_gpu_s)


@ORDERINGS.register("las")
class Las:
    def queue_key(self, w, cfg):
        return (las_queue(w.attained_gpu_s, cfg.las_thresholds), w.submit_time, w.id)

    def head_key(self, w, team, cfg):
        return self.queue_key(w, cfg)

    def rank(self, w, attained_gpu_s, cfg):
        return (las_queue(attained_gpu_s, cfg.las_thresholds), w.submit_time, w.id)
