"""QSSF: quasi-shortest service first (Helios): the least predicted GPU-time first.

A workload's service is its gang's GPUs times its predicted runtime: the median of its learned runtime distribution
given the service it had (``Workload.predicted``, ``raylane.runtimes``), else its estimate. Helios predicts it from
the user's and the job name's history, as the runtime model does. Work with neither waits behind all that has one,
FIFO among its like. With the ``ordering`` preemption policy it ranks running work by predicted remaining GPU-time.
"""
import math

from raylane.scheduling.ordering._srtf import remaining_s
from raylane.scheduling.ordering.base import ORDERINGS


def predicted_service(w, attained_gpu_s: float) -> float:
    """GPU-seconds ``w`` is predicted to still need, given ``attained_gpu_s`` of service (inf: nothing says)."""
    left = remaining_s(w, attained_gpu_s)  # SRTF's remaining seconds, at the gang's size
    return left if left == math.inf else w.gang.total.gpu * left


@ORDERINGS.register("qssf")
class Qssf:
    def queue_key(self, w, cfg):
        return (predicted_service(w, w.attained_gpu_s), w.submit_time, w.id)

    def head_key(self, w, team, cfg):
        return self.queue_key(w, cfg)

    def rank(self, w, attained_gpu_s, cfg):
        return (predicted_service(w, attained_gpu_s), w.submit_time, w.id)
