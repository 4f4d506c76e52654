"""Batch inference on digit images: a Ray Data ``map_batches`` class (``DigitsClassifier``).

Raylane's batch launcher reads the spec's ``config.input`` with Ray Data, runs ``DigitsClassifier`` on as many map
workers as the gang has (each on its worker slot's GPUs), and writes what ``__call__`` returns to ``config.output``
as parquet. Nothing here imports Raylane; the class is a plain Ray Data callable class:

    ds.map_batches(DigitsClassifier, fn_constructor_kwargs={"config": config}, compute=ActorPoolStrategy(size=2))

The model is either
- a digits-cnn checkpoint (``config.checkpoint``: a directory, or in a spec ``{workload: digits-cnn, step: latest}``,
  which Raylane resolves to the directory), or
- built from ``config.model`` and fitted on the digits training split when the worker starts (an MLP: a few seconds
  on a CPU), so that the example runs without a training job.

Each input row has ``pixels`` (64 floats in [0, 1], as ``make_input.py`` writes them) and any other columns, which
are passed through (``id``, ``label``); each output row adds ``prediction`` and ``confidence``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden: int = Field(64, ge=1, le=4096, description="width of the MLP's hidden layer")
    epochs: int = Field(40, ge=1, le=1000, description="full passes over the training split")
    lr: float = Field(1e-2, gt=0, le=1.0)
    seed: int = 0


class BatchConfig(BaseModel):
    """The spec's ``config``: the model, and the keys Raylane's batch launcher reads (declared so that a typo in any
    key is refused; their meaning is in docs/oneshot.md)."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: Optional[str] = Field(None, description="a digits-cnn checkpoint directory; else config.model")
    model: ModelConfig = Field(default_factory=ModelConfig)
    input: Any = None
    input_format: Any = None
    output: Any = None
    overwrite: Any = None
    batch_size: Any = None
    batch_format: Any = None


class DigitsClassifier:
    config_schema = BatchConfig

    def __init__(self, config: Mapping[str, Any]):
        import torch

        cfg = BatchConfig.model_validate(dict(config))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if cfg.checkpoint:
            self.model, self.image_shape = _load_cnn(cfg.checkpoint), (1, 8, 8)
            print(f"DigitsClassifier: digits-cnn checkpoint {cfg.checkpoint}", flush=True)
        else:
            self.model, self.image_shape = _fit_mlp(cfg.model), (64,)
            print(f"DigitsClassifier: MLP fitted from config.model {cfg.model.model_dump()}", flush=True)
        self.model = self.model.to(self.device).eval()

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        import numpy as np
        import torch

        pixels = np.stack([np.asarray(p, dtype=np.float32) for p in batch["pixels"]])
        x = torch.from_numpy(pixels.reshape((len(pixels),) + self.image_shape)).to(self.device)
        with torch.no_grad():
            probs = torch.softmax(self.model(x), dim=1).cpu()
        confidence, prediction = probs.max(dim=1)
        out = {k: v for k, v in batch.items() if k != "pixels"}
        out["prediction"] = prediction.numpy().astype(np.int64)
        out["confidence"] = confidence.numpy().astype(np.float32)
        return out


def _load_cnn(path: str):
    """A digits-cnn checkpoint's model (its README gives the format; the architecture is copied here)."""
    import torch
    from torch import nn

    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    c, h = meta["model"]["channels"], meta["model"]["hidden"]
    model = nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * c * 16, h), nn.ReLU(), nn.Linear(h, 10),
    )
    model.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location="cpu"))
    return model


def _fit_mlp(cfg: ModelConfig):
    """An MLP fitted on the digits training split (full-batch Adam; deterministic for a seed)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32).reshape(len(d.target), 64)
    x_tr, _, y_tr, _ = train_test_split(x, d.target, test_size=0.2, random_state=0, stratify=d.target)
    torch.manual_seed(cfg.seed)
    model = nn.Sequential(nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 10))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr.astype(np.int64))
    for _ in range(cfg.epochs):
        loss = F.cross_entropy(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
