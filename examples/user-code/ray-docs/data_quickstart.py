# Copied from Ray's "Data Loading and Preprocessing" guide, Quickstart, PyTorch tab:
#   https://docs.ray.io/en/latest/train/user-guides/data-loading-preprocessing.html#quickstart
#   repo path: ray-project/ray doc/source/train/user-guides/data-loading-preprocessing.rst (the PyTorch testcode block)
# train_func is verbatim. Steps 1-2 (the dataset the docs build at module level and pass as
# TorchTrainer(datasets={"train": train_dataset})) are copied verbatim too, but inside a function,
# make_train_dataset(), which spec.yaml names as the "train" dataset's function source: that is the one change a
# user must make, since Raylane builds the Ray Datasets on the driver from the spec instead of at import time.
# The snippet's TorchTrainer(...).fit() lines are left out (Raylane builds the trainer from spec.yaml).
import torch
import ray
from ray import train
from ray.train import Checkpoint, ScalingConfig
from ray.train.torch import TorchTrainer

# Set this to True to use GPU.
# If False, do CPU training instead of GPU training.
use_gpu = False


def make_train_dataset():
    # Step 1: Create a Ray Dataset from in-memory Python lists.
    # You can also create a Ray Dataset from many other sources and file
    # formats.
    train_dataset = ray.data.from_items([{"x": [x], "y": [2 * x]} for x in range(200)])

    # Step 2: Preprocess your Ray Dataset.
    def increment(batch):
        batch["y"] = batch["y"] + 1
        return batch

    train_dataset = train_dataset.map_batches(increment)
    return train_dataset


def train_func(config):
    batch_size = 16

    # Step 4: Access the dataset shard for the training worker via
    # ``get_dataset_shard``.
    train_data_shard = train.get_dataset_shard("train")
    train_dataloader = train_data_shard.iter_torch_batches(
        batch_size=batch_size, dtypes=torch.float32
    )

    for epoch_idx in range(1):
        for batch in train_dataloader:
            inputs, labels = batch["x"], batch["y"]
            assert type(inputs) == torch.Tensor
            assert type(labels) == torch.Tensor
            assert inputs.shape[0] == batch_size
            assert labels.shape[0] == batch_size
            break # Only check one batch. Last batch can be partial.
