"""The Lightning side of the example: a ``LightningModule`` (a small CNN) and a ``LightningDataModule`` over
scikit-learn's bundled digits. Plain Lightning: nothing here knows about Ray or Raylane except
``RayDDPStrategyOnAnyDevice`` at the bottom."""
from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray.train.lightning import RayDDPStrategy

# How the digits are split into train and test (fixed, so every run and every evaluation scores the same test set).
SPLIT = {"test_size": 0.2, "random_state": 0, "stratify": True}


class DigitsClassifier(pl.LightningModule):
    """Input ``float32 (N, 1, 8, 8)`` with pixels in [0, 1]; output 10 logits."""

    def __init__(self, channels: int = 16, hidden: int = 64, lr: float = 2e-3):
        super().__init__()
        self.save_hyperparameters()  # kept in the checkpoint: load_from_checkpoint rebuilds the model from it
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * channels * 16, hidden), nn.ReLU(),
            nn.Linear(hidden, 10),
        )

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        # Epoch means: RayTrainReportCallback reports trainer.callback_metrics at each epoch's end.
        self.log("loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("accuracy", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class DigitsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 64):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x = torch.from_numpy((digits.images / 16.0).astype(np.float32)[:, None, :, :])
        y = torch.from_numpy(digits.target.astype(np.int64))
        idx_tr, idx_te = train_test_split(np.arange(len(y)), test_size=SPLIT["test_size"],
                                          random_state=SPLIT["random_state"],
                                          stratify=digits.target if SPLIT["stratify"] else None)
        self.train_set = TensorDataset(x[idx_tr], y[idx_tr])
        self.test_set = TensorDataset(x[idx_te], y[idx_te])

    def train_dataloader(self):
        # Lightning swaps in a DistributedSampler (rank and world size from RayDDPStrategy) and sets its epoch.
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self):
        return DataLoader(self.test_set, batch_size=512)


class RayDDPStrategyOnAnyDevice(RayDDPStrategy):
    """``RayDDPStrategy`` that trains on the CPU when torch has no CUDA.

    Ray gives a worker of a GPU gang the device ``cuda:<i>`` whether or not torch can use it; on a cluster of
    logical GPUs (a CPU build of torch, a test cluster) the model must stay on the CPU, and DDP runs over gloo."""

    @property
    def root_device(self) -> torch.device:
        return super().root_device if torch.cuda.is_available() else torch.device("cpu")
