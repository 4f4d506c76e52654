"""Synchronous successive halving: ASHA's rungs, decided so that the outcome does not depend on timing.

Ray Tune's ASHA (``AsyncHyperBandScheduler``) decides a trial at a rung against the results recorded there *so far*:
the first trials to arrive are never stopped and a late weak one may be, so which trials stop moves from run to run
with the order in which trials reach the rung. This module decides each rung once, over all the trials that must
reach it, so the stopped set is a function of the trials' results alone.

It owns two things:

- ``Halving``, the pure decision logic (no Ray, no clock): fed each trial's score at each rung, it answers what that
  trial does (``Verdict``) and, when a rung's cohort is complete, the ``RungDecision`` (who goes on, who stops).
  Tests drive it directly, in any order of arrival.
- ``SynchronousHalvingScheduler``, the Ray Tune ``TrialScheduler`` that is a thin shell over it: it pauses a trial
  that waits at a rung (Tune checkpoints it and stops its actor), stops the waiting trials a rung decision drops,
  and lets ``choose_trial_to_run`` resume the ones it promotes.

Words
- *rung*: a budget (in steps) at which trials are compared: ``grace_period * eta**k`` below ``budget.max``
  (``raylane.sweeps.build.asha_rungs``).
- *cohort* of a rung: the trials that must reach it before it is decided: every trial of the sweep for the first
  rung, the trials promoted by the rung below for the others. A trial that ends without reaching the rung (an error,
  a trainable that returns early) leaves the cohort.
- *waiting* (parked): a trial that reached a rung whose cohort is not complete. It is paused with its checkpoint and
  holds no slot (``raylane.sweeps.quota`` does not count it against the grant, so the search draws the next trial in
  its place; waiting trials cannot deadlock a quota-limited sweep).
- *promoted*: among the ``n`` trials with a score at a rung, the best ``max(1, n // eta)``; the others stop. Ties go
  to the lower trial id (Tune numbers trials in the order the search drew them); a missing or NaN score is worst.

The cost of determinism: a rung waits for the slowest trial of its cohort, and a promoted trial that waited restarts
its actor from its checkpoint. Trials that pass the last rung run to ``budget.max``. A sweep resumed by a new driver
starts with a fresh scheduler (Tune pickles it once, at the start): its finished trials leave the cohorts and the
rungs still open are decided among the unfinished trials, so determinism holds for a sweep run by one driver.
"""
from __future__ import annotations

import enum
import math
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

if TYPE_CHECKING:  # pragma: no cover
    from ray.tune.execution.tune_controller import TuneController

__all__ = ["Verdict", "RungDecision", "Outcome", "Halving", "SynchronousHalvingScheduler"]


class Verdict(enum.Enum):
    """What the trial that just reported does next."""

    CONTINUE = "continue"  # below its next rung, promoted past it, or past the last rung
    WAIT = "wait"  # at a rung whose cohort is not complete: pause with its checkpoint, hold no slot
    STOP = "stop"  # dropped at a rung, or at the end of the budget


@dataclass(frozen=True)
class RungDecision:
    """One rung, decided once: ``promoted`` go on, ``stopped`` end (both best first)."""

    rung: int  # the index of the rung
    step: int  # its budget
    promoted: Tuple[str, ...]
    stopped: Tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    decided: Tuple[RungDecision, ...] = ()  # rungs this report completed (at most one, but a tuple like on_end's)


