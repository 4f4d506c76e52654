"""Quota-aware concurrency for Ray Tune: a sweep runs no more trials at once than the slots the control actor granted.

This module owns the *grant*, the state shared between the sweep driver's slot thread (which talks to the control
actor) and Tune's event loop (which starts, pauses and stops trials), and the three Tune plug-ins that read it:

- ``QuotaScheduler`` wraps the spec's trial scheduler (FIFO, median, ASHA, PBT). It hands the wrapped scheduler
  each result with the trial's progress in the sweep's time attribute added (``raylane.sweeps.conventions``:
  ``step``, else Tune's ``training_iteration``, or the spec's ``time_attr``), so every scheduler counts the budget
  the same way whatever the trainable reports. ``choose_trial_to_run`` answers
  None while the trials running or starting fill the grant, so no paused trial resumes past it; ``on_trial_result``
  answers PAUSE (Tune then checkpoints the trial and stops its actor) when more trials run than are granted, which
  is how a sweep shrinks when the control actor reclaims a slot. Every other call goes to the wrapped scheduler.
  A wrapped scheduler that pauses a trial to wait for others (synchronous ASHA waiting at a rung,
  ``raylane.sweeps.rungs``) says so through ``waiting(trial_id)``; such a trial holds no slot (below).
- ``GrantLimiter`` wraps a model-based searcher (a ``ConcurrencyLimiter`` with the spec's ``max_concurrent``) and
  ``GrantedVariantGenerator`` is Tune's random/grid generator: neither draws a new trial while the unfinished trials
  (running, starting or paused) fill the grant. Tune starts every new trial at once, without asking the scheduler,
  so this is the gate on new trials; paused trials resume first. A trial waiting at a rung is not counted: it can
  only go on once the trials not drawn yet reached the rung too, so counting it would deadlock the sweep.
- ``GrantedSearch`` is the same gate around any other search algorithm (a user's own ``BasicVariantGenerator``
  or ``SearchGenerator``, from a script's ``Tuner``: ``raylane.script.tuner``); everything else goes to it.
- ``GrantStopper`` ends the whole experiment when the driver asks (the sweep was cancelled), and a trial at the
  end of its budget (its progress in the time attribute at ``budget.max``).

The plug-ins are pickled into Tune's experiment state (``tuner.pkl``), so they hold only the grant's *key* (the
sweep id) and find the live ``Grant`` in this process's registry (``register``); a driver that resumes a sweep
registers a fresh grant under the same key. Only the slot thread writes ``granted``/``leased``/``stop``; only Tune's
loop writes the trial views; both under the grant's lock.

Words
- *granted*: slots the sweep may use now (admitted, running, not reclaimed).
- *leased*: slots whose capacity the control actor's ledger counts for the sweep: granted ones plus reclaimed ones
  not yet released. The invariant the sweep keeps is *running trials <= leased slots*: a reclaimed slot is released
  only after a trial paused (``Grant.over`` records the worst excess seen, which must stay 0).
- *unfinished*: trials PENDING, RUNNING or PAUSED in Tune.
- *claiming*: unfinished trials that hold or will take a slot: all but those paused to wait at a rung.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, SearchAlgorithm, Searcher
from ray.tune.stopper import Stopper

from raylane.sweeps.conventions import PROGRESS, TimeAttr

__all__ = ["Grant", "TrialView", "register", "grant_for", "QuotaScheduler", "GrantLimiter",
           "GrantedVariantGenerator", "GrantedSearch", "GrantStopper", "UNFINISHED"]

logger = logging.getLogger(__name__)

UNFINISHED = (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)


@dataclass
class TrialView:
    """What the driver knows of one trial, from Tune's loop."""

    trial_id: str
    status: str
    config: Dict[str, Any] = field(default_factory=dict)
    step: Optional[float] = None  # its progress in the sweep's time attribute (``raylane.sweeps.conventions``)
    metric: Optional[float] = None
    # Why it last paused: "quota" (a slot was reclaimed), "rung" (it waits at a rung for the other trials of its
    # cohort: synchronous ASHA) or "scheduler" (PBT's time sharing or exploit).
    paused_by: Optional[str] = None


