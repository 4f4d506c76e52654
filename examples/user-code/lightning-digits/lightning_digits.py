"""A Lightning module on scikit-learn's digits, trained by Ray Train's Lightning utilities.

``train_loop_per_worker`` is Ray's documented Lightning pattern, unchanged: a ``lightning.Trainer`` with
``RayDDPStrategy``, ``RayLightningEnvironment`` and ``RayTrainReportCallback`` (which saves a Lightning checkpoint and
reports it with the epoch's metrics at the end of every epoch), ``prepare_trainer``, and ``trainer.fit(...,
ckpt_path=...)`` from ``ray.train.get_checkpoint()`` when there is one, so a preempted or restarted run resumes
at the epoch after its last checkpoint.

This module imports only pydantic at the top (Lightning takes seconds to import), so checking a spec against
``LightningDigitsConfig`` is instant; the model lives in ``digits_module.py``.

Run it without Raylane on a local Ray: ``python lightning_digits.py [--workers 2]``.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Mapping

from pydantic import BaseModel, ConfigDict, Field


class LightningDigitsConfig(BaseModel):
    """The loop's config (the spec's ``config``); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    max_epochs: int = Field(8, ge=1, description="each epoch ends with a checkpoint (and a chance to be preempted)")
    batch_size: int = Field(64, ge=1, le=1024, description="per worker")
    lr: float = Field(2e-3, gt=0, le=1.0)
    channels: int = Field(16, ge=1, le=256)
    hidden: int = Field(64, ge=1, le=4096)
    seed: int = 0


def train_loop_per_worker(config: Mapping[str, Any]) -> Dict[str, Any]:
    # `config` has no default on purpose: Ray Train passes the config only to a function whose parameter is required.
    import lightning.pytorch as pl
    import torch

    import ray.train
    from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    from digits_module import DigitsClassifier, DigitsData, RayDDPStrategyOnAnyDevice

    cfg = LightningDigitsConfig.model_validate(dict(config))
    pl.seed_everything(cfg.seed, verbose=False)
    model = DigitsClassifier(channels=cfg.channels, hidden=cfg.hidden, lr=cfg.lr)
    trainer = pl.Trainer(
        max_epochs=cfg.max_epochs,
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices="auto",
        strategy=RayDDPStrategyOnAnyDevice(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        # Ray keeps the checkpoints; Lightning's own checkpointing, logger and progress bar would write to the job's
        # working directory and its log.
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-digits-"),
    )
    trainer = prepare_trainer(trainer)
    data = DigitsData(batch_size=cfg.batch_size)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(model, datamodule=data)
    else:
        with checkpoint.as_directory() as d:
            # Restores weights, optimizer, epoch and global step: training goes on at the next epoch.
            trainer.fit(model, datamodule=data, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    return {"step": trainer.global_step, "epoch": trainer.current_epoch}


# Checked wherever the spec is checked (`raylane spec check`, submission): a bad key or value is refused up front.
train_loop_per_worker.config_schema = LightningDigitsConfig


def main() -> None:
    """Run the loop with a bare ``TorchTrainer`` on a local Ray (no Raylane)."""
    import argparse

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-epochs", type=int, default=LightningDigitsConfig().max_epochs)
    ap.add_argument("--name", default="lightning-digits", help="run name: the same name resumes that run")
    ap.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "lightning-digits-runs"))
    args = ap.parse_args()
    # The workers import digits_module from this folder.
    ray.init(num_cpus=max(2, args.workers), runtime_env={"working_dir": os.path.dirname(os.path.abspath(__file__))})
    result = TorchTrainer(train_loop_per_worker, train_loop_config={"max_epochs": args.max_epochs},
                          scaling_config=ScalingConfig(num_workers=args.workers),
                          run_config=RunConfig(name=args.name, storage_path=args.storage_path)).fit()
    print("metrics:", result.metrics, "\ncheckpoint:", result.checkpoint)


if __name__ == "__main__":
    main()
