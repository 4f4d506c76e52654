"""The training loop of the reference workloads, shared by pretraining and fine-tuning, and by every runner.

This module owns the loop, its config (``TrainConfig``, the one place the defaults live) and the contract with the
runner that drives it (``TrainHooks``). It knows nothing of Ray: the Ray Train adapter (``workloads.ray_train``) and
the local runner (``LocalHooks``) are two implementations of the same hooks.

Words:
- *step*: the number of optimizer updates done. The update that takes the model from step ``k-1`` to ``k`` draws the
  batch of data position ``k-1`` and its loss is reported as the loss *at step k*.
- *yield*: when ``hooks.should_stop()`` answers True before an update, the loop writes a checkpoint at the current
  step and returns ``TrainResult(status="yielded", step=k)``. Resuming from that checkpoint continues bit for bit:
  on CPU, with the same ``num_threads``, the loss at every later step equals the loss of a run never interrupted.
- *pretraining*: a run without ``init_from``; weights are initialised from ``seed``.
- *fine-tuning*: a run with ``init_from`` = a checkpoint directory. Only the model weights (and so the model shape)
  come from it; the optimizer, LR schedule and data position start fresh, on another corpus slice and with a
  smaller LR. ``finetune_config`` gives the defaults: the stdlib's ``email`` package, which the 2 MB pretraining
  corpus does not reach, at a tenth of the pretraining LR. A fine-tuning run that finds a checkpoint of its own
  (``hooks.load_checkpoint()``) resumes that one and ignores ``init_from``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import random
import shutil
import tempfile
import time
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal, Mapping, Optional, Union

import numpy as np
import pydantic
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from workloads.errors import ConfigError
from workloads import checkpoint as ckpt
from workloads.data import CorpusConfig, batch_at, global_batch_at, load_corpus, loss_scale
from workloads.eval_lm import mean_loss
from workloads.model import ByteTransformer, ModelConfig

__all__ = [
    "CorpusConfig",
    "TrainConfig",
    "TrainHooks",
    "ForwardingHooks",
    "LocalHooks",
    "TrainResult",
    "parse_config",
    "finetune_config",
    "train",
    "FINETUNE_DEFAULTS",
]

_CONFIG_SOURCE = "train config"
# Keys that fix the data order or the LR schedule: a resume that changes one no longer matches an uninterrupted run.
_RESUME_SENSITIVE = ("seed", "batch_size", "global_batch", "max_steps", "lr", "warmup_steps", "min_lr_ratio", "corpus",
                     "num_threads")

logger = logging.getLogger(__name__)


class TrainConfig(BaseModel):
    """Everything a training run reads. Unknown keys are refused; ``parse_config`` reports every problem at once."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    max_steps: Annotated[int, Field(ge=1, le=10_000_000)] = 300
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    # Windows per worker and step (the global batch is batch_size x the worker count), unless global_batch is set.
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 32
    # Windows per step over all workers, fixed whatever the worker count (an elastic gang restarted at another size
    # keeps its global batch, so its LR schedule and data order still mean the same): when set, batch_size is
    # ignored for training (evaluation still uses it), rank r of W trains on windows [r*G//W, (r+1)*G//W) of the
    # step's draw and weighs its loss by n_r*W/G (data.loss_scale), so that DDP's average of the ranks' gradients is
    # the gradient of the mean loss over the G windows. Must be >= the worker count. null: batch_size per worker.
    global_batch: Optional[Annotated[int, Field(ge=1, le=1_048_576)]] = None
    lr: Annotated[float, Field(gt=0.0, le=1.0)] = 3e-3
    warmup_steps: Annotated[int, Field(ge=0)] = 20
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    weight_decay: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1
    grad_clip: Optional[Annotated[float, Field(gt=0.0)]] = 1.0
    checkpoint_every: Annotated[int, Field(ge=1)] = 100
    eval_every: Annotated[int, Field(ge=0)] = 0  # 0: no evaluation during training
    eval_windows: Annotated[int, Field(ge=1, le=100_000)] = 64
    init_from: Optional[str] = None
    corpus: CorpusConfig = CorpusConfig()
    model: ModelConfig = ModelConfig()
    # Fixed, not "all cores": CPU results are only bit-identical across a resume under the same thread count.
    num_threads: Annotated[int, Field(ge=1, le=256)] = 1
    deterministic: bool = True

    @field_validator("init_from")
    @classmethod
    def _is_checkpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not ckpt.is_checkpoint(v):
            raise ValueError(f"must be a checkpoint directory holding {ckpt.STATE_FILE} and {ckpt.META_FILE}, or null")
        return v


