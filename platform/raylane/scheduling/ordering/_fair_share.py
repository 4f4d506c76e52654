"""Fair share: the team furthest below its weighted share goes first (Slurm's fair-share factor, simplified).

A team's share is what it holds now plus its decayed past usage, both in GPUs, divided by its weight:
``(gpus held + decayed GPU-seconds / mean life) / weight``. Decayed usage is kept by the driver with the
configured half-life; the mean life of an exponential decay is ``half_life / ln 2``. Inside a team, priority then
submit time decide.

Under a cohort tree (``raylane.scheduling.cohorts``) the comparison is hierarchical: siblings are compared by the
shares of their subtrees, first at the top (a cohort's share sums what every team under it holds and its decayed
usage, over the cohort's weight), then inside the cohort two teams share, and so on down to the teams; equal
shares of two different cohorts are broken by name, and a team under the root goes before a cohort of equal share.
"""
import math

from raylane.scheduling.ordering.base import ORDERINGS


def team_share(team, usage, cfg) -> float:
    mean_life = cfg.fair_share_half_life_s / math.log(2)
    return (usage.gpu + team.decayed_usage / mean_life) / max(team.weight, 1e-9)


def _tree_share(tree, cohort, ledger, mean_life) -> float:
    held = sum(ledger.used(t).gpu for t in tree.members[cohort])
    return (held + tree.decayed[cohort] / mean_life) / max(tree.weight[cohort], 1e-9)


@ORDERINGS.register("fair-share")
class FairShare:
    def queue_key(self, w, cfg):
        return (-w.cls.priority, w.submit_time, w.id)

    def head_key(self, w, team, cfg):
        share = team_share(team.team, team.usage, cfg)
        ledger = getattr(team, "ledger", None)
        tree = ledger.tree if ledger is not None else None
        if tree is None:
            return (share, -w.cls.priority, w.submit_time, w.id)
        # The shares of the team's cohorts, top-down, then its own: (top share, (top name, next share, next
        # name, ..., own share)); a team under the root has an empty tail.
        path = tree.path.get(team.team.name, ())
        if not path:
            return (share, (), -w.cls.priority, w.submit_time, w.id)
        mean_life = cfg.fair_share_half_life_s / math.log(2)
        tail = []
        for c in path[1:]:
            tail += [path[len(tail) // 2], _tree_share(tree, c, ledger, mean_life)]
        tail += [path[-1], share]
        return (_tree_share(tree, path[0], ledger, mean_life), tuple(tail), -w.cls.priority, w.submit_time, w.id)

    def rank(self, w, attained_gpu_s, cfg):
        return self.queue_key(w, cfg)
