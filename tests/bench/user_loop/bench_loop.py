"""The loop both sides of bench_train run: a user's plain Ray Train loop (no Raylane import) that writes the wall
time of its first step to ``config["first_step_file"]`` (rank 0), then trains a small MLP for ``steps`` steps,
reporting every step and checkpointing every ``checkpoint_every``. Also the bare baseline's driver (``--bare``)."""
import json
import os
import sys
import tempfile
import time

import torch

import ray.train


def train_loop_per_worker(config):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = config.get("first_step_file")
    for step in range(1, config.get("steps", 20) + 1):
        x = torch.randn(64, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 1 and first and ray.train.get_context().get_world_rank() == 0:
            with open(first, "w") as fh:
                fh.write(repr(time.time()))
        if step % config.get("checkpoint_every", 10) == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                ray.train.report({"step": step, "loss": loss.item()}, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report({"step": step, "loss": loss.item()})


def bare(config_json: str, storage: str, name: str) -> None:
    """The baseline job: the same loop in a TorchTrainer of the same shape, no Raylane."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(address="auto")
    TorchTrainer(train_loop_per_worker, train_loop_config=json.loads(config_json),
                 scaling_config=ScalingConfig(num_workers=1, use_gpu=True, resources_per_worker={"CPU": 1, "GPU": 1}),
                 run_config=RunConfig(name=name, storage_path=storage),
                 torch_config=TorchConfig(backend="gloo")).fit()


if __name__ == "__main__":
    bare(*sys.argv[1:4])
