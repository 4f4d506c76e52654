"""The sweep launcher: runs a ``kind: tune`` spec as a Ray Tune experiment whose trials live on slots the control
actor grants under the team's quota.

    ray job submit --working-dir . -- python -m raylane.run examples/specs/sweep-asha-team-a.yaml

``raylane.run`` hands a ``kind: tune`` spec to ``run_sweep``, which:

1. checks the spec and the trainable before anything queues (``raylane.sweeps.trainables.check_trainable``);
2. submits one *slot* per trial that may run at once (``max_concurrent``, at most ``trials``): a workload named
   ``<sweep name>-slot-<i>`` of the spec's class and team, a gang of 1 worker x ``sweep.resources``, the spec's
   ``run`` metadata. The control actor admits, queues and preempts slots like any gang;
3. runs a slot thread (``SlotManager``) that turns slot states into the *grant*: an admitted slot is taken over
   (``report running``) and adds one to the grant; a slot the actor reclaims (``should_stop``) takes one off at once,
   Tune pauses a trial at its next report (it checkpoints; ``raylane.sweeps.quota``), and only then is the slot
   released as ``yielded`` (back in the queue at its original submit time). Admitted again, it adds one to the
   grant and the paused trial resumes from its checkpoint. Slots no trial will need again are given back early;
4. runs Tune (``Tuner.fit``) with the spec's search algorithm and trial scheduler wrapped to keep to the grant, and
   ``raylane.sweeps.tracking.SweepTracking`` writing one MLflow child run per trial under the sweep's parent run;
5. at the end gives every slot back, ends the MLflow runs of the trials Tune left open with the sweep's own end
   (FAILED, KILLED), tags the best trial, writes on the parent what early stopping saved, and returns the sweep's
   record. A sweep that fails raises a ``RaylaneError`` with the reason (the one a Raylane plug-in raised, such as
   ``raylane.sweeps.conventions.TrialResultError``, or ``SweepFailed`` naming what Tune or Ray raised), never a
   bare traceback of Tune's loop.

Steps 2-5 are ``drive_sweep``, the one driver of every sweep: a ``SweepPlan`` says what it needs to know (name,
class, slot specs, trials, metric, budget, where the experiment lives) and a ``fit`` callable runs Tune within the
grant. ``run_sweep`` makes the plan from a spec (``spec_plan``) and builds the Tuner from its ``sweep:`` section;
script mode (``raylane.script.tuner``) makes it from a user's own ``Tuner`` and keeps their search algorithm and
scheduler, wrapped in the same quota plug-ins.

A driver that dies leaves the Tune experiment (``<storage>/<sweep name>``) and ``raylane_sweep.json`` in it: the
next driver for the same spec name cancels the dead driver's slots, submits new ones, waits until it holds a slot
for each trial that was unfinished (Tune restarts those at once) and resumes the experiment with ``Tuner.restore``:
finished trials stay finished, unfinished ones resume from their last checkpoint, the same MLflow runs go on.
A new sweep therefore needs a new name (or another storage path).

Placement: the control actor counts each slot on the node it chose; Tune places trials itself on any node with the
resources. On one node, or on uniform nodes, this is the same capacity; with node features a trial may run on
another node than its slot's (see docs/sweeps.md).

Words: *slot*, *grant*, *leased*: see ``raylane.sweeps.quota``. *sweep id*: ``<name>-<12 hex>`` (``raylane.ids``),
fixed for the life of the experiment; the key of the MLflow parent run.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from raylane.config.loader import load_spec_from_dict
from raylane.config.models import NAME_MAX
from raylane.control.api import EndState, Outcome
from raylane.control.journal import Kind
from raylane.control.records import TERMINAL, State
from raylane.errors import FatalError, RaylaneError, RetryableError, ValidationError
from raylane.ids import new_id

__all__ = ["run_sweep", "drive_sweep", "SweepPlan", "SweepRun", "spec_plan", "SlotManager", "STATE_FILE", "slot_specs",
           "SweepFailed", "sweep_failure"]

log = logging.getLogger("raylane.sweep")

STATE_FILE = "raylane_sweep.json"
SLOT_SUFFIX = "-slot-{i}"


def _say(msg: str) -> None:
    print(f"[raylane] {msg}", flush=True)


class SweepFailed(FatalError):
    """A sweep ended by an error of Tune, Ray or the user's trainable outside a trial (a trial's own error fails only
    that trial); the message names the sweep and the error."""


_MAX_REASON = 2000  # characters of an error's text kept in the message (Tune's quote whole results)


def sweep_failure(sweep_id: str, error: BaseException) -> RaylaneError:
    """The ``RaylaneError`` to raise for ``error``, which ended the sweep ``sweep_id``: a ``RaylaneError`` in its
    chain of causes as it is (a plug-in's, raised inside Tune's loop), else ``SweepFailed`` with the innermost
    cause (Tune wraps errors in its own, whose text only says to look at the log)."""
    chain, seen = [], set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    found = next((c for c in chain if isinstance(c, RaylaneError)), None)
    if found is not None:
        return found
    root = chain[-1]
    text = str(root).strip() or "(no message)"
    if len(text) > _MAX_REASON:
        text = text[:_MAX_REASON] + " [...]"
    failed = SweepFailed(f"sweep {sweep_id} failed: {type(root).__name__}: {text}")
    failed.__cause__ = error
    return failed


# ------------------------------------------------------------------------------------------------ the spec


def _parse(spec: Dict[str, Any]):
    parsed = load_spec_from_dict(spec, f"sweep {spec.get('name', '?') if isinstance(spec, dict) else '?'}")
    errors = []
    if parsed.kind != "tune" or parsed.sweep is None:
        errors.append(("kind", parsed.kind, "tune (with a sweep section) for a sweep"))
    longest = len(parsed.name) + len(SLOT_SUFFIX.format(i=max(0, (parsed.sweep.concurrency if parsed.sweep else 1) - 1)))
    if longest > NAME_MAX:
        errors.append(("name", parsed.name, f"at most {NAME_MAX - (longest - len(parsed.name))} characters for a "
                                            f"sweep: its slots are named <name>-slot-<i>"))
    gang = spec.get("gang") or {}
    if parsed.sweep is not None and "resources" in gang and parsed.gang.resources != parsed.sweep.resources:
        errors.append(("gang.resources", gang["resources"], "left out for kind: tune (each trial slot is 1 worker "
                                                            "of sweep.resources), or equal to sweep.resources"))
    if errors:
        raise ValidationError(f"sweep {parsed.name}", errors)
    return parsed


def slot_specs(parsed) -> List[Dict[str, Any]]:
    """The workload specs of the sweep's slots: the sweep's spec, renamed, with a gang of 1 x ``sweep.resources``."""
    data = parsed.model_dump(by_alias=True, mode="json", exclude_none=True)
    gang = {**data.get("gang", {}), **parsed.sweep.trial_gang()}
    return [{**data, "name": parsed.name + SLOT_SUFFIX.format(i=i), "gang": gang}
            for i in range(parsed.sweep.concurrency)]


# ------------------------------------------------------------------------------------------------- state


@dataclass
class SweepState:
    """What a later driver needs to resume the sweep: its id, the slots of the last driver, counts."""

    sweep_id: str
    slots: List[str] = field(default_factory=list)
    restarts: int = 0
    unfinished: int = 0
    preemptions: int = 0

    @classmethod
    def load(cls, path: Path) -> Optional["SweepState"]:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(vars(self), indent=2))
        tmp.replace(path)


# ------------------------------------------------------------------------------------------------- slots


@dataclass
class Slot:
    index: int
    wid: str
    phase: str = "waiting"  # waiting (queued or admitted) | active | reclaiming | done
    trial: Optional[str] = None  # the trial the driver books on this slot (Tune places trials itself)
    detail: str = ""


class SlotManager(threading.Thread):
    """The driver's thread between the control actor and Tune: slot states in, the grant out; see the module
    docstring. It writes journal notes on the slots (trial starts, pauses, ends) and their queue detail."""

    def __init__(self, *, ctl, slots: List[Slot], grant, sweep_id: str, trials_total: int, job_id: Optional[str],
                 state: SweepState, state_path: Path, tracker=None, metric: str = "",
                 budget_max: Optional[int] = None, poll_s: float = 0.5):
        super().__init__(name=f"raylane-slots-{sweep_id}", daemon=True)
        self.ctl = ctl
        self.slots = slots
        self.grant = grant
        self.sweep_id = sweep_id
        self.trials_total = trials_total
        self.job_id = job_id
        self.state = state
        self.state_path = state_path
        self.tracker = tracker
        self.metric = metric
        self.budget_max = budget_max
        self.poll_s = poll_s
        self._halt = threading.Event()
        self._seen: Dict[str, tuple] = {}
        self._last_holder: Dict[str, Slot] = {}
        self.errors = 0
        self.events: List[str] = []

    # -- loop
    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except RetryableError as exc:  # the control actor restarting: keep the grant, ask again
                log.warning("sweep %s: control actor unreachable: %s", self.sweep_id, exc)
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick; the error is logged
                self.errors += 1
                log.exception("sweep %s: slot tick failed", self.sweep_id)
            self._halt.wait(self.poll_s)

    def halt(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)

    def _status(self, wid: str) -> Dict[str, Any]:
        try:
            return self.ctl.status(wid, timeout=10)
        except FatalError:
            return {"state": State.CANCELLED.value}
        except Exception as exc:  # noqa: BLE001 - Ray errors while the actor restarts
            raise RetryableError(str(exc)) from exc

    def _note(self, slot: Slot, note: str, **data) -> None:
        self.events.append(f"{slot.wid}: {note}")
        self.ctl.event(slot.wid, note=note, **data)

    def tick(self) -> None:
        """One pass: follow each slot's state, publish the grant, release what is reclaimed or idle."""
        for slot in self.slots:
            if slot.phase == "done":
                continue
            rec = self._status(slot.wid)
            state = State(rec["state"])
            if state.terminal:
                if slot.phase != "done":
                    log.info("sweep %s: slot %s is %s", self.sweep_id, slot.wid, state.value)
                slot.phase, slot.trial = "done", None
            elif slot.phase == "waiting" and state is State.ADMITTED:
                if self.ctl.wait_admission(slot.wid, 0.01)["ready"]:
                    r = self.ctl.running(slot.wid, job_id=self.job_id,
                             note=f"slot taken by sweep {self.sweep_id}")
                    if r["state"] == State.RUNNING:
                        slot.phase = "active"
                        _say(f"{self.sweep_id}: slot {slot.wid} granted")
            elif slot.phase == "active" and state is State.PREEMPTING:
                slot.phase = "reclaiming"
                self.state.preemptions += 1
                why = self._preempt_reason(slot.wid)
                _say(f"{self.sweep_id}: slot {slot.wid} reclaimed ({why}); pausing a trial")
                if self.tracker is not None:
                    self.tracker.event("preempted", f"slot {slot.wid} reclaimed ({why}); a trial pauses with its "
                                                    f"checkpoint")
            elif slot.phase in ("active", "reclaiming") and state is State.PENDING:
                # Released without us (stopped by force after the grace period): back to waiting.
                slot.phase, slot.trial = "waiting", None
        self._publish()
        self._release_reclaimed()
        self._give_back_idle()
        self._book_trials()
        self._publish()
        self._save_state()

    def _preempt_reason(self, wid: str) -> str:
        journal = self.ctl.explain(wid)["journal"]
        return next((e.get("reason") for e in reversed(journal) if e["kind"] == Kind.PREEMPTING), None) or "preempted"

    def _publish(self) -> None:
        granted = sum(s.phase == "active" for s in self.slots)
        leased = granted + sum(s.phase == "reclaiming" for s in self.slots)
        self.grant.set_slots(granted, leased)

    def _release_reclaimed(self) -> None:
        from raylane.sweeps.quota import Trial

        views = self.grant.trials()
        running = sum(v.status == Trial.RUNNING for v in views.values())
        leased = self.grant.leased
        for slot in self.slots:
            if slot.phase != "reclaiming" or running > leased - 1:
                continue
            paused = [v for v in views.values() if v.status == Trial.PAUSED and v.paused_by == "quota"
                      and self._seen.get(v.trial_id) != (Trial.PAUSED, "quota")]
            if paused:
                # The pause is told on the reclaimed slot, whichever slot the trial was booked on.
                v = paused[0]
                self._seen[v.trial_id] = (v.status, v.paused_by)
                self._last_holder[v.trial_id] = slot
                what = f"trial {v.trial_id} paused at step {v.step} with its checkpoint (its slot was reclaimed)"
            else:
                what = "no trial was running on it"
            self._note(slot, f"yielded: {what}")
            at = paused[0].step if paused else None
            self.ctl.release(slot.wid, Outcome.YIELDED, step=int(at) if at is not None else None)
            _say(f"{self.sweep_id}: slot {slot.wid} yielded ({what})")
            slot.phase, slot.trial = "waiting", None
            leased -= 1
            self.grant.set_slots(sum(s.phase == "active" for s in self.slots), leased)

    def _give_back_idle(self) -> None:
        """Slots no trial will need again (the sweep's tail) go back to the queue's other users."""
        from raylane.sweeps.quota import UNFINISHED

        views = self.grant.trials()
        unfinished = sum(v.status in UNFINISHED for v in views.values())
        need = unfinished + max(0, self.trials_total - len(views))
        live = [s for s in self.slots if s.phase in ("waiting", "active")]
        extra = len(live) + sum(s.phase == "reclaiming" for s in self.slots) - need
        if extra <= 0 or not views:
            return
        busy = {v.trial_id for v in views.values() if v.status in UNFINISHED}
        # Waiting slots first, then active ones without a running trial.
        order = [s for s in live if s.phase == "waiting"] + [s for s in live if s.phase == "active"
                                                            and s.trial not in busy]
        for slot in order[:extra]:
            self._final_detail(slot, "given back: no trial left for it")
            if slot.phase == "waiting":
                self.ctl.cancel(slot.wid)
            else:
                self.ctl.release(slot.wid, Outcome.FINISHED, state=EndState.SUCCEEDED,
                     detail="no trial of the sweep left for this slot")
            self.events.append(f"{slot.wid}: given back (no trial left for it)")
            slot.phase, slot.trial = "done", None

    def _book_trials(self) -> None:
        """Book running trials on active slots (for the journal and the queue), note transitions."""
        from raylane.sweeps.quota import Trial

        views = self.grant.trials()
        for slot in self.slots:
            if slot.trial is not None and (slot.phase != "active"
                                           or views.get(slot.trial) is None
                                           or views[slot.trial].status != Trial.RUNNING):
                slot.trial = None
        booked = {s.trial for s in self.slots if s.trial}
        free = [s for s in self.slots if s.phase == "active" and s.trial is None]
        for v in sorted(views.values(), key=lambda v: v.trial_id):
            if v.status == Trial.RUNNING and v.trial_id not in booked and free:
                free.pop(0).trial = v.trial_id
        # Journal notes on trial transitions, on the slot the trial is (or was last) booked on.
        holder = {s.trial: s for s in self.slots if s.trial}
        any_slot = next((s for s in self.slots if s.phase != "done"), self.slots[0])
        for v in views.values():
            key = (v.status, v.paused_by)
            if self._seen.get(v.trial_id) == key:
                continue
            before = self._seen.get(v.trial_id)
            self._seen[v.trial_id] = key
            slot = holder.get(v.trial_id) or self._last_holder.get(v.trial_id) or any_slot
            note = _transition(v, before, self.metric, self.budget_max)
            if note:
                self._note(slot, note)
            if v.trial_id in holder:
                self._last_holder[v.trial_id] = holder[v.trial_id]
        summary = self.summary(views)
        for slot in self.slots:
            if slot.phase == "done":
                continue
            detail = summary + (f"; this slot runs trial {slot.trial}" if slot.trial else "")
            if detail != slot.detail:
                self.ctl.event(slot.wid, detail=detail)
                slot.detail = detail

    def summary(self, views=None) -> str:
        from raylane.sweeps.quota import Trial

        views = self.grant.trials() if views is None else views
        count = {s: sum(v.status == s for v in views.values()) for s in
                 (Trial.RUNNING, Trial.PAUSED, Trial.TERMINATED, Trial.ERROR, Trial.PENDING)}
        parts = [f"{count[Trial.RUNNING]} running", f"{count[Trial.PAUSED]} paused",
                 f"{count[Trial.TERMINATED]} finished"]
        if count[Trial.ERROR]:
            parts.append(f"{count[Trial.ERROR]} failed")
        waiting = self.trials_total - len(views) + count[Trial.PENDING]
        if waiting:
            parts.append(f"{waiting} to start")
        return f"sweep {self.sweep_id}: {', '.join(parts)} of {self.trials_total} trials"

    def _final_detail(self, slot: Slot, why: str) -> None:
        self.ctl.event(slot.wid, detail=f"{self.summary()}; {why}")

    def _save_state(self) -> None:
        from raylane.sweeps.quota import UNFINISHED

        views = self.grant.trials()
        unfinished = sum(v.status in UNFINISHED for v in views.values())
        if unfinished != self.state.unfinished or not self.state_path.exists():
            self.state.unfinished = unfinished
            self.state.save(self.state_path)

    # -- the end
    def finish(self, state: EndState) -> None:
        """Give every slot back: release active ones with ``state``, cancel queued ones."""
        state = EndState(state)
        for slot in self.slots:
            try:
                rec = self._status(slot.wid)
                if rec["state"] in TERMINAL:
                    continue
                self._final_detail(slot, f"sweep {state.value.lower()}")
                if rec["state"] in (State.RUNNING, State.PREEMPTING):
                    self.ctl.release(slot.wid, Outcome.FINISHED if state is EndState.SUCCEEDED else Outcome.FAILED,
                                     state=state, detail=self.summary())
                else:
                    self.ctl.cancel(slot.wid)
            except Exception as exc:  # noqa: BLE001 - give back what we can
                log.warning("sweep %s: could not give slot %s back: %s", self.sweep_id, slot.wid, exc)
            slot.phase = "done"
        self.grant.set_slots(0, 0)


