"""The on-disk checkpoint of the reference workloads: one directory, ``state.pt`` plus ``meta.json``.

This module owns the layout; the training loop, the evaluator and the Ray adapter go through it.

- ``state.pt`` (``torch.save``, loaded with ``weights_only=True``): ``model`` (state dict of the unwrapped model),
  ``optimizer`` (AdamW), ``scheduler`` (LambdaLR), ``rng`` (torch, python ``random``, numpy legacy global state, as
  plain values), ``step`` (optimizer updates done) and ``data_position`` (the step whose batch comes next).
- ``meta.json``: the same ``step`` and ``data_position``, the ``model`` config, the validated ``train`` config, the
  ``data_snapshot`` id, ``init_from`` and the last ``metrics`` — everything a reader needs without torch.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch

__all__ = ["FORMAT_VERSION", "STATE_FILE", "META_FILE", "write", "read_meta", "read_state", "is_checkpoint",
           "capture_rng", "restore_rng"]

FORMAT_VERSION = 1
STATE_FILE = "state.pt"
META_FILE = "meta.json"

PathLike = Union[str, Path]


def is_checkpoint(path: PathLike) -> bool:
    p = Path(path)
    return (p / STATE_FILE).is_file() and (p / META_FILE).is_file()


def capture_rng() -> dict[str, Any]:
    """Global RNG states as plain values, so ``torch.load(weights_only=True)`` can read them back."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
    }


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    n = rng["numpy"]
    np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))


def write(path: PathLike, *, state: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """Write ``state.pt`` then ``meta.json`` into ``path`` (created if missing); ``meta.json`` last marks it whole."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    torch.save({"format": FORMAT_VERSION, **state}, p / STATE_FILE)
    (p / META_FILE).write_text(json.dumps({"format": FORMAT_VERSION, **meta}, indent=2, sort_keys=True))


def read_meta(path: PathLike) -> dict[str, Any]:
    p = Path(path) / META_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {META_FILE} is missing")
    meta = json.loads(p.read_text())
    _check_format(path, meta.get("format"))
    return meta


def read_state(path: PathLike, *, map_location: Optional[Union[str, torch.device]] = "cpu") -> dict[str, Any]:
    p = Path(path) / STATE_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: {STATE_FILE} is missing")
    state = torch.load(p, map_location=map_location, weights_only=True)
    _check_format(path, state.get("format"))
    return state


def _check_format(path: PathLike, found: object) -> None:
    if found != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {found!r}; this code reads format {FORMAT_VERSION}")
