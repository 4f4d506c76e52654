"""The byte-level corpus of the reference workloads: Python's own standard library sources.

This module owns how the corpus is chosen, read, split and sampled. It draws no random numbers from global state:
which windows make up a batch is a pure function of ``(seed, step, rank)`` (and of the world size, or of the fixed
global batch, ``global_batch_at``), so a run resumed at step ``k`` sees
exactly the batches an uninterrupted run saw from step ``k`` on.

Words:
- *stdlib root*: ``sysconfig.get_paths()["stdlib"]``.
- *corpus*: the bytes of the ``.py`` files under the root (or under one subpackage of it, ``subdir``), in sorted
  relative-path order, each followed by a blank line, cut at ``max_bytes``. Third-party code (``site-packages``,
  ``dist-packages``) and the stdlib's own test suites (directories named ``test``, ``tests``, ``idle_test``) are
  left out.
- *split*: the first ``1 - val_fraction`` of the corpus bytes is ``train``, the rest is ``val``.
- *snapshot id*: 12 hex digits of a sha256 over the byte budget and the (relative path, size) of every file that
  went into the corpus. Two runs with the same id trained on the same bytes.
- *data position*: the step whose batch comes next. Since a batch is a pure function of the step, the position is a
  plain integer and is all a checkpoint needs to record.

The pretraining default (the first 2 MB of the whole stdlib in sorted order) ends in the ``c``/``d`` modules, so the
fine-tuning default, the ``email`` subpackage, is text the pretrained model has not seen.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional, Tuple

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["Corpus", "CorpusConfig", "build_corpus", "load_corpus", "batch_at", "global_batch_at", "rank_slice",
           "loss_scale", "eval_windows", "stdlib_root", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 2_000_000
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
_FILE_SEPARATOR = b"\n\n"

Split = Literal["train", "val"]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


class CorpusConfig(BaseModel):
    """Which bytes to train on, as a run's config names them."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    subdir: Optional[str] = None
    # A directory of prepared text (a pipeline's data-preparation stage output, workloads/prepare_corpus.py) to
    # train on instead of the stdlib: every file in it, in sorted order, except names starting with "_" or ".".
    path: Optional[str] = None
    max_bytes: Annotated[int, Field(ge=4096, le=1_000_000_000)] = DEFAULT_MAX_BYTES
    val_fraction: Annotated[float, Field(gt=0.0, le=0.5)] = 0.1

    @field_validator("subdir")
    @classmethod
    def _subdir_exists(cls, v: Optional[str]) -> Optional[str]:
        if v is None:
            return v
        root = stdlib_root()
        if Path(v).is_absolute() or ".." in Path(v).parts or not (root / v).is_dir():
            raise ValueError(f"must name a directory under the stdlib {root} (such as 'email' or 'json'), or be null")
        return v

    @field_validator("path")
    @classmethod
    def _path_absolute(cls, v: Optional[str]) -> Optional[str]:
        # Not checked for existence here: a pipeline's stage config names it before the stage that writes it ran.
        if v is not None and not Path(v).is_absolute():
            raise ValueError("must be an absolute directory path (a pipeline's {stage: NAME} reference gives one), "
                             "or be null")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        if self.path is not None and self.subdir is not None:
            raise ValueError("give subdir (a stdlib package) or path (a prepared directory), not both")
        return self


@dataclass(frozen=True)
class Corpus:
    """The bytes of a corpus, split, with the snapshot id and file list that describe where they came from."""

    train: torch.Tensor  # uint8, 1-D
    val: torch.Tensor  # uint8, 1-D
    files: Tuple[str, ...]  # relative posix paths, in corpus order
    snapshot_id: str
    subdir: Optional[str]
    max_bytes: int

    def split(self, name: Split) -> torch.Tensor:
        if name == "train":
            return self.train
        if name == "val":
            return self.val
        raise ValueError(f"split: got {name!r}; allowed: 'train', 'val'")

    @property
    def num_bytes(self) -> int:
        return int(self.train.numel() + self.val.numel())


def _source_files(base: Path, prepared: bool = False) -> list[Path]:
    """Every ``.py`` file under ``base`` outside the excluded directories (``prepared``: every file whose name does
    not start with ``_`` or ``.``), sorted by relative posix path."""
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
        found += [Path(dirpath, f) for f in filenames
                  if (not f.startswith(("_", ".")) if prepared else f.endswith(".py"))]
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


def build_corpus(
    *,
    subdir: Optional[str] = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    val_fraction: float = 0.1,
    root: Optional[Path] = None,
) -> Corpus:
    """Read the corpus (see the module docstring); cached, since a training run and its evaluation ask for it alike.

    ``subdir`` names a directory under the stdlib root (``"email"``, ``"json"``); ``None`` means the whole stdlib.
    """
    return _build_corpus(subdir, int(max_bytes), float(val_fraction), str(root or stdlib_root()))


def load_corpus(config: CorpusConfig) -> Corpus:
    if config.path is not None:
        if not Path(config.path).is_dir():
            raise FileNotFoundError(f"corpus.path: got {config.path!r}; allowed: an existing directory of prepared text")
        return _build_corpus(None, int(config.max_bytes), float(config.val_fraction), config.path, True)
    return build_corpus(subdir=config.subdir, max_bytes=config.max_bytes, val_fraction=config.val_fraction)