def _transition(v, before: Optional[tuple], metric: str = "", budget_max: Optional[int] = None) -> str:
    from raylane.sweeps.quota import Trial

    at = f" at step {v.step}" if v.step is not None else ""
    prev = before[0] if before else None
    if v.status == Trial.RUNNING:
        if prev == Trial.PAUSED:
            return f"trial {v.trial_id} resumed from its checkpoint{at}"
        if prev is None or (prev == Trial.PENDING and v.step is None):
            params = ", ".join(f"{k}={_short(x)}" for k, x in _flat(v.config).items())
            return f"trial {v.trial_id} started ({params})"
        if prev == Trial.PENDING:
            return f"trial {v.trial_id} resumed from its checkpoint{at}"
    if v.status == Trial.PAUSED:
        why = {"quota": "its slot was reclaimed", "rung": "it waits at its rung for the other trials"}.get(
            v.paused_by, "the scheduler paused it")
        return f"trial {v.trial_id} paused{at} with its checkpoint ({why})"
    if v.status == Trial.TERMINATED:
        how = "finished" if v.step is None or budget_max is None or v.step >= budget_max else "stopped early"
        return f"trial {v.trial_id} {how}{at}" + (f" ({metric} {v.metric:.4g})" if v.metric is not None else "")
    if v.status == Trial.ERROR:
        return f"trial {v.trial_id} failed{at}"
    return ""