class Grant:
    """Slots held by one sweep, and the trials Tune runs on them. Thread-safe; see the module docstring."""

    def __init__(self, max_slots: int):
        self.max_slots = max_slots
        # Reentrant: the driver's SIGTERM handler (request_stop) runs on the main thread, which may hold it.
        self._lock = threading.RLock()
        self._granted = 0
        self._leased = 0
        self._stop = False
        self._trials: Dict[str, TrialView] = {}
        self.over = 0  # worst (running - leased) seen; the invariant says 0
        self.history: List[Tuple[float, int, int, int]] = []  # (time, granted, leased, running) on each change

    # -- the slot thread's side
    def set_slots(self, granted: int, leased: int) -> None:
        with self._lock:
            self._granted, self._leased = granted, leased
            self._record()

    def request_stop(self) -> None:
        with self._lock:
            self._stop = True

    # -- Tune's side
    def observe(self, trials: List[Trial], extra: Optional[Trial] = None) -> None:
        """Take Tune's view of every trial (statuses and configs)."""
        with self._lock:
            for t in list(trials) + ([extra] if extra is not None else []):
                view = self._trials.get(t.trial_id)
                if view is None:
                    view = self._trials[t.trial_id] = TrialView(t.trial_id, t.status)
                if view.status == Trial.PAUSED and t.status != Trial.PAUSED:
                    view.paused_by = None
                view.status = t.status
                view.config = dict(t.config)
            self._record()

    def note_result(self, trial_id: str, step: Optional[float], metric: Optional[float]) -> None:
        with self._lock:
            view = self._trials.get(trial_id)
            if view is not None:
                view.step = step if step is not None else view.step
                view.metric = metric if metric is not None else view.metric

    def note_ended(self, trial: Trial, status: str, step: Optional[float] = None,
                   metric: Optional[float] = None) -> None:
        """Tune tells schedulers of an end before it sets the trial's status: record the end now (with the last
        result's progress and metric, when it had them)."""
        with self._lock:
            view = self._trials.setdefault(trial.trial_id, TrialView(trial.trial_id, status))
            view.status, view.paused_by = status, None
            view.step = step if step is not None else view.step
            view.metric = metric if metric is not None else view.metric
            self._record()

    def note_paused(self, trial_id: str, by: str) -> None:
        with self._lock:
            view = self._trials.get(trial_id)
            if view is not None:
                view.paused_by = by

    # -- readers
    @property
    def granted(self) -> int:
        with self._lock:
            return self._granted

    @property
    def leased(self) -> int:
        with self._lock:
            return self._leased

    @property
    def stop_requested(self) -> bool:
        with self._lock:
            return self._stop

    def trials(self) -> Dict[str, TrialView]:
        with self._lock:
            return {k: TrialView(**vars(v)) for k, v in self._trials.items()}

    def count(self, *statuses: str) -> int:
        with self._lock:
            return sum(v.status in statuses for v in self._trials.values())

    def claiming(self) -> int:
        """Unfinished trials that hold or will take a slot: a trial paused to wait at a rung takes none. A trial
        its rung promoted keeps the mark until it resumes; that is harmless, since a first rung is decided only once
        every trial of the sweep was drawn, so there is none left to draw in its place."""
        with self._lock:
            return sum(v.status in UNFINISHED and not (v.status == Trial.PAUSED and v.paused_by == "rung")
                       for v in self._trials.values())

    def _record(self) -> None:
        running = sum(v.status == Trial.RUNNING for v in self._trials.values())
        self.over = max(self.over, running - self._leased)
        entry = (self._granted, self._leased, running)
        if not self.history or self.history[-1][1:] != entry:
            self.history.append((time.time(), *entry))


_GRANTS: Dict[str, Grant] = {}
_REGISTRY_LOCK = threading.Lock()


