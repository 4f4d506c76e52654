"""A small CNN on scikit-learn's bundled digits (8x8 images, 10 classes), as a plain Ray Train loop.

Nothing here imports Raylane: ``train_loop_per_worker`` is what ``ray.train.torch.TorchTrainer`` runs on every
worker. It is DDP-ready (``prepare_model``, ``prepare_data_loader``, a ``DistributedSampler``), checkpoints every
``checkpoint_every`` steps and resumes from ``ray.train.get_checkpoint()``, so a preempted or restarted run goes on
from its last checkpoint.

A checkpoint is a directory holding:

- ``model.pt``: the model's ``state_dict`` (plain keys, no ``module.`` prefix), loadable into ``build_model(**meta
  ["model"])``;
- ``train_state.pt``: ``{"optimizer": optimizer.state_dict(), "step": int}``;
- ``meta.json``: ``{"step", "model": {"channels", "hidden"}, "input", "classes", "split", "test_accuracy"}``.

Heavy imports (torch, Ray, scikit-learn) happen inside the functions, so importing this module to check a spec's
config against ``DigitsConfig`` is instant.

Run it without Raylane on a local Ray: ``python digits_cnn.py [--workers 2]``.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Mapping, Tuple

from pydantic import BaseModel, ConfigDict, Field

# How the digits are split into train and test: fixed, so an evaluation of any checkpoint scores the same test set.
SPLIT = {"test_size": 0.2, "random_state": 0, "stratify": True}


class DigitsConfig(BaseModel):
    """The loop's config (the spec's ``config``); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(300, ge=1, description="optimizer steps in all")
    batch_size: int = Field(32, ge=1, le=1024, description="per worker")
    lr: float = Field(2e-3, gt=0, le=1.0)
    checkpoint_every: int = Field(50, ge=1, description="steps between checkpoints (and test-set evaluations)")
    log_every: int = Field(10, ge=1, description="steps between metric reports")
    channels: int = Field(16, ge=1, le=256, description="channels of the first conv layer (the second has twice)")
    hidden: int = Field(64, ge=1, le=4096, description="width of the hidden linear layer")
    seed: int = Field(0, description="model init and shuffling")


def build_model(channels: int = 16, hidden: int = 64):
    """The CNN: input ``float32 (N, 1, 8, 8)`` with pixels scaled to [0, 1] (digits' 0..16 divided by 16), output
    10 logits."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),  # 8x8 -> 4x4
        nn.Flatten(),
        nn.Linear(2 * channels * 16, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def digits_split(split: str) -> Tuple[Any, Any]:
    """(images float32 (N, 1, 8, 8) in [0, 1], labels int64 (N,)) of the ``"train"`` or ``"test"`` split."""
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=SPLIT["test_size"], random_state=SPLIT["random_state"],
                                              stratify=y if SPLIT["stratify"] else None)
    if split == "train":
        return x_tr, y_tr
    if split == "test":
        return x_te, y_te
    raise ValueError(f"split {split!r}: 'train' or 'test'")


def load_checkpoint_model(path: str):
    """The model of a checkpoint directory, on the CPU, in eval mode (what an evaluation job does)."""
    import torch

    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    model = build_model(**meta["model"])
    model.load_state_dict(torch.load(os.path.join(path, "model.pt"), map_location="cpu"))
    return model.eval()


def _accuracy(model, x, y, device) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x).to(device)).argmax(dim=1).cpu()
    model.train()
    return float((pred == torch.from_numpy(y)).float().mean())


def train_loop_per_worker(config: Mapping[str, Any]) -> Dict[str, Any]:
    # `config` has no default on purpose: Ray Train passes the config only to a function whose parameter is required.
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import ray.train
    import ray.train.torch

    cfg = DigitsConfig.model_validate(dict(config or {}))
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    # Ray hands out GPUs by resource; a gang of logical GPUs (no CUDA in this torch build) trains on the CPU.
    cuda = torch.cuda.is_available()
    device = ray.train.torch.get_device() if cuda else torch.device("cpu")
    torch.manual_seed(cfg.seed)

    model = build_model(cfg.channels, cfg.hidden)
    step, train_state = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            model.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location="cpu"))
            train_state = torch.load(os.path.join(d, "train_state.pt"), map_location="cpu")
        step = int(train_state["step"])
    model = ray.train.torch.prepare_model(model, move_to_device=device)  # DDP when world > 1
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    if train_state is not None:
        optimizer.load_state_dict(train_state["optimizer"])  # after the model moved: state follows its device

    x_tr, y_tr = digits_split("train")
    x_te, y_te = digits_split("test")
    dataset = TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr))
    # Our own DistributedSampler (also for one worker): its order depends only on (seed, epoch), so a resumed run
    # sees the batches an uninterrupted one would.
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = ray.train.torch.prepare_data_loader(DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler,
                                                            drop_last=True), move_to_device=cuda)
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ValueError(f"batch_size {cfg.batch_size} is larger than a worker's share of the "
                         f"{len(dataset)} training images")

    core = model.module if hasattr(model, "module") else model
    running, seen = 0.0, 0
    while step < cfg.max_steps:
        epoch, skip = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:  # the part of this epoch done before the checkpoint we resumed from
                continue
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            running, seen = running + loss.item(), seen + 1
            metrics: Dict[str, Any] = {"step": step, "epoch": epoch, "loss": running / seen}
            if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                metrics["accuracy"] = _accuracy(core, x_te, y_te, device)
                with tempfile.TemporaryDirectory() as tmp:
                    if rank == 0:
                        _save(tmp, core, optimizer, step, cfg, metrics["accuracy"])
                    # Every rank reports (a barrier); only rank 0's report carries the checkpoint.
                    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0
                                     else None)
                running, seen = 0.0, 0
            elif step % cfg.log_every == 0:
                ray.train.report(metrics)
                running, seen = 0.0, 0
            if step >= cfg.max_steps:
                break
    return {"step": step}


def _save(path: str, core, optimizer, step: int, cfg: DigitsConfig, accuracy: float) -> None:
    import torch

    torch.save(core.state_dict(), os.path.join(path, "model.pt"))
    torch.save({"optimizer": optimizer.state_dict(), "step": step}, os.path.join(path, "train_state.pt"))
    meta = {"step": step, "model": {"channels": cfg.channels, "hidden": cfg.hidden},
            "input": "float32 (N, 1, 8, 8): sklearn digits images / 16", "classes": 10, "split": SPLIT,
            "test_accuracy": accuracy}
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


# Checked wherever the spec is checked (`raylane spec check`, submission): a bad key or value is refused up front.
train_loop_per_worker.config_schema = DigitsConfig


def main() -> None:
    """Run the loop with a bare ``TorchTrainer`` on a local Ray (no Raylane)."""
    import argparse

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=DigitsConfig().max_steps)
    ap.add_argument("--name", default="digits-cnn", help="run name: the same name resumes that run")
    ap.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "digits-cnn-runs"))
    args = ap.parse_args()
    ray.init(num_cpus=max(2, args.workers))
    result = TorchTrainer(train_loop_per_worker, train_loop_config={"max_steps": args.max_steps},
                          scaling_config=ScalingConfig(num_workers=args.workers),
                          run_config=RunConfig(name=args.name, storage_path=args.storage_path)).fit()
    print("metrics:", result.metrics, "\ncheckpoint:", result.checkpoint)


if __name__ == "__main__":
    main()