def _flat(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


# ------------------------------------------------------------------------------------------------ driver


@dataclass
class SweepPlan:
    """What the sweep driver needs to know of a sweep, however it was described: a spec's ``sweep:`` section
    (``run_sweep``) or the ``Tuner`` of a user's script (``raylane.script.tuner``). Both run through ``drive_sweep``.

    ``spec``: the spec recorded on the MLflow parent run (team, class, ``run`` metadata); ``params``: the parent's
    ``sweep.*`` params; ``budget_max``: every trial's last step in the time attribute, None when unknown (no
    "stopped early" and no compute saved are then claimed); ``sweep_id``: None lets ``drive_sweep`` resume the
    experiment at ``exp_dir`` if there is one (a spec's sweep), a given id always starts afresh (a script's)."""

    name: str
    class_: str
    spec: Dict[str, Any]
    params: Dict[str, Any]
    slot_specs: List[Dict[str, Any]]
    trials: int
    metric: str
    mode: str
    exp_dir: Path
    budget_max: Optional[int] = None
    gpus_per_trial: float = 0.0
    report_every: int = 1
    time_attr: Optional[str] = None
    sweep_id: Optional[str] = None

    @property
    def concurrency(self) -> int:
        return len(self.slot_specs)


@dataclass
class SweepRun:
    """One driver's live sweep, handed to the ``fit`` callable of ``drive_sweep``: its state, grant, MLflow parent
    run, and whether it resumes an earlier driver's experiment."""

    plan: SweepPlan
    state: SweepState
    grant: Any
    tracker: Any
    resumed: bool

    def tracking(self):
        """The Tune callback that keeps one MLflow child run per trial under the parent run."""
        from raylane.sweeps.tracking import SweepTracking

        p = self.plan
        return SweepTracking(
            sweep_id=self.state.sweep_id, parent_run_id=self.tracker.run_id, uri=self.tracker.tracking_uri,
            name=p.name, experiment_id=self.tracker.client.get_run(self.tracker.run_id).info.experiment_id,
            gpus_per_trial=p.gpus_per_trial, budget_max=p.budget_max, report_every=p.report_every,
            time_attr=p.time_attr)


def spec_plan(parsed, storage_path: Optional[str] = None) -> SweepPlan:
    """The plan of a parsed ``kind: tune`` spec."""
    from raylane.launchers.train import DEFAULT_STORAGE
    from raylane.tracking import _flatten, _param_value

    sweep = parsed.sweep
    data = parsed.model_dump(by_alias=True, mode="json", exclude_none=True)
    return SweepPlan(
        name=parsed.name, class_=parsed.class_, spec=data,
        params={f"sweep.{k}": _param_value(v) for k, v in _flatten(data["sweep"])},
        slot_specs=slot_specs(parsed), trials=int(sweep.trials), metric=sweep.metric, mode=sweep.mode,
        exp_dir=Path(storage_path or DEFAULT_STORAGE).expanduser().resolve() / parsed.name,
        budget_max=sweep.budget.max, gpus_per_trial=sweep.resources.gpu, report_every=sweep.budget.report_every,
        time_attr=sweep.time_attr)


def run_sweep(spec: Dict[str, Any], *, ctl, job_id: Optional[str] = None, storage_path: Optional[str] = None,
              tracking_uri: Optional[str] = None, poll_s: float = 0.5, verbose: int = 1) -> Dict[str, Any]:
    """Run the sweep ``spec`` to the end under the control actor ``ctl``; returns its record (``id``, ``state``,
    ``preemptions``, ``restarts``, ``trials``, ``best``, ``gpu_seconds``, ``slots``...). See the module docstring."""
    from raylane.sweeps.trainables import check_trainable

    # 1. Refuse a sweep whose trials could not start, before anything queues.
    parsed = _parse(spec)
    check_trainable(parsed.config, parsed.sweep)
    plan = spec_plan(parsed, storage_path)
    return drive_sweep(plan, lambda run: _fit(ctl, parsed, run, verbose, poll_s), ctl=ctl, job_id=job_id,
                       tracking_uri=tracking_uri, poll_s=poll_s)


def drive_sweep(plan: SweepPlan, fit: Callable[[SweepRun], Any], *, ctl, job_id: Optional[str] = None,
                tracking_uri: Optional[str] = None, poll_s: float = 0.5) -> Dict[str, Any]:
    """Run one sweep to the end: the slots, the grant, the MLflow runs and the end, around ``fit(run)``, which runs
    Tune within ``run.grant`` and returns its ``ResultGrid``. Returns the sweep's record (``results``: that grid);
    a failure gives the slots back, ends the trials' runs and raises ``sweep_failure``'s ``RaylaneError``."""
    from raylane.sweeps import quota

    # Every report is a checkpoint, so Tune snapshots its state often (good for resuming); do not warn about it.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    exp_dir = plan.exp_dir
    # 2. A new sweep, or the one a dead driver left behind (its slots are given back).
    state, resumed = _sweep_state(ctl, plan)
    # 3. The MLflow parent run, keyed by the sweep id.
    tracker = _parent_run(plan, state, resumed, tracking_uri)
    tracker.cost_of = ctl.run_cost  # every slot of every driver names the parent run: the sweep's cost
    # 4. The slots, and the thread that turns their states into the grant.
    grant = quota.register(state.sweep_id, quota.Grant(plan.concurrency))
    manager = _submit_slots(ctl, plan, state, grant, tracker, job_id, resumed, poll_s)
    # 5. Tune, within the grant; any end gives the slots back and leaves the experiment resumable.
    previous_handler = _install_signals(grant)
    results, error = None, None
    manager.start()
    try:
        results = fit(SweepRun(plan, state, grant, tracker, resumed))
        errored = sum(r.error is not None for r in results)
        # Tune also returns when interrupted (SIGINT): trials left unfinished mean the sweep did not end.
        views = grant.trials()
        unfinished = sum(v.status in quota.UNFINISHED for v in views.values()) + max(0, plan.trials - len(views))
        outcome = (EndState.CANCELLED if grant.stop_requested or unfinished
                   else EndState.FAILED if errored == len(results) else EndState.SUCCEEDED)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, once the slots are back
        error = exc
        outcome = EndState.CANCELLED if isinstance(exc, (KeyboardInterrupt, SystemExit)) else EndState.FAILED
    finally:
        manager.halt()
        manager.finish(outcome)
        _restore_signals(previous_handler)
    # 6. The trials' runs, the outcome on the parent run (best trial, compute saved), and the sweep's record.
    try:
        summary = _close_books(tracker, state, plan, outcome, error)
    except Exception as exc:  # noqa: BLE001 - the sweep's own error, if any, is what the user must see
        if error is None:
            raise
        log.warning("sweep %s: its MLflow record could not be completed: %s", state.sweep_id, exc)
        summary = None
        try:
            tracker.finish(outcome.value)
        except Exception:  # noqa: BLE001 - MLflow unreachable: nothing more to do
            pass
    state.save(exp_dir / STATE_FILE)
    if error is not None:
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            raise error
        raise sweep_failure(state.sweep_id, error) from None
    _say(f"sweep {state.sweep_id}: {outcome.value}: best {plan.metric} {summary['best_metric']} (trial "
         f"{summary['best_trial_id']}); GPU-seconds {summary['gpu_seconds_used']:.1f}, "
         f"{summary['gpu_seconds_saved']:.1f} saved against the full budget")
    return {
        "id": state.sweep_id, "state": outcome.value, "preemptions": state.preemptions, "restarts": state.restarts,
        "slots": [s.wid for s in manager.slots], "trials": summary["trials"], "best": {
            "trial_id": summary["best_trial_id"], plan.metric: summary["best_metric"],
            "config": summary["best_config"]},
        "gpu_seconds": {k: summary[k] for k in ("gpu_seconds_used", "gpu_seconds_full_budget", "gpu_seconds_saved")},
        "trained_steps": summary["trained_steps"], "full_budget_steps": summary["full_budget_steps"],
        "stopped_early": summary["stopped_early"], "mlflow_run_id": tracker.run_id, "experiment_path": str(exp_dir),
        "max_running_over_leased": grant.over, "grant_history": list(grant.history), "slot_events": manager.events,
        "results": results,
    }


def _close_books(tracker, state: SweepState, plan: SweepPlan, outcome: EndState, error: Optional[BaseException]):
    """End the trials' MLflow runs Tune left open, write the outcome on the parent run and end it; the summary."""
    from raylane.sweeps.tracking import end_open_trials, summarize

    client = tracker.client
    experiment_id = client.get_run(tracker.run_id).info.experiment_id
    # Trials Tune left unfinished (the sweep failed or was cancelled) end with the sweep: none stays RUNNING.
    status = {EndState.SUCCEEDED: "FINISHED", EndState.FAILED: "FAILED", EndState.CANCELLED: "KILLED"}[outcome]
    left = end_open_trials(client, experiment_id, state.sweep_id, status)
    if left:
        log.info("sweep %s: %d trial run(s) ended %s with the sweep", state.sweep_id, len(left), status)
    summary = summarize(client, experiment_id=experiment_id, sweep_id=state.sweep_id, parent_run_id=tracker.run_id,
                        metric=plan.metric, mode=plan.mode, budget_max=plan.budget_max)
    detail = (f"{summary['trials']} trials; best {plan.metric} {summary['best_metric']} "
              f"(trial {summary['best_trial_id']}); GPU-seconds used {summary['gpu_seconds_used']:.1f} of "
              f"{summary['gpu_seconds_full_budget']:.1f} for the full budget")
    if error is not None and not isinstance(error, (KeyboardInterrupt, SystemExit)):
        detail += f"; {sweep_failure(state.sweep_id, error)}"
    tracker.event("finished" if outcome is EndState.SUCCEEDED else outcome.value.lower(), detail)
    tracker.finish(outcome.value)
    return summary


def _sweep_state(ctl, plan: SweepPlan):
    """The sweep's state: new (``plan.sweep_id``, else a fresh id), or the one of the experiment at
    ``plan.exp_dir``, whose last driver's slots are cancelled (they hold quota no one uses)."""
    from ray.tune import Tuner

    if plan.sweep_id is not None:
        return SweepState(sweep_id=plan.sweep_id), False
    resumed = Tuner.can_restore(str(plan.exp_dir))
    state = SweepState.load(plan.exp_dir / STATE_FILE) if resumed else None
    if state is None:
        return SweepState(sweep_id=new_id(plan.name, kind="sweep")), resumed
    state.restarts += 1
    for wid in state.slots:
        try:
            if ctl.status(wid)["state"] not in TERMINAL:
                ctl.cancel(wid)
        except FatalError:  # forgotten by the control actor: nothing to give back
            pass
    return state, resumed


def _parent_run(plan: SweepPlan, state: SweepState, resumed: bool, tracking_uri: Optional[str]):
    from raylane.tracking import RunTracker

    tracker = RunTracker(workload_id=state.sweep_id, spec=plan.spec, tracking_uri=tracking_uri)
    tracker.start()
    tracker.log_params(plan.params)
    if resumed:
        tracker.event("restarted", f"driver {state.restarts} resumes the sweep from {plan.exp_dir}")
    return tracker


def _submit_slots(ctl, plan: SweepPlan, state: SweepState, grant, tracker, job_id, resumed: bool,
                  poll_s: float) -> "SlotManager":
    slots = []
    for slot_spec in plan.slot_specs:
        slots.append(Slot(len(slots), ctl.submit(slot_spec, job_id=job_id)["id"]))
    state.slots = [s.wid for s in slots]
    state_path = plan.exp_dir / STATE_FILE
    state.save(state_path)
    for s in slots:
        ctl.event(s.wid, mlflow_run_id=tracker.run_id, mlflow_uri=tracker.tracking_uri,
             note=f"slot {s.index} of sweep {state.sweep_id} ({plan.trials} trials, up to {plan.concurrency} at once)")
    _say(f"sweep {state.sweep_id}: {plan.trials} trials, {len(slots)} slot(s) submitted: "
         f"{', '.join(s.wid for s in slots)}" + (f" (resuming, driver {state.restarts})" if resumed else ""))
    return SlotManager(ctl=ctl, slots=slots, grant=grant, sweep_id=state.sweep_id, trials_total=plan.trials,
                       job_id=job_id, state=state, state_path=state_path, tracker=tracker,
                       metric=plan.metric, budget_max=plan.budget_max, poll_s=poll_s)


def _fit(ctl, parsed, run: SweepRun, verbose: int, poll_s: float):
    """Build (or restore) the Tuner of the spec's sweep and run it; returns Tune's ``ResultGrid``."""
    from ray.tune import CheckpointConfig, FailureConfig, RunConfig, TuneConfig, Tuner

    from raylane.sweeps import build, quota
    from raylane.sweeps.trainables import tune_trainable

    sweep, sweep_id, grant, exp_dir = parsed.sweep, run.state.sweep_id, run.grant, run.plan.exp_dir
    trainable = tune_trainable(parsed.config, sweep)
    if run.resumed:
        if run.state.unfinished:
            # Tune starts every unfinished trial of a restored experiment at once: hold a slot for each first.
            need = min(run.state.unfinished, sweep.concurrency)
            _say(f"sweep {sweep_id}: waiting for {need} slot(s) before resuming {run.state.unfinished} "
                 f"unfinished trial(s)")
            while grant.granted < need and not grant.stop_requested:
                time.sleep(poll_s)
        return Tuner.restore(str(exp_dir), trainable=trainable, resume_unfinished=True, resume_errored=True).fit()
    retry_budget = int(ctl.class_info(parsed.class_)["retry_budget"])
    time_attr = build.time_attr(sweep)
    tuner = Tuner(
        trainable,
        param_space=build.param_space(sweep),
        tune_config=TuneConfig(
            metric=sweep.metric, mode=sweep.mode, num_samples=build.num_samples(sweep),
            search_alg=build.search_algorithm(sweep, sweep_id),
            scheduler=quota.QuotaScheduler(build.scheduler(sweep), sweep_id, time_attr=time_attr),
            reuse_actors=False),
        run_config=RunConfig(
            name=parsed.name, storage_path=str(exp_dir.parent), verbose=verbose,
            stop=quota.GrantStopper(sweep_id, sweep.budget.max, time_attr=time_attr),
            callbacks=[run.tracking()],
            # PBT clones the checkpoint a trial had at its last perturbation: keep them all.
            checkpoint_config=CheckpointConfig(num_to_keep=None if sweep.scheduler.type == "pbt" else 2),
            # Tune retries a crashed trial from its last checkpoint, up to the class's retry budget.
            failure_config=FailureConfig(max_failures=retry_budget)),
    )
    return tuner.fit()


def _install_signals(grant):
    """``ray job stop`` sends SIGTERM: end the sweep (its slots go back; the experiment stays resumable)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        grant.request_stop()
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, on_term)


def _restore_signals(previous) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
