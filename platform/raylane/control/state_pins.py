"""Checkpoint pins in the control plane (a role of ``raylane.control.state.ControlState``).

A workload whose config names another workload's checkpoint (``config.init_from: {workload, step}``: the rules are
``raylane.control.checkpoints``') is *held* out of the queue until that checkpoint exists, and a pipeline's stage
until the stages it needs are done (``Pipelines.may_go``); then it queues like any workload. A step is *pinned* as
soon as it is written: the state journals the pin with the copy's path and asks for the copy as an effect
(``effects.PinCheckpoint``, carried out by the actor after the commit; ``pin_copied`` reports how it went), so the
source's retention can delete the original. The pin is let go once its consumer has loaded it (it wrote a
checkpoint of its own, or ended), and the copy is removed (``effects.DropPin``) once no consumer holds it.

It owns the held set and the copies asked for and not yet reported. Handed the records, the ``ClusterState``
(getter: a policy reload replaces it), ``append``, ``emit``, ``poke``, ``core`` (a record's core workload, to
queue it) and ``may_go`` (a pipeline stage's gate).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from raylane.control import checkpoints as ckrefs
from raylane.control import effects as fx
from raylane.control.checkpoints import ref_key
from raylane.control.journal import Kind
from raylane.control.records import Record, State
from raylane.errors import NotFoundError


class Pins:
    """The held set and the pinned checkpoints (module docstring)."""

    def __init__(self, *, records, state: Callable[[], Any], append: Callable[..., Any],
                 emit: Callable[[fx.Effect], None], poke: Callable[[], None], core: Callable[[Record], Any],
                 may_go: Callable[[Record], bool]):
        self.records, self._state = records, state
        self._append, self._emit, self._poke = append, emit, poke
        self._core, self._may_go = core, may_go
        # Pending workloads held out of the queue until the checkpoint they start from exists, or their pipeline
        # inputs are done.
        self._waiting: set = set()
        # Pinned copies asked for (PinCheckpoint) whose copy is not reported yet (``pin_copied``): they count as
        # there, as they will be before anything reads them (the actor copies once the pin is committed).
        self._copying: set = set()

    @property
    def state(self):
        return self._state()

    @property
    def held(self) -> set:
        """The ids of the workloads held out of the queue (read only)."""
        return self._waiting

    def clear(self) -> None:
        """The scheduler's state is made again (recovery, a policy reload): nothing is held yet."""
        self._waiting = set()

    def hold(self, rec: Record, *, try_now: bool = True) -> None:
        """Hold ``rec`` out of the queue until what it waits for is there; with ``try_now``, queue it at once if
        it is there already (else the next tick does)."""
        self._waiting.add(rec.id)
        if try_now:
            self.release_if_ready(rec)

    def ref_of(self, rec: Record):
        """The checkpoint reference ``rec``'s config names, or None."""
        key = ref_key(rec.spec)
        return ckrefs.parse_ref((rec.spec.get("config") or {}).get(key), f"config.{key}")

    def _exists(self, path: str) -> bool:
        return path in self._copying or os.path.isdir(path)

    def judge(self, ref, source: Record, rec: Optional[Record] = None):
        """Whether ``ref`` (of ``rec``, if it is one's already) can resolve on ``source``: ``checkpoints.judge``."""
        max_step, every = ckrefs.source_limits(source.spec)
        pinned = (rec.pin.get("path") if rec is not None and rec.pin.get("step") == ref.step else None)
        return ckrefs.judge(ref, source_id=source.id, source_ended=source.state.terminal, max_step=max_step,
                            cadence=every, written=source.checkpoints, pinned=pinned, exists=self._exists)

    def _pin_now(self, rec: Record, source: Record, step: int, path: str) -> str:
        """Copy ``source``'s checkpoint at ``step`` out of its retention's reach (journaled on ``rec``, then asked
        for); the copy's path."""
        if rec.pin.get("path") and rec.pin.get("step") == step and self._exists(rec.pin["path"]):
            return rec.pin["path"]
        dst = ckrefs.pin_dir(path, step)
        self._append(Kind.PINNED, rec, source=source.id, step=step, path=dst,
                     note=f"pinned {source.id}'s checkpoint at step {step}: {dst}")
        self._copying.add(dst)
        self._emit(fx.PinCheckpoint(rec.id, path, dst))
        return dst

    def pin_copied(self, wid: str, path: str, error: Optional[str]) -> None:
        """Event: the actor carried out a ``PinCheckpoint``: the copy at ``path`` is there (``error`` None), or it
        could not be made (journaled on ``wid``: the next resolve of its checkpoint pins it again, from the
        original while that is on disk)."""
        self._copying.discard(path)
        rec = self.records.get(wid)
        if error is not None and rec is not None:
            self._append(Kind.EVENT, rec, note=f"the copy of its pinned checkpoint ({path}) failed: {error}")

    def release_ready(self) -> None:
        """Queue every held workload whose checkpoint or inputs are there now (a tick)."""
        for wid in list(self._waiting):
            self.release_if_ready(self.records[wid])

    def release_if_ready(self, rec: Record) -> None:
        """Queue a held-back consumer once its checkpoint exists; fail it if it never can."""
        if rec.id not in self._waiting:
            return
        if rec.state is not State.PENDING:
            self._waiting.discard(rec.id)
            return
        if not self._may_go(rec):  # a pipeline's stage whose inputs are not done (state_pipelines)
            return
        ref = self.ref_of(rec)
        if ref is None:  # a stage with no checkpoint to wait for
            self._waiting.discard(rec.id)
            self.state.enqueue(self._core(rec))
            self._poke()
            return
        source = ckrefs.find_source(ref, self.records.values()) if ref is not None else None
        if source is None:
            verdict = ckrefs.Verdict(never=True, reason=f"workload {ref.workload if ref else '?'} is gone")
        else:
            verdict = self.judge(ref, source, rec)
        if verdict.never:
            self._append(Kind.FINISHED, rec, state=State.FAILED, outcome="checkpoint reference",
                         note=f"failed: config.{ref_key(rec.spec)} {ref}: {verdict.reason}")
            self._emit(fx.Wake(rec.id))
            return
        if verdict.ready:
            if ref.step is not None:
                self._pin_now(rec, source, verdict.step, verdict.path)
            self._waiting.discard(rec.id)
            self.state.enqueue(self._core(rec))
            self._poke()
            return
        rec.reason, rec.position, rec.reason_data = verdict.reason, None, {"type": "WaitingForCheckpoint"}

    def ended(self, rec: Record) -> None:
        """``rec`` ended: it is held no more, and lets go of its pin."""
        self._waiting.discard(rec.id)
        self.unpin(rec, f"{rec.id} ended")

    def unpin(self, rec: Record, why: str) -> None:
        """``rec`` no longer needs its pinned checkpoint; the copy goes once no other consumer holds it."""
        if not rec.pin or rec.pin.get("released"):
            return
        path = rec.pin.get("path")
        self._append(Kind.UNPINNED, rec, note=f"released its pin on {rec.pin['source']}'s checkpoint ({why})")
        held = any(r.pin.get("path") == path and not r.pin.get("released") for r in self.records.values())
        if path and not held:
            self._copying.discard(path)  # a copy asked for and not made yet is made, then removed, in that order
            self._emit(fx.DropPin(path))

    def checkpoint_saved(self, rec: Record, step: int, path: str) -> None:
        """``rec``'s gang wrote its checkpoint at ``step`` (journaled already): it has loaded what it pinned, and
        the consumers that wait for this step are pinned to it and queued."""
        # It has a checkpoint of its own: a resume starts from that, so whatever it pinned has been loaded.
        self.unpin(rec, "loaded: it wrote a checkpoint of its own")
        for other in list(self.records.values()):
            if other.pin.get("source") == rec.id and not other.pin.get("released") and other.pin.get("step") == step:
                self._pin_now(other, rec, step, path)
            if other.id in self._waiting:
                self.release_if_ready(other)

    def resolve(self, rec: Record) -> Dict[str, Any]:
        """The directory a starting consumer loads (pinned for it); raises NotFoundError if it can never resolve."""
        ref = self.ref_of(rec)
        if ref is None:
            return {"path": None}
        pinned = rec.pin.get("path")
        if pinned and self._exists(pinned):
            return {"path": pinned, "step": rec.pin.get("step"), "source": rec.pin.get("source")}
        source = ckrefs.find_source(ref, self.records.values())
        verdict = self.judge(ref, source, rec) if source is not None else ckrefs.Verdict(
            never=True, reason=f"workload {ref.workload} is gone")
        if not verdict.ready:
            raise NotFoundError(f"config.{ref_key(rec.spec)} {ref}: {verdict.reason}")
        path = self._pin_now(rec, source, verdict.step, verdict.path)
        return {"path": path, "step": verdict.step, "source": source.id}
