"""Test-set accuracy and loss of a ``digits-cnn`` checkpoint (``examples/user-code/digits-cnn``).

``evaluate(config)`` is the entrypoint of a ``kind: eval`` workload: Raylane runs it once, on its lease, with
``config["checkpoint"]`` set to the checkpoint directory it resolved from the spec's ``checkpoint: {workload, step}``
reference, and records the metrics it returns in the workload's MLflow run, a child of the evaluated run.

The checkpoint format is digits-cnn's (its README): ``model.pt`` (a ``state_dict`` of ``build_model(**meta["model"])``)
and ``meta.json`` (``model``, ``split``, ``step``, ``test_accuracy``). The architecture and the split are copied here
so that this project runs on its own; the split's parameters are read from the checkpoint, so the images scored are
exactly the ones the training run held out.

Nothing here imports Raylane. Run it by hand on a checkpoint directory: ``python evaluate_digits.py DIR``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(ValueError):
    """A config no retry can fix: ``fatal = True`` tells Raylane to fail the job at once instead of retrying."""

    fatal = True


class EvalConfig(BaseModel):
    """The spec's ``config``. A ``checkpoint: {workload, step}`` reference is checked by the platform (not by this
    schema) and becomes a directory before ``evaluate`` runs."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: Optional[str] = Field(None, description="a digits-cnn checkpoint directory")
    split: str = Field("test", pattern="^(train|test)$", description="which split of the digits to score")
    batch_size: int = Field(512, ge=1, le=100_000)


def build_model(channels: int = 16, hidden: int = 64):
    """digits-cnn's CNN (same layers, same state-dict keys): ``float32 (N, 1, 8, 8)`` in [0, 1] -> 10 logits."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * 16, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def digits(split: str, test_size: float = 0.2, random_state: int = 0, stratify: bool = True):
    """(images float32 (N, 1, 8, 8) in [0, 1], labels int64) of one side of the fixed train/test split."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None, :, :]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=random_state,
                                              stratify=y if stratify else None)
    return (x_tr, y_tr) if split == "train" else (x_te, y_te)


def load_model(path: str):
    """The model of a checkpoint directory, on the CPU, in eval mode, and its ``meta.json``."""
    import torch

    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    model = build_model(**meta["model"])
    model.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location="cpu"))
    return model.eval(), meta


def evaluate(config: Mapping[str, Any]) -> Dict[str, float]:
    """``{"accuracy", "loss", "examples"}`` of the checkpoint on the chosen split."""
    import torch
    import torch.nn.functional as F

    cfg = EvalConfig.model_validate(dict(config))
    if not cfg.checkpoint or not os.path.isfile(os.path.join(cfg.checkpoint, "model.pt")):
        raise ConfigError(f"config.checkpoint: got {cfg.checkpoint!r}; a digits-cnn checkpoint directory (with "
                          "model.pt and meta.json), or in a spec {workload: digits-cnn, step: latest}")
    model, meta = load_model(cfg.checkpoint)
    x, y = digits(cfg.split, **meta.get("split", {}))
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), cfg.batch_size):
            xb, yb = torch.from_numpy(x[i:i + cfg.batch_size]), torch.from_numpy(y[i:i + cfg.batch_size])
            logits = model(xb)
            loss += F.cross_entropy(logits, yb, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == yb).sum())
    print(f"checkpoint at step {meta.get('step')}: {correct}/{len(y)} {cfg.split} images right", flush=True)
    return {"accuracy": correct / len(y), "loss": loss / len(y), "examples": float(len(y))}


evaluate.config_schema = EvalConfig


if __name__ == "__main__":
    import sys

    print(evaluate({"checkpoint": sys.argv[1]}))