FINETUNE_DEFAULTS: dict[str, Any] = {
    "lr": 3e-4,
    "warmup_steps": 10,
    "max_steps": 200,
    "corpus": {"subdir": "email"},
}


def finetune_config(init_from: str, **overrides: Any) -> dict[str, Any]:
    """A fine-tuning config: ``FINETUNE_DEFAULTS`` under ``overrides``, with ``init_from`` set."""
    return {**FINETUNE_DEFAULTS, **overrides, "init_from": str(init_from)}


def parse_config(config: Union[Mapping[str, Any], TrainConfig]) -> TrainConfig:
    """Validate a plain dict into a ``TrainConfig``; raises ``ConfigError`` listing every bad key at once."""
    if isinstance(config, TrainConfig):
        return config
    if not isinstance(config, Mapping):
        raise ConfigError(_CONFIG_SOURCE, [("<config>", config, "a mapping of config keys to values")])
    try:
        return TrainConfig.model_validate(dict(config))
    except pydantic.ValidationError as exc:
        raise ConfigError(_CONFIG_SOURCE, [_describe(e) for e in exc.errors(include_url=False)]) from None


def _describe(error: Mapping[str, Any]) -> tuple[str, object, str]:
    """One pydantic error as (path, value, what is allowed), the allowed part written from the field's own bounds."""
    loc = tuple(error["loc"])
    path = ".".join(str(p) for p in loc) or "<config>"
    parent = _model_at(loc[:-1])
    if error["type"] == "extra_forbidden":
        keys = ", ".join(sorted(parent.model_fields)) if parent else "none"
        return path, error.get("input"), f"unknown key; allowed keys: {keys}"
    info = parent.model_fields.get(loc[-1]) if parent and loc else None
    if error["type"] == "value_error" or info is None:  # a check of our own: its message says what is allowed
        return path, error.get("input"), error["msg"].removeprefix("Value error, ")
    return path, error.get("input"), _expected(info.annotation, info.metadata)


def _model_at(loc: tuple[Any, ...]) -> Optional[type[BaseModel]]:
    model: Any = TrainConfig
    for part in loc:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        model = info.annotation if info is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return model


