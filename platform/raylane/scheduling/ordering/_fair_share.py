"""Fair share: the team furthest below its weighted share goes first (Slurm's fair-share factor, simplified).

A team's share is what it holds now plus its decayed past usage, both in GPUs, divided by its weight:
``(gpus held + decayed GPU-seconds / mean life) / weight``. Decayed usage is kept by the driver with the
configured half-life; the mean life of an exponential decay is ``half_life / ln 2``. Inside a team, priority then
submit time decide.
"""
import math

from raylane.scheduling.ordering.base import ORDERINGS


def team_share(team, usage, cfg) -> float:
    mean_life = cfg.fair_share_half_life_s / math.log(2)
    return (usage.gpu + team.decayed_usage / mean_life) / max(team.weight, 1e-9)


@ORDERINGS.register("fair-share")
class FairShare:
    def queue_key(self, w, cfg):
        return (-w.cls.priority, w.submit_time, w.id)

    def head_key(self, w, team, cfg):
        return (team_share(team.team, team.usage, cfg), -w.cls.priority, w.submit_time, w.id)

    def rank(self, w, attained_gpu_s, cfg):
        return self.queue_key(w, cfg)
