"""Ray Tune adapter of the reference training loop: ``lm_trainable`` is a Tune function trainable over ``train``.

One trial is one call of ``workloads.train_lm.train`` in one Tune actor (no Ray Train inside: Population Based
Training can only exploit function or class trainables). The loop's hooks become Tune's session:

- report and checkpoint together: the loop checkpoints every ``checkpoint_every`` steps and at its last step; each
  checkpoint is handed to ``ray.tune.report(metrics, checkpoint=...)`` with the metrics of that step plus ``step``
  (the global step, Tune's time attribute for every scheduler here) and ``train_loss`` (the mean training loss
  since the previous report). So every result Tune sees carries a checkpoint, and a trial Tune pauses (a slot
  reclaimed, PBT's time sharing) or clones (PBT's exploit) loses no step.
- resume: ``ray.tune.get_checkpoint()``, copied to a local directory. A checkpoint carries ``raylane_trial.json``
  (the trial that wrote it and at which step); a trial that starts from another trial's checkpoint reports
  ``exploited_from`` (that trial's id) and ``exploited_step`` in its results, which is how PBT's copies show.
- PBT's explore changes hyperparameters the checkpoint also holds: the optimizer's learning rate (and its schedule's
  base) and the decay group's weight decay. They are rewritten in the local copy to the trial's new config before
  the loop loads it; without that the restored optimizer would keep the old values and the mutation would be void.
- stop: the loop never yields by itself here (``should_stop`` is False); Tune stops, pauses and resumes trials.

Config: the trial's config is the sampled parameters (nested: ``{"lr": ..., "model": {"d_model": ...}}``); the
base config (``base=``, bound with ``tune.with_parameters``) is a ``TrainConfig`` mapping they are merged into.
"""
from __future__ import annotations

import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

from workloads import checkpoint as ckpt
from workloads.train_lm import TrainConfig, TrainHooks, parse_config, train

from ray import tune

__all__ = ["TRIAL_FILE", "LM_METRICS", "TuneHooks", "lm_trainable", "apply_hyperparameters"]

logger = logging.getLogger(__name__)

TRIAL_FILE = "raylane_trial.json"
# What every result of ``lm_trainable`` holds (``val_*`` at evaluation steps only), for checking a sweep's metric.
LM_METRICS = ("step", "loss", "train_loss", "lr", "step_time_s", "samples_per_s", "val_loss", "val_perplexity")


def apply_hyperparameters(path: str, cfg: TrainConfig) -> list[str]:
    """Rewrite the checkpoint at ``path`` so that its optimizer follows ``cfg``'s ``lr`` and ``weight_decay``;
    returns the names changed. The LR multiplier of the schedule is kept: after the rewrite the next step's LR is
    ``cfg.lr * multiplier(step)``, as if the run had always had ``cfg.lr``."""
    meta = ckpt.read_meta(path)
    old = meta.get("train", {})
    changed = [k for k in ("lr", "weight_decay") if k in old and old[k] != getattr(cfg, k)]
    if not changed:
        return []
    state = ckpt.read_state(path)
    opt, sched = state["optimizer"], state["scheduler"]
    if "lr" in changed:
        scale = cfg.lr / old["lr"]
        for group in opt["param_groups"]:
            group["lr"] = group["lr"] * scale
            group["initial_lr"] = cfg.lr
        sched["base_lrs"] = [cfg.lr for _ in sched.get("base_lrs", [])]
        if "_last_lr" in sched:
            sched["_last_lr"] = [x * scale for x in sched["_last_lr"]]
    if "weight_decay" in changed:
        # train_lm's first group holds the decayed (matrix) parameters, the second the undecayed ones.
        opt["param_groups"][0]["weight_decay"] = cfg.weight_decay
    meta["train"] = {**old, **{k: getattr(cfg, k) for k in changed}}
    state.pop("format", None)
    meta.pop("format", None)
    ckpt.write(path, state=state, meta=meta)
    return changed