def register(key: str, grant: Grant) -> Grant:
    """Make ``grant`` the live grant of the sweep ``key`` in this process."""
    with _REGISTRY_LOCK:
        _GRANTS[key] = grant
    return grant


def grant_for(key: str) -> Grant:
    """The live grant of ``key``; an unregistered key gets an empty grant (nothing runs) and a warning."""
    with _REGISTRY_LOCK:
        found = _GRANTS.get(key)
        if found is None:
            logger.warning("no grant registered for sweep %s: no trial may run until one is", key)
            found = _GRANTS[key] = Grant(0)
        return found


class QuotaScheduler(TrialScheduler):
    """The spec's trial scheduler, kept within the grant; see the module docstring."""

    # Each result must reach on_trial_result on its own, so that a reclaimed slot pauses a trial at its next report.
    _supports_buffered_results = False
    time_attr = TimeAttr()  # the default, also for a scheduler unpickled from an experiment saved without one

    def __init__(self, inner: TrialScheduler, grant_key: str, *, time_attr: Optional[TimeAttr] = None):
        super().__init__()
        self.inner = inner
        self.grant_key = grant_key
        self.drawn = 0
        if time_attr is not None:
            self.time_attr = time_attr

    @property
    def metric(self):
        return self.inner.metric

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def _grant(self, tune_controller, extra: Optional[Trial] = None) -> Grant:
        g = grant_for(self.grant_key)
        g.observe(tune_controller.get_trials(), extra)
        return g

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self.inner.on_trial_add(tune_controller, trial)
        self._grant(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self.inner.on_trial_error(tune_controller, trial)
        self._grant(tune_controller).note_ended(trial, Trial.ERROR)

    def on_trial_result(self, tune_controller, trial: Trial, result: Dict) -> str:
        result = self.time_attr.stamped(result, trial.trial_id)
        decision = self.inner.on_trial_result(tune_controller, trial, result)
        g = self._grant(tune_controller)
        g.note_result(trial.trial_id, result[PROGRESS], _number(result.get(self.metric)))
        if decision == TrialScheduler.CONTINUE and trial.status == Trial.RUNNING:
            running = sum(t.status == Trial.RUNNING for t in tune_controller.get_trials())
            if running > g.granted:
                # Over the grant: this trial checkpoints and stops; it resumes when a slot is granted again.
                g.note_paused(trial.trial_id, "quota")
                return TrialScheduler.PAUSE
        if decision in (TrialScheduler.PAUSE, TrialScheduler.NOOP) or trial.status == Trial.PAUSED:
            waits = getattr(self.inner, "waiting", None)
            g.note_paused(trial.trial_id, "rung" if waits is not None and waits(trial.trial_id) else "scheduler")
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: Dict) -> None:
        progress = self.time_attr.value(result) if result else None
        if progress is not None:
            result = {**result, PROGRESS: progress}
        self.inner.on_trial_complete(tune_controller, trial, result)
        self._grant(tune_controller).note_ended(trial, Trial.TERMINATED, progress,
                                                _number((result or {}).get(self.metric)))

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self.inner.on_trial_remove(tune_controller, trial)
        self._grant(tune_controller).note_ended(trial, Trial.TERMINATED)

    def choose_trial_to_run(self, tune_controller) -> Optional[Trial]:
        g = self._grant(tune_controller)
        active = sum(t.status in (Trial.RUNNING, Trial.PENDING) for t in tune_controller.get_trials())
        if active >= g.granted:
            return None
        # Trials paused because a slot was reclaimed come back first; then the scheduler's own choice.
        views = g.trials()
        for t in tune_controller.get_trials():
            if t.status == Trial.PAUSED and views.get(t.trial_id) and views[t.trial_id].paused_by == "quota":
                return t
        return self.inner.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        g = grant_for(self.grant_key)
        return f"{self.inner.debug_string()} Within {g.granted} granted slot(s) ({g.leased} leased)."

    def save(self, checkpoint_path: str):
        return self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str):
        return self.inner.restore(checkpoint_path)


