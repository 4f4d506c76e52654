"""Priority: higher class priority first, FIFO among equals."""
from raylane.scheduling.ordering.base import ORDERINGS, StaticOrdering


@ORDERINGS.register("priority")
class Priority(StaticOrdering):
    def queue_key(self, w, cfg):
        return (-w.cls.priority, w.submit_time, w.id)
