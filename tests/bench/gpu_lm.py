"""The reference LM workload (workloads/train_lm.py) on a real GPU against the CPU of the same machine, in one run:
``python -m tests.bench.gpu_lm [--steps N]``. Needs only torch, numpy and pydantic (no Ray, no MLflow), so it runs
on a bare GPU machine. It prints, per device and model size, steps per second after a warm-up, the loss at the last
step, and the GPU's speed-up over the CPU; then it checks, on the GPU, that a run which yields at a checkpoint and
resumes ends at the loss of an uninterrupted run (to float tolerance: CUDA kernels are not bit-deterministic).
Not part of ``make bench`` (its modules are named ``bench_*``): the machines that run that have no GPU.
Figures only; nothing is asserted but the resume's loss.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: workloads/ is importable

import torch  # noqa: E402

from workloads.train_lm import LocalHooks, train  # noqa: E402

SIZES = {
    "reference": {},  # the workload's defaults: d_model 128, 2 layers, context 64
    "wider": {"d_model": 512, "n_layers": 6, "n_heads": 8, "context": 256},
}


class DeviceHooks(LocalHooks):
    """The local runner, with the model on ``device``."""

    def __init__(self, root, device, **kw):
        super().__init__(root, **kw)
        self.device = device

    def prepare_model(self, model):
        return model.to(self.device)


def config(size: str, steps: int, batch: int) -> dict:
    return {"max_steps": steps, "batch_size": batch, "checkpoint_every": max(steps // 2, 1), "warmup_steps": 5,
            "num_threads": max(1, min(8, os.cpu_count() or 1)), "deterministic": False, "model": SIZES[size]}


def timed(device: str, size: str, steps: int, batch: int):
    """(steps/s over the steps after the first 5, loss at the last step)."""
    with tempfile.TemporaryDirectory() as tmp:
        hooks = DeviceHooks(tmp, device)
        marks = []
        report = hooks.report

        def stamped(step, metrics):
            marks.append(time.perf_counter())
            report(step, metrics)

        hooks.report = stamped
        train(config(size, steps, batch), hooks=hooks)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        losses = [m["loss"] for _, m in hooks.reports if "loss" in m]
        rate = (len(marks) - 6) / (marks[-1] - marks[5]) if len(marks) > 6 else float("nan")
        return rate, losses[-1]


def resume_matches(device: str, steps: int, batch: int) -> tuple:
    """An uninterrupted run against one that yields at its mid checkpoint and resumes: both final losses."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        full = DeviceHooks(a, device)
        train(config("reference", steps, batch), hooks=full)
        half = DeviceHooks(b, device, stop_at_step=steps // 2)
        first = train(config("reference", steps, batch), hooks=half)
        again = DeviceHooks(b, device)
        train(config("reference", steps, batch), hooks=again)
        return first.status, full.reports[-1][1]["loss"], again.reports[-1][1]["loss"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.gpu_lm", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}; CUDA: {torch.cuda.get_device_name(0) if cuda else 'none'}; "
          f"{os.cpu_count()} CPUs", flush=True)
    devices = ["cpu"] + (["cuda:0"] if cuda else [])
    for size in SIZES:
        rates = {}
        for device in devices:
            rate, loss = timed(device, size, args.steps, args.batch)
            rates[device] = rate
            print(f"{size:>9} on {device:6}: {rate:8.1f} steps/s, loss at step {args.steps}: {loss:.4f}", flush=True)
        if cuda:
            print(f"{size:>9}: GPU {rates['cuda:0'] / rates['cpu']:.1f}x the CPU", flush=True)
    if cuda:
        status, full, resumed = resume_matches("cuda:0", args.steps, args.batch)
        ok = math.isclose(full, resumed, rel_tol=1e-3)
        print(f"resume on the GPU: first run {status}; loss at step {args.steps} uninterrupted {full:.6f}, "
              f"yielded and resumed {resumed:.6f} ({'match' if ok else 'DIFFER'})", flush=True)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
