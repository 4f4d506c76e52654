"""A user's own Ray Train loop, written against Ray Train only (no Raylane import): a linear model fitted by SGD on
data drawn per step from a seeded generator, so a run resumed from a checkpoint computes exactly what an
uninterrupted one does. Reports every ``report_every`` steps (default 1), with a checkpoint every
``checkpoint_every`` steps and at the last."""
import os
import tempfile
import time

import torch

import ray.train


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(16, 1, generator=g)
    return x, y


def train_loop_per_worker(config):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    steps, every, report_every = config["steps"], config["checkpoint_every"], config.get("report_every", 1)
    loss = None
    for step in range(start + 1, steps + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(config.get("sleep_s", 0.0))
        metrics = {"step": step, "loss": loss.item()}
        if step % report_every and step % every and step != steps:
            continue
        if step % every == 0 or step == steps:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        else:
            ray.train.report(metrics)
    return {"final_loss": loss.item() if loss is not None else None}


def reference_losses(steps: int, lr: float = 0.05) -> dict:
    """What an uninterrupted run reports, computed without Ray."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = {}
    for step in range(1, steps + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out[step] = loss.item()
    return out


def two_arguments(config, other):  # not a train loop: Ray Train passes one argument
    return None