class GrantLimiter(ConcurrencyLimiter):
    """The spec's search algorithm, drawing a new trial only while the grant has room for it."""

    def __init__(self, searcher: Searcher, max_concurrent: int, grant_key: str):
        super().__init__(searcher, max_concurrent=max_concurrent)
        self.grant_key = grant_key

    def suggest(self, trial_id: str) -> Optional[Dict]:
        g = grant_for(self.grant_key)
        if g.claiming() >= g.granted:
            return None
        return super().suggest(trial_id)


def _drawn_all(drawn: int, total: Any, g: "Grant") -> bool:
    """Whether a search algorithm that said it draws ``total`` trials (0 or unknown: not said) has drawn them all
    and none of them claims a slot any more: the one case in which the gate must let Tune hear that the search is
    over (its slots may all be given back by then). While a trial still claims one, the gate answers as before."""
    return isinstance(total, int) and total > 0 and drawn >= total and g.claiming() == 0


class GrantedVariantGenerator(BasicVariantGenerator):
    """Tune's random / grid variant generator (seeded), producing a new trial only while the grant has room."""

    def __init__(self, grant_key: str, **kwargs):
        super().__init__(**kwargs)
        self.grant_key = grant_key
        self.drawn = 0

    def next_trial(self):
        g = grant_for(self.grant_key)
        if not _drawn_all(self.drawn, self.total_samples, g):
            # Once every trial is drawn and over, Tune must hear so (it asks again, and is told finished) whatever
            # the grant: a sweep whose last slot was given back would otherwise wait for a trial that never comes.
            if g.claiming() >= g.granted:
                return None
        trial = super().next_trial()
        self.drawn += trial is not None
        return trial


class GrantedSearch(SearchAlgorithm):
    """Any Tune search algorithm, producing a new trial only while the grant has room; every other call goes to it."""

    def __init__(self, inner: SearchAlgorithm, grant_key: str):
        super().__init__()
        self.inner = inner
        self.grant_key = grant_key
        self.drawn = 0

    @property
    def metric(self):
        return self.inner.metric

    @property
    def total_samples(self):
        return self.inner.total_samples

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def add_configurations(self, experiments) -> None:
        self.inner.add_configurations(experiments)

    def next_trial(self):
        g = grant_for(self.grant_key)
        if not _drawn_all(self.drawn, self.inner.total_samples, g):  # as GrantedVariantGenerator's
            if g.claiming() >= g.granted:
                return None
        trial = self.inner.next_trial()
        self.drawn += trial is not None
        return trial

    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        return self.inner.is_finished()

    def set_finished(self) -> None:
        self.inner.set_finished()

    def has_checkpoint(self, dirpath: str) -> bool:
        return self.inner.has_checkpoint(dirpath)

    def save_to_dir(self, dirpath: str, **kwargs) -> None:
        self.inner.save_to_dir(dirpath, **kwargs)

    def restore_from_dir(self, dirpath: str) -> None:
        self.inner.restore_from_dir(dirpath)


class GrantStopper(Stopper):
    """Ends the experiment once the driver asked (``Grant.request_stop``); stops a trial at the budget's end
    (its progress in the time attribute >= ``budget_max``), whatever its trainable would do."""

    time_attr = TimeAttr()  # the default, also for a stopper unpickled from an experiment saved without one

    def __init__(self, grant_key: str, budget_max: Optional[int] = None, *, time_attr: Optional[TimeAttr] = None):
        self.grant_key = grant_key
        self.budget_max = budget_max
        if time_attr is not None:
            self.time_attr = time_attr

    def __call__(self, trial_id: str, result: Dict) -> bool:
        progress = self.time_attr.value(result)
        return self.budget_max is not None and progress is not None and progress >= self.budget_max

    def stop_all(self) -> bool:
        return grant_for(self.grant_key).stop_requested


def _number(x: Any) -> Optional[float]:
    try:
        return float(x) if x is not None else None
    except (TypeError, ValueError):
        return None
