"""A loop that uses Raylane's optional API: it asks ``raylane.train.should_yield()`` before every step and, when told,
reports a checkpoint at the current step (the report then ends the attempt), so a preemption loses no step."""
import os
import tempfile

import torch

import ray.train
import raylane.train

from my_train import batch


def train_loop_per_worker(config):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    for step in range(start + 1, config["steps"] + 1):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics = {"step": step, "loss": loss.item()}
        if raylane.train.should_yield() or step == config["steps"]:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(d, "state.pt"))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        elif step % 5 == 0:
            ray.train.report(metrics)
