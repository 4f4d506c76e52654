"""FIFO: first submitted, first considered, across all teams."""
from raylane.scheduling.ordering.base import ORDERINGS, StaticOrdering


@ORDERINGS.register("fifo")
class Fifo(StaticOrdering):
    def queue_key(self, w, cfg):
        return (w.submit_time, w.id)