@dataclass
class Halving:
    """Synchronous successive halving over ``expected`` trials; see the module docstring.

    ``rungs``: increasing budgets; ``eta`` >= 2; ``mode``: ``min`` or ``max`` (of the score passed in);
    ``max_t``: the budget at which every trial stops (None: never by this class).
    """

    rungs: Sequence[int]
    eta: int
    expected: int
    mode: str = "min"
    max_t: Optional[int] = None
    # trial id -> index of the next rung it must reach (len(rungs): past the last one)
    level: Dict[str, int] = field(default_factory=dict)
    scores: List[Dict[str, float]] = field(default_factory=list)  # per rung: trial id -> score
    decisions: List[RungDecision] = field(default_factory=list)  # per rung decided so far, in order
    ended: Set[str] = field(default_factory=set)
    stopped: Dict[str, int] = field(default_factory=dict)  # trial id -> the rung that stopped it

    def __post_init__(self) -> None:
        rungs = [int(r) for r in self.rungs]
        if any(b <= a for a, b in zip(rungs, rungs[1:])) or any(r < 1 for r in rungs):
            raise ValueError(f"rungs must be increasing positive budgets, got {rungs}")
        if self.eta < 2:
            raise ValueError(f"eta must be an integer >= 2, got {self.eta}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be min or max, got {self.mode!r}")
        if self.expected < 1:
            raise ValueError(f"expected must be the number of trials (>= 1), got {self.expected}")
        self.rungs = tuple(rungs)
        if not self.scores:
            self.scores = [{} for _ in self.rungs]

    # -- events
    def add(self, trial_id: str) -> None:
        """A trial joined the sweep (a sweep may add more than ``expected``: then it waits for them too)."""
        self.level.setdefault(trial_id, 0)

    def on_result(self, trial_id: str, step: float, score: Optional[float]) -> Outcome:
        """``trial_id`` reported ``score`` (the metric, as given: ``mode`` says which way is better) at ``step``."""
        self.add(trial_id)
        if trial_id in self.stopped:
            return Outcome(Verdict.STOP)
        if self.max_t is not None and step >= self.max_t:
            return Outcome(Verdict.STOP)
        k = self.level[trial_id]
        if k >= len(self.rungs) or step < self.rungs[k]:
            return Outcome(Verdict.CONTINUE)
        self.scores[k].setdefault(trial_id, self._key_score(score))
        decided = self._decide_ready()
        if trial_id in self.stopped:
            return Outcome(Verdict.STOP, decided)
        return Outcome(Verdict.CONTINUE if self.level[trial_id] > k else Verdict.WAIT, decided)

    def on_end(self, trial_id: str) -> Tuple[RungDecision, ...]:
        """``trial_id`` ended (finished, stopped, errored, removed): it leaves the cohorts it has not reached, which
        may complete a rung; returns the rungs decided."""
        self.add(trial_id)
        self.ended.add(trial_id)
        return self._decide_ready()

    # -- readers
    def waiting(self, trial_id: str) -> bool:
        """Whether the trial waits at a rung (reached it, the rung undecided, the trial not ended)."""
        k = self.level.get(trial_id)
        return (k is not None and k < len(self.rungs) and trial_id in self.scores[k]
                and trial_id not in self.ended and trial_id not in self.stopped)

    def stopped_at(self) -> Dict[int, int]:
        """Budget of each rung -> trials it stopped."""
        return {d.step: len(d.stopped) for d in self.decisions}

    # -- the decision
    def _key_score(self, score: Optional[float]) -> float:
        """Higher is better; missing or NaN is worst."""
        if score is None or (isinstance(score, float) and math.isnan(score)):
            return -math.inf
        return float(score) if self.mode == "max" else -float(score)

    def _complete(self, k: int) -> bool:
        if k == 0:
            cohort = set(self.level)
            if len(cohort) < self.expected:
                return False  # trials the search has not drawn yet
        else:
            cohort = set(self.decisions[k - 1].promoted)
        return all(t in self.scores[k] or t in self.ended for t in cohort)

    def _decide_ready(self) -> Tuple[RungDecision, ...]:
        out = []
        while len(self.decisions) < len(self.rungs) and self._complete(len(self.decisions)):
            k = len(self.decisions)
            ranked = sorted(self.scores[k].items(), key=lambda kv: (-kv[1], kv[0]))
            keep = max(1, len(ranked) // self.eta) if ranked else 0
            decision = RungDecision(k, self.rungs[k], tuple(t for t, _ in ranked[:keep]),
                                    tuple(t for t, _ in ranked[keep:]))
            for t in decision.promoted:
                self.level[t] = k + 1
            for t in decision.stopped:
                self.stopped[t] = k
            self.decisions.append(decision)
            out.append(decision)
        return tuple(out)


class SynchronousHalvingScheduler(FIFOScheduler):
    """ASHA's rungs with synchronous decisions (``scheduler: {type: asha, synchronous: true}``): a Ray Tune shell
    over ``Halving``; see the module docstring. Its ``time_attr`` must grow with training (the sweeps use the
    progress ``raylane.sweeps.quota.QuotaScheduler`` adds: ``step``, else ``training_iteration``).
    """

    _supports_buffered_results = False  # a trial must be paused at the rung's own report, not a later one

    def __init__(self, *, time_attr: str, rungs: Sequence[int], eta: int, trials: int, max_t: Optional[int] = None,
                 metric: Optional[str] = None, mode: Optional[str] = None):
        super().__init__()
        self._time_attr = time_attr
        self._metric = metric
        self._mode = mode
        self._args = dict(rungs=tuple(rungs), eta=eta, expected=trials, max_t=max_t)
        self.halving = Halving(mode=mode or "min", **self._args)

    @property
    def metric(self) -> Optional[str]:
        return self._metric

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        self.halving = Halving(mode=self._mode or "min", **self._args)
        return True

    def on_trial_add(self, tune_controller: "TuneController", trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(f"{type(self).__name__} needs a metric and a mode (got {self._metric!r}, "
                             f"{self._mode!r}): pass them to tune.TuneConfig")
        self.halving.add(trial.trial_id)
        if trial.status in (Trial.TERMINATED, Trial.ERROR):
            # A resumed experiment (``Tuner.restore``) adds its finished trials again; the scheduler starts afresh
            # (Tune pickles it once, at the start), so they leave the cohorts rather than hold a rung forever.
            self._carry_out(tune_controller, self.halving.on_end(trial.trial_id), current=trial)

    def on_trial_result(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE
        outcome = self.halving.on_result(trial.trial_id, result[self._time_attr], _number(result[self._metric]))
        self._carry_out(tune_controller, outcome.decided, current=trial)
        return {Verdict.CONTINUE: TrialScheduler.CONTINUE, Verdict.WAIT: TrialScheduler.PAUSE,
                Verdict.STOP: TrialScheduler.STOP}[outcome.verdict]

    def on_trial_complete(self, tune_controller: "TuneController", trial: Trial, result: Dict) -> None:
        self._carry_out(tune_controller, self.halving.on_end(trial.trial_id), current=trial)

    def on_trial_error(self, tune_controller: "TuneController", trial: Trial) -> None:
        self._carry_out(tune_controller, self.halving.on_end(trial.trial_id), current=trial)

    def on_trial_remove(self, tune_controller: "TuneController", trial: Trial) -> None:
        self._carry_out(tune_controller, self.halving.on_end(trial.trial_id), current=trial)

    def _carry_out(self, tune_controller: "TuneController", decided: Tuple[RungDecision, ...], current: Trial) -> None:
        """Stop the waiting trials a rung dropped (the current trial is answered by the caller's return value).
        The promoted ones are resumed by ``choose_trial_to_run``."""
        if not decided:
            return
        drop = {t for d in decided for t in d.stopped} - {current.trial_id}
        for t in tune_controller.get_trials():
            if t.trial_id in drop and t.status not in (Trial.TERMINATED, Trial.ERROR):
                tune_controller.stop_trial(t)

    def waiting(self, trial_id: str) -> bool:
        """Whether the trial waits at a rung: paused, holding no slot (``raylane.sweeps.quota`` reads this)."""
        return self.halving.waiting(trial_id)

    def choose_trial_to_run(self, tune_controller: "TuneController") -> Optional[Trial]:
        trials = tune_controller.get_trials()
        for t in trials:
            if t.status == Trial.PENDING:
                return t
        for t in trials:
            if t.status == Trial.PAUSED and not self.halving.waiting(t.trial_id) \
                    and t.trial_id not in self.halving.stopped:
                return t
        return None

    def debug_string(self) -> str:
        h = self.halving
        waiting = sum(h.waiting(t) for t in h.level)
        done = ", ".join(f"rung {d.step}: {len(d.promoted)} on, {len(d.stopped)} stopped" for d in h.decisions)
        return (f"Synchronous successive halving (rungs {list(h.rungs)}, eta {h.eta}): {waiting} waiting at a rung"
                + (f"; {done}" if done else ""))

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


def _number(x) -> Optional[float]:
    try:
        return float(x) if x is not None else None
    except (TypeError, ValueError):
        return None
