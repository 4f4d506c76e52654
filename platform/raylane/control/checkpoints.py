"""Checkpoint references between workloads: ``config.init_from: {workload: NAME_OR_ID, step: latest | N}``.

A fine-tune names another workload's checkpoint instead of a directory. This module owns what the control actor
decides about such a reference, with no Ray in it: parsing it, finding its source, whether it can resolve now,
later, or never, and where the pinned copy of the checkpoint lives. The state machine journals what it decides and
asks for the file work as effects (``effects.PinCheckpoint``, ``effects.DropPin``: ``raylane.control.state_pins``);
the actor carries them out with ``copy_pin`` / ``drop_copy``.

Words:
- *source*: the workload whose checkpoint is named; *consumer*: the workload that names it.
- *written*: the checkpoints the source's gang reported (step -> directory), journaled as ``checkpointed``. Ray
  Train's retention deletes all but the newest few of them as training goes on.
- *pin*: a consumer's claim on one step of its source. The checkpoint is copied, as hard links (no bytes are copied
  on one file system), to ``<source run dir>/_pinned/checkpoint_<step>`` as soon as it exists (at submit if it is
  already written, when it is written otherwise, at the consumer's start for ``latest``), so the source's
  retention can delete the original. The copy goes when no consumer that has not yet loaded it is left: a consumer
  has loaded it once it has written a checkpoint of its own (a resume starts from that) or has ended.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional

from raylane.errors import ValidationError

__all__ = ["CheckpointRef", "parse_ref", "step_of", "Verdict", "judge", "pin_dir", "pin_copy", "copy_pin",
           "drop_copy"]

LATEST = "latest"
PIN_FOLDER = "_pinned"
_STEP_DIR = re.compile(r"^checkpoint_0*(\d+)$")


@dataclass(frozen=True)
class CheckpointRef:
    """``workload``: a workload id or name; ``step``: a step, or None for the latest checkpoint at the start."""

    workload: str
    step: Optional[int] = None

    def __str__(self) -> str:
        return f"{self.workload}@{LATEST if self.step is None else self.step}"


def parse_ref(value: Any, field: str = "config.init_from") -> Optional[CheckpointRef]:
    """The reference in ``value``; None when it is not a mapping (a checkpoint path, or nothing)."""
    if not isinstance(value, Mapping):
        return None
    errors = []
    unknown = sorted(set(value) - {"workload", "step"})
    errors += [(f"{field}.{k}", value[k], "only the keys workload and step") for k in unknown]
    workload = value.get("workload")
    if not isinstance(workload, str) or not workload.strip():
        errors.append((f"{field}.workload", workload, "the id or name of another workload (a non-empty string)"))
    step = value.get("step", LATEST)
    if step == LATEST:
        step = None
    elif isinstance(step, bool) or not isinstance(step, int) or step < 1:
        errors.append((f"{field}.step", step, f"{LATEST!r} or a step number >= 1"))
    if errors:
        raise ValidationError("checkpoint reference", errors)
    return CheckpointRef(workload.strip(), step)


def step_of(path: str, metrics: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """A checkpoint's step: the ``step`` metric reported with it, else the number in ``checkpoint_<step>``."""
    if metrics and isinstance(metrics.get("step"), (int, float)) and not isinstance(metrics.get("step"), bool):
        return int(metrics["step"])
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Verdict:
    """What a reference can do now: ``path`` to start from (ready), or wait, or ``never`` with the reason."""

    ready: bool = False
    never: bool = False
    step: Optional[int] = None
    path: Optional[str] = None
    reason: str = ""


