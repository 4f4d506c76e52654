"""Cheap Tune function trainables for the sweep tests (no torch): a noisy quadratic that checkpoints its step.

``config``: ``x``, ``y`` (the point), ``max_steps``, ``report_every``, ``sleep_s`` (per step, to make a trial last).
The loss falls with the steps towards ``(x - 0.3)**2 + (y + 0.1)**2``; the checkpoint holds the step, so a trial
paused and resumed goes on where it stopped and reports ``resumed_from``.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from ray import tune


def quadratic(config):
    x, y = float(config["x"]), float(config.get("y", 0.0))
    every, top = int(config.get("report_every", 1)), int(config["max_steps"])
    start, resumed_from = 0, None
    found = tune.get_checkpoint()
    if found is not None:
        with found.as_directory() as d:
            start = resumed_from = json.loads(open(os.path.join(d, "state.json")).read())["step"]
    for step in range(start + 1, top + 1):
        time.sleep(float(config.get("sleep_s", 0.0)))
        if step % every and step != top:
            continue
        loss = (x - 0.3) ** 2 + (y + 0.1) ** 2 + 1.0 / step
        metrics = {"step": step, "loss": loss}
        if resumed_from is not None:
            metrics["resumed_from"] = resumed_from
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