_KIND = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
_BOUND = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _expected(annotation: Any, metadata: list[Any]) -> str:
    """``Optional[Annotated[float, Field(gt=0)]]`` -> "null or a number > 0"."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Union and type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return "null or " + _expected(inner, metadata)
    if typing.get_origin(annotation) is Annotated:
        base, *extra = args
        metadata = [*metadata, *(m for e in extra for m in getattr(e, "metadata", [e]))]
        annotation = base
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"a mapping with keys among: {', '.join(sorted(annotation.model_fields))}"
    bounds = [f"{_BOUND[name]} {getattr(m, name)}" for m in metadata for name in _BOUND if hasattr(m, name)]
    kind = _KIND.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return " ".join([kind, " and ".join(bounds)]) if bounds else kind


# ---------------------------------------------------------------------------------------------------------------
# Hooks: what the loop asks of whoever runs it.


class TrainHooks:
    """The runner's side of the loop. The defaults run alone: no checkpoint, no reports, never stop.

    Contract:
    - Every rank calls every hook the same number of times in the same order, so a hook may be a collective.
    - ``load_checkpoint()`` is called once, first; every rank must answer the same (a directory or None).
    - ``save_checkpoint(dir_path, step, metrics)`` is called every ``checkpoint_every`` steps, at the last step and
      when yielding. On rank 0 ``dir_path`` holds a whole checkpoint, which is deleted once the hook returns: copy
      what you keep. On the other ranks ``dir_path`` is None.
    - ``report(step, metrics)`` follows every update: ``loss``, ``lr``, ``step_time_s``, ``samples_per_s`` (all
      float; ``val_loss``/``val_perplexity`` too every ``eval_every`` steps). Metrics are rank-local.
    - ``should_stop()`` is asked once before every update; True makes the loop checkpoint and yield.
    - ``prepare_model(model)`` returns the module to train (a DDP wrapper, say) sharing ``model``'s parameters.
    - ``world_rank`` / ``world_size`` say which slice of each global batch this process trains on.
    """

    world_rank: int = 0
    world_size: int = 1

    def load_checkpoint(self) -> Optional[str]:
        return None

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        pass

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model


class ForwardingHooks(TrainHooks):
    """Hooks that pass every call to ``inner``: subclass and override one method to wrap a runner's hooks
    (an MLflow logger overrides ``report`` and calls ``super().report``)."""

    def __init__(self, inner: TrainHooks):
        self.inner = inner

    @property
    def world_rank(self) -> int:  # type: ignore[override]
        return self.inner.world_rank

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.inner.world_size

    def load_checkpoint(self) -> Optional[str]:
        return self.inner.load_checkpoint()

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        self.inner.save_checkpoint(dir_path, step, metrics)

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.inner.report(step, metrics)

    def should_stop(self) -> bool:
        return self.inner.should_stop()

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return self.inner.prepare_model(model)


class LocalHooks(TrainHooks):
    """Single-process runner: checkpoints under ``root/checkpoint_<step>``, resumes from the newest one there.

    ``reports`` keeps every ``(step, metrics)``. The run yields once ``stop()`` answers True, or once the last
    reported step reaches ``stop_at_step``. ``keep`` bounds how many checkpoints stay on disk (None: all).
    """

    def __init__(
        self,
        root: Union[str, Path],
        *,
        stop_at_step: Optional[int] = None,
        stop: Optional[Callable[[], bool]] = None,
        keep: Optional[int] = None,
    ):
        self.root = Path(root)
        self.stop_at_step = stop_at_step
        self.stop = stop
        self.keep = keep
        self.reports: list[tuple[int, dict[str, float]]] = []
        self.saved_steps: list[int] = []

    def checkpoints(self) -> list[Path]:
        """Whole checkpoints under ``root``, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("checkpoint_*") if ckpt.is_checkpoint(p))

    def latest_checkpoint(self) -> Optional[str]:
        found = self.checkpoints()
        return str(found[-1]) if found else None

    def load_checkpoint(self) -> Optional[str]:
        return self.latest_checkpoint()

    def save_checkpoint(self, dir_path: Optional[str], step: int, metrics: Mapping[str, float]) -> None:
        if dir_path is None:
            return
        dest = self.root / f"checkpoint_{step:08d}"
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(dir_path, partial)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)  # a reader never sees half a checkpoint
        self.saved_steps.append(step)
        if self.keep is not None:
            for old in self.checkpoints()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        self.reports.append((step, dict(metrics)))

    def should_stop(self) -> bool:
        if self.stop is not None and self.stop():
            return True
        last = self.reports[-1][0] if self.reports else None
        return self.stop_at_step is not None and last is not None and last >= self.stop_at_step

    def losses(self) -> dict[int, float]:
        return {step: m["loss"] for step, m in self.reports}


# ---------------------------------------------------------------------------------------------------------------
# The loop.