class TuneHooks(TrainHooks):
    """``TrainHooks`` over the Tune session of the calling trial; see the module docstring."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.trial_id = tune.get_context().get_trial_id() or "local"
        self.exploited_from: Optional[str] = None
        self.exploited_step: Optional[int] = None
        self._losses: list[float] = []
        self._resume_dir: Optional[tempfile.TemporaryDirectory] = None

    def load_checkpoint(self) -> Optional[str]:
        found = tune.get_checkpoint()
        if found is None:
            return None
        self._resume_dir = tempfile.TemporaryDirectory(prefix="raylane-tune-resume-")
        path = found.to_directory(self._resume_dir.name)
        origin = _read_origin(path)
        if origin.get("trial_id") not in (None, self.trial_id):
            self.exploited_from, self.exploited_step = origin["trial_id"], origin.get("step")
            logger.info("trial %s starts from trial %s's checkpoint at step %s", self.trial_id,
                        self.exploited_from, self.exploited_step)
        changed = apply_hyperparameters(path, self.cfg)
        if changed:
            logger.info("trial %s: checkpoint's %s set to the trial's config", self.trial_id, ", ".join(changed))
        return path

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self._losses.append(float(metrics["loss"]))

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        if dir_path is None:  # not rank 0; a trial has one process, so this does not happen
            return
        Path(dir_path, TRIAL_FILE).write_text(json.dumps({"trial_id": self.trial_id, "step": step}))
        out: dict[str, Any] = {**metrics, "step": step}
        if self._losses:
            out["train_loss"] = sum(self._losses) / len(self._losses)
        if self.exploited_from is not None:
            out["exploited_from"] = self.exploited_from
            out["exploited_step"] = self.exploited_step
        self._losses = []
        tune.report(out, checkpoint=tune.Checkpoint.from_directory(dir_path))

    def close(self) -> None:
        if self._resume_dir is not None:
            self._resume_dir.cleanup()
            self._resume_dir = None


def _read_origin(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path, TRIAL_FILE).read_text())
    except (OSError, ValueError):
        return {}


def lm_trainable(config: Mapping[str, Any]) -> None:
    """One trial: the trial's whole config (a runner merges the sweep's base config and the sampled parameters),
    trained with ``TuneHooks``."""
    cfg = parse_config(config)
    hooks = TuneHooks(cfg)
    try:
        result = train(cfg, hooks=hooks)
    finally:
        hooks.close()
    if not math.isfinite(result.metrics.get("loss", 0.0)):
        logger.warning("trial %s ended with a non-finite loss", hooks.trial_id)


def sweep_config(config: Mapping[str, Any], budget: Mapping[str, int], metric: str) -> tuple[dict[str, Any], list]:
    """The base TrainConfig of a sweep's trials: the budget fixes ``max_steps`` (``budget.max``) and
    ``checkpoint_every`` (``budget.report_every``: every result carries a checkpoint), and ``eval_every`` defaults to
    one report so a ``val_*`` metric is in every result. Conflicts come back as (path, value, allowed)."""
    errors = []
    base = dict(config)
    for key, value, why in (("max_steps", budget["max"], "budget.max"),
                            ("checkpoint_every", budget["report_every"], "budget.report_every")):
        if key in base and base[key] != value:
            errors.append((f"config.{key}", base[key], f"left out, or equal to sweep.{why} ({value}): a sweep "
                                                        f"sets it from its budget"))
        base[key] = value
    if metric.startswith("val_"):
        every = base.setdefault("eval_every", budget["report_every"])
        if not every or budget["report_every"] % every:
            errors.append(("config.eval_every", every, f"left out, or a divisor of sweep.budget.report_every "
                                                       f"({budget['report_every']}): the metric {metric} must be "
                                                       f"in every result"))
    return base, errors


# What a sweep platform may read off the trainable (Raylane does: raylane.sweeps.trainables).
lm_trainable.config_schema = TrainConfig
lm_trainable.reports = LM_METRICS
lm_trainable.sweep_config = sweep_config