@functools.lru_cache(maxsize=8)
def _build_corpus(subdir: Optional[str], max_bytes: int, val_fraction: float, root: str,
                  prepared: bool = False) -> Corpus:
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: got {max_bytes!r}; allowed: a positive number of bytes")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction: got {val_fraction!r}; allowed: 0 < val_fraction < 1")
    root_path = Path(root)
    base = root_path / subdir if subdir else root_path
    if not base.is_dir():
        raise FileNotFoundError(f"subdir: got {subdir!r}; {base} is not a directory under the stdlib {root_path}")

    chunks: list[bytes] = []
    used: list[tuple[str, int]] = []
    total = 0
    for path in _source_files(base, prepared):
        if total >= max_bytes:
            break
        data = path.read_bytes() + _FILE_SEPARATOR
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        used.append((path.relative_to(root_path).as_posix(), len(data)))
    if not used:
        raise FileNotFoundError(f"subdir: got {subdir!r}; no {'files' if prepared else '.py files'} under {base}")

    digest = hashlib.sha256(f"max_bytes={max_bytes}\n".encode())
    for rel, size in used:
        digest.update(f"{rel}\t{size}\n".encode())

    everything = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
    n_val = max(1, int(round(everything.numel() * val_fraction)))
    return Corpus(
        train=everything[:-n_val].clone(),
        val=everything[-n_val:].clone(),
        files=tuple(rel for rel, _ in used),
        snapshot_id=digest.hexdigest()[:12],
        subdir=subdir,
        max_bytes=max_bytes,
    )


def batch_at(
    data: torch.Tensor,
    *,
    seed: int,
    step: int,
    batch_size: int,
    context: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: ``(inputs, targets)``, each ``[batch_size, context]`` int64, targets shifted by one.

    A pure function of its arguments. The global batch of a step is ``batch_size * world_size`` windows drawn with a
    generator seeded by ``(seed, step)``; rank ``r`` takes the ``r``-th slice of it, so ranks never share a window.
    """
    starts = _step_starts(data, seed, step, batch_size * world_size, context)
    return _windows(data, starts[rank * batch_size : (rank + 1) * batch_size], context)


def rank_slice(global_batch: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s part of a global batch of ``global_batch`` windows over ``world_size`` ranks: the half-open
    range ``[rank * G // W, (rank + 1) * G // W)``. The ranks' ranges partition ``[0, G)`` in rank order; when W
    does not divide G they differ by one window (G=8 over 3 ranks: 2, 3, 3). Every rank gets at least one window,
    so W must not exceed G."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: got {rank} of world_size {world_size}; allowed: 0 <= rank < world_size")
    if not world_size <= global_batch:
        raise ValueError(f"global_batch: got {global_batch}; allowed: an integer >= the worker count ({world_size})")
    return rank * global_batch // world_size, (rank + 1) * global_batch // world_size


def loss_scale(global_batch: int, rank: int, world_size: int) -> float:
    """The factor rank ``rank`` multiplies its (mean) loss by before backward: ``n_r * W / G``, ``n_r`` its windows.

    DDP averages the gradients over the W ranks, so the step's gradient is ``(1/W) * sum_r n_r * W / G * grad(mean
    loss of rank r) = sum_r (n_r / G) * grad(mean loss of rank r)``: the gradient of the mean loss over the whole
    global batch (every window has the same number of tokens), however unevenly the ranks split it. 1 when even."""
    lo, hi = rank_slice(global_batch, rank, world_size)
    return (hi - lo) * world_size / global_batch


def global_batch_at(
    data: torch.Tensor,
    *,
    seed: int,
    step: int,
    global_batch: int,
    context: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s part of the batch of ``step`` when the global batch is fixed at ``global_batch`` windows,
    whatever the worker count: ``(inputs, targets)``, each ``[n_r, context]`` (``rank_slice``).

    The ``global_batch`` windows are drawn as ``batch_at`` draws its global batch (a generator seeded by
    ``(seed, step)``), so a run restarted at another world size trains on the same windows at every step; and with
    ``global_batch == batch_size * world_size`` each rank gets exactly ``batch_at``'s batch. Ranks of uneven parts
    weigh their loss by ``loss_scale``.
    """
    lo, hi = rank_slice(global_batch, rank, world_size)
    return _windows(data, _step_starts(data, seed, step, global_batch, context)[lo:hi], context)


def eval_windows(data: torch.Tensor, *, count: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` windows spread evenly over ``data`` (no randomness): the fixed evaluation set of a split."""
    starts = torch.linspace(0, _last_start(data, context), steps=count).long()
    return _windows(data, starts, context)


def _last_start(data: torch.Tensor, context: int) -> int:
    """The exclusive bound of a window's start in ``data`` (a window is ``context + 1`` bytes); > 0 or an error."""
    high = data.numel() - context - 1
    if high <= 0:
        raise ValueError(f"context: got {context}; the split holds only {data.numel()} bytes, need > context + 1")
    return high


def _step_starts(data: torch.Tensor, seed: int, step: int, count: int, context: int) -> torch.Tensor:
    """The starts of the ``count`` windows of ``step``'s global batch: drawn by a generator seeded by
    ``(seed, step)``, so any worker draws the same ones whatever the world size."""
    rng = np.random.default_rng([seed, step])
    return torch.from_numpy(rng.integers(0, _last_start(data, context), size=count))


def _windows(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts.long().unsqueeze(1) + torch.arange(context + 1).unsqueeze(0)
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]