@dataclass(frozen=True)
class TrainResult:
    """How a run ended. ``status`` is ``finished`` (reached ``max_steps``) or ``yielded`` (stopped at ``step`` on
    request, with a checkpoint at that step)."""

    status: Literal["finished", "yielded"]
    step: int
    resumed_from_step: Optional[int]
    data_snapshot: str
    metrics: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train(config: Union[Mapping[str, Any], TrainConfig], *, hooks: Optional[TrainHooks] = None) -> TrainResult:
    """Train a ``ByteTransformer`` as ``config`` says, driven by ``hooks`` (see ``TrainHooks``)."""
    cfg = parse_config(config)
    hooks = hooks if hooks is not None else TrainHooks()
    with _torch_settings(cfg):
        return _Run(cfg, hooks).run()


@contextlib.contextmanager
def _torch_settings(cfg: TrainConfig) -> Iterator[None]:
    """Thread count and deterministic algorithms for the run; the caller's settings come back afterwards."""
    threads = torch.get_num_threads()
    det, det_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(cfg.num_threads)
    # warn_only: on CUDA a few kernels have no deterministic version; on CPU every op used here has one.
    torch.use_deterministic_algorithms(cfg.deterministic, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det, warn_only=det_warn)


def _lr_multiplier(step: int, *, warmup: int, total: int, floor: float) -> float:
    """Linear warmup over ``warmup`` steps, then a cosine from 1 down to ``floor`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _Run:
    """One call of ``train``: builds the state (fresh, fine-tuned or resumed), then steps it."""

    def __init__(self, cfg: TrainConfig, hooks: TrainHooks):
        self.cfg = cfg
        self.hooks = hooks
        self.rank, self.world = int(hooks.world_rank), int(hooks.world_size)
        if cfg.global_batch is not None and cfg.global_batch < self.world:
            # Each rank needs at least one window of the step: refuse before loading anything.
            raise ConfigError(_CONFIG_SOURCE, [("global_batch", cfg.global_batch,
                                                f"an integer >= the worker count ({self.world})")])
        self.corpus = load_corpus(cfg.corpus)

    def run(self) -> TrainResult:
        cfg, hooks = self.cfg, self.hooks
        resume_dir = hooks.load_checkpoint()
        resume = ckpt.read_state(resume_dir) if resume_dir else None
        self.model_config = self._model_config(resume_dir)
        if resume_dir:
            self._warn_if_changed(resume_dir)

        # Seed first so a fresh run's init is a function of the seed; a resumed run overwrites all of it below.
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        raw = ByteTransformer(self.model_config)
        if resume is not None:
            raw.load_state_dict(resume["model"])
        elif cfg.init_from is not None:
            raw.load_state_dict(ckpt.read_state(cfg.init_from)["model"])
        self.raw = raw
        self.model = hooks.prepare_model(raw)
        self.device = next(raw.parameters()).device

        decay = [p for p in raw.parameters() if p.dim() >= 2]
        no_decay = [p for p in raw.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(0.9, 0.95),
        )
        warmup, total, floor = cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: _lr_multiplier(s, warmup=warmup, total=total, floor=floor)
        )
        step = data_position = 0
        if resume is not None:
            self.optimizer.load_state_dict(resume["optimizer"])
            self.scheduler.load_state_dict(resume["scheduler"])
            ckpt.restore_rng(resume["rng"])
            step, data_position = int(resume["step"]), int(resume["data_position"])
        return self._loop(step, data_position, resumed_from=step if resume is not None else None)

    def _model_config(self, resume_dir: Optional[str]) -> ModelConfig:
        """The model shape: the config's, unless a checkpoint we start from fixes it; a conflict is an error."""
        cfg = self.cfg
        source = resume_dir or cfg.init_from
        if source is None:
            return cfg.model
        fixed = ModelConfig.model_validate(ckpt.read_meta(source)["model"])
        if "model" in cfg.model_fields_set and cfg.model != fixed:
            allowed = f"left out, or the shape of the checkpoint it starts from ({source}): {fixed.to_dict()}"
            raise ConfigError(_CONFIG_SOURCE, [("model", cfg.model.to_dict(), allowed)])
        return fixed

    def _warn_if_changed(self, resume_dir: str) -> None:
        """A resume under a different data order or schedule runs, but no longer matches an uninterrupted run."""
        meta = ckpt.read_meta(resume_dir)
        now = self.cfg.model_dump(mode="json")
        changed = [k for k in _RESUME_SENSITIVE if meta["train"].get(k) != now[k]]
        if meta.get("data_snapshot") != self.corpus.snapshot_id:
            changed.append(f"data snapshot {meta.get('data_snapshot')} -> {self.corpus.snapshot_id}")
        if changed:
            logger.warning("resuming %s with changed %s; later steps will differ from an uninterrupted run",
                           resume_dir, ", ".join(changed))

    def _loop(self, step: int, data_position: int, resumed_from: Optional[int]) -> TrainResult:
        cfg, hooks, model = self.cfg, self.hooks, self.model
        train_data = self.corpus.train
        context = self.model_config.context
        metrics: dict[str, float] = {}
        last_saved = resumed_from
        fixed = cfg.global_batch
        scale = loss_scale(fixed, self.rank, self.world) if fixed is not None else None
        global_size = fixed if fixed is not None else cfg.batch_size * self.world
        model.train()
        while step < cfg.max_steps:
            if hooks.should_stop():
                if last_saved != step:
                    self._save(step, data_position, metrics)
                return self._result("yielded", step, resumed_from, metrics)

            t0 = time.perf_counter()
            lr = self.optimizer.param_groups[0]["lr"]
            if fixed is None:
                x, y = batch_at(train_data, seed=cfg.seed, step=data_position, batch_size=cfg.batch_size,
                                context=context, rank=self.rank, world_size=self.world)
            else:
                x, y = global_batch_at(train_data, seed=cfg.seed, step=data_position, global_batch=fixed,
                                       context=context, rank=self.rank, world_size=self.world)
            _, loss = model(x.to(self.device), y.to(self.device))
            self.optimizer.zero_grad(set_to_none=True)
            # Without global_batch every rank has batch_size windows and the loss backs up as it is (bit for bit
            # as before); with it, the uneven parts are weighed so the averaged gradient is the global batch's.
            (loss if scale is None else loss * scale).backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            step += 1
            data_position += 1
            elapsed = time.perf_counter() - t0

            metrics = {
                "loss": float(loss.item()),
                "lr": float(lr),
                "step_time_s": elapsed,
                "samples_per_s": global_size / elapsed,
            }
            if cfg.eval_every and step % cfg.eval_every == 0 and self.rank == 0:
                val = mean_loss(self.raw, self.corpus.val, windows=cfg.eval_windows, batch_size=cfg.batch_size)
                metrics.update(val_loss=val, val_perplexity=math.exp(val))
                model.train()
            hooks.report(step, metrics)
            if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                self._save(step, data_position, metrics)
                last_saved = step
        return self._result("finished", step, resumed_from, metrics)

    def _save(self, step: int, data_position: int, metrics: Mapping[str, float]) -> None:
        if self.rank != 0:
            self.hooks.save_checkpoint(None, step, metrics)
            return
        with tempfile.TemporaryDirectory(prefix=f"raylane-ckpt-{step}-") as tmp:
            ckpt.write(
                tmp,
                state={
                    "model": self.raw.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": ckpt.capture_rng(),
                    "step": step,
                    "data_position": data_position,
                },
                meta={
                    "step": step,
                    "data_position": data_position,
                    "data_snapshot": self.corpus.snapshot_id,
                    "model": self.model_config.to_dict(),
                    "train": self.cfg.model_dump(mode="json"),
                    "init_from": self.cfg.init_from,
                    "metrics": dict(metrics),
                },
            )
            self.hooks.save_checkpoint(tmp, step, metrics)

    def _result(self, status: Literal["finished", "yielded"], step: int, resumed_from: Optional[int],
                metrics: Mapping[str, float]) -> TrainResult:
        return TrainResult(status=status, step=step, resumed_from_step=resumed_from,
                           data_snapshot=self.corpus.snapshot_id, metrics=dict(metrics))