def judge(ref: CheckpointRef, *, source_id: str, source_ended: bool, max_step: Optional[int], cadence: Optional[int],
          written: Mapping[int, str], pinned: Optional[str] = None,
          exists=os.path.isdir) -> Verdict:
    """Can ``ref`` resolve? ``written``: step -> directory the source reported; ``pinned``: the pinned copy of
    ``ref.step`` if one was made; ``max_step``/``cadence``: the source's last step and checkpoint interval, when
    its config says (a step off the cadence is written only by a preemption, so it is never promised)."""
    on_disk = {s: p for s, p in written.items() if exists(p)}
    if ref.step is None:
        if on_disk:
            step = max(on_disk)
            return Verdict(ready=True, step=step, path=on_disk[step])
        if written:
            return Verdict(never=True, reason=f"{source_id} reported checkpoints (steps {_span(written)}) but none "
                                              "is on disk any more")
        if source_ended:
            return Verdict(never=True, reason=f"{source_id} ended without writing a checkpoint")
        return Verdict(reason=f"waiting for {source_id}'s first checkpoint")
    step = ref.step
    if pinned and exists(pinned):
        return Verdict(ready=True, step=step, path=pinned)
    if step in on_disk:
        return Verdict(ready=True, step=step, path=on_disk[step])
    if step in written:
        return Verdict(never=True, reason=f"{source_id}'s checkpoint at step {step} was deleted by its retention "
                                          f"(on disk: steps {_span(on_disk) or 'none'}); name a later step or "
                                          f"{LATEST!r}")
    if source_ended:
        return Verdict(never=True, reason=f"{source_id} ended without a checkpoint at step {step} (it wrote steps "
                                          f"{_span(written) or 'none'})")
    if written and step < max(written):
        return Verdict(never=True, reason=f"{source_id} is past step {step} (last checkpoint at step "
                                          f"{max(written)}) and did not write it")
    if max_step is not None and step > max_step:
        return Verdict(never=True, reason=f"{source_id} trains to step {max_step} only; step {step} will never be "
                                          "written")
    if cadence and step % cadence and step != max_step:
        return Verdict(never=True, reason=f"{source_id} checkpoints every {cadence} steps (and at step {max_step}); "
                                          f"step {step} is not one of them")
    last = f"last checkpoint at step {max(written)}" if written else "no checkpoint yet"
    return Verdict(step=step, reason=f"waiting for {source_id}'s checkpoint at step {step} ({last})")


def _span(steps: Iterable[int]) -> str:
    s = sorted(steps)
    if not s:
        return ""
    return f"{s[0]}" if len(s) == 1 else f"{s[0]}..{s[-1]}"


def pin_dir(checkpoint_path: str, step: int) -> str:
    """Where the pinned copy of a source's checkpoint at ``step`` lives: beside the source's checkpoints."""
    run_dir = os.path.dirname(os.path.normpath(checkpoint_path))
    if os.path.basename(run_dir) == PIN_FOLDER:
        run_dir = os.path.dirname(run_dir)
    return os.path.join(run_dir, PIN_FOLDER, f"checkpoint_{step:08d}")


def pin_copy(src: str, dst: str) -> str:
    """Copy the checkpoint directory ``src`` to ``dst`` as hard links (a real copy across file systems).

    Written to a temporary name and renamed, so a reader never sees half a copy. Returns ``dst``."""
    if os.path.isdir(dst):
        return dst
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)

    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, tmp, copy_function=link)
    try:
        os.rename(tmp, dst)
    except OSError:  # another copy won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def copy_pin(src: str, dst: str) -> Optional[str]:
    """``pin_copy`` as the actor carries out a ``PinCheckpoint``: None once the copy is there, else what stopped it
    (the state machine journals it)."""
    try:
        pin_copy(src, dst)
    except OSError as exc:  # shutil.Error too: the source went, a file system refused, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def drop_copy(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def find_source(ref: CheckpointRef, records: Iterable[Any]) -> Optional[Any]:
    """The record ``ref.workload`` names: a workload id, else the most recently submitted workload of that name."""
    by_name = []
    for rec in records:
        if rec.id == ref.workload:
            return rec
        if rec.spec.get("name") == ref.workload:
            by_name.append(rec)
    return max(by_name, key=lambda r: r.submit_time) if by_name else None


def source_limits(spec: Dict[str, Any]) -> tuple:
    """(last step, checkpoint interval) from a source's config, where it has them (the reference LM's keys)."""
    cfg = spec.get("config") or {}
    max_step = cfg.get("max_steps") if isinstance(cfg.get("max_steps"), int) else None
    every = cfg.get("checkpoint_every") if isinstance(cfg.get("checkpoint_every"), int) else None
    return max_step, every


# The config key that names another workload's checkpoint ({workload, step}; raylane.control.checkpoints): a
# training gang starts from it, a one-shot workload (raylane.launchers.oneshot) evaluates or infers with it.
REF_KEYS = {"eval": "checkpoint", "batch": "checkpoint"}
DEFAULT_REF_KEY = "init_from"


def ref_key(spec: Dict[str, Any]) -> str:
    """``checkpoint`` for kinds eval and batch, ``init_from`` for the others."""
    return REF_KEYS.get(spec.get("kind", "train"), DEFAULT_REF_KEY)
