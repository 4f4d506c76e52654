"""Node probes: the checks the control plane runs on every node, as a Ray task pinned to it.

A probe is any ``module:function`` (``health.probe`` in the policy) taking the node's context and returning a short
message; it fails by raising (the exception's text is the reason) or by returning ``False``. The control actor runs
it every ``health.probe_interval`` on every live node, with ``health.probe_timeout``; a probe that cannot even run
there in time counts as failed. ``health.probe_failures`` failures in a row quarantine the node
(``raylane.control.nodes``).

``default_probe`` checks what a training gang needs from a node:
- condition files: ``<conditions_dir>/<node id>`` or ``<conditions_dir>/all`` present on the node means unhealthy,
  their text is the reason. Anything that watches the node (a DCGM or ECC check, a disk watcher, an operator with
  ``echo "bad fan" > ...``) can take it out of service this way, as node-problem-detector's custom plugins do;
- accelerators: with CUDA, every visible GPU runs a small matrix product and the result must be finite and right;
  without CUDA (logical GPUs, as on a laptop or in CI) the node's declared GPUs are reported, there is no device to
  check.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class ProbeContext:
    node_id: str
    conditions_dir: str
    declared_gpus: float = 0.0


class ProbeFailed(Exception):
    """A probe's verdict that the node is unhealthy."""


def load_probe(path: str) -> Callable[[ProbeContext], object]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def run_probe(path: str, conditions_dir: str, declared_gpus: float = 0.0) -> tuple:
    """(ok, message) of the probe at ``path`` on the node this runs on; never raises."""
    import ray

    ctx = ProbeContext(ray.get_runtime_context().get_node_id(), conditions_dir, declared_gpus)
    try:
        out = load_probe(path)(ctx)
    except Exception as exc:  # noqa: BLE001 - any failure of a probe is the node's verdict
        return False, f"{type(exc).__name__}: {exc}"[:300] if not isinstance(exc, ProbeFailed) else str(exc)[:300]
    if out is False:
        return False, f"{path} returned False"
    return True, ("" if out in (None, True) else str(out))[:300]


def condition_files(ctx: ProbeContext) -> Optional[str]:
    """The text of the first condition file that names this node (or ``all``), None when there is none."""
    d = os.path.expanduser(ctx.conditions_dir)
    for name in (ctx.node_id, "all"):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read().strip()
            return f"condition file {p}: {text or '(empty)'}"
    return None


def _has_nvidia_devices() -> bool:
    return any(name.startswith("nvidia") and name[6:].isdigit() for name in os.listdir("/dev")) \
        if os.path.isdir("/dev") else False


def accelerator_check(ctx: ProbeContext) -> str:
    if not _has_nvidia_devices():  # no import of torch (seconds, hundreds of MB) on a node without NVIDIA devices
        return f"{ctx.declared_gpus:g} logical GPUs declared; no CUDA device to check"
    try:
        import torch
    except ImportError:
        return f"{ctx.declared_gpus:g} GPUs declared; torch is not installed, no device check"
    if not torch.cuda.is_available():
        return f"{ctx.declared_gpus:g} logical GPUs declared; no CUDA device to check"
    n = torch.cuda.device_count()
    for i in range(n):
        a = torch.ones((256, 256), device=f"cuda:{i}")
        s = float((a @ a).sum().item())
        if s != 256.0 ** 3:
            raise ProbeFailed(f"GPU {i} ({torch.cuda.get_device_name(i)}): 256x256 ones product summed to {s}, "
                              f"expected {256 ** 3}")
    if ctx.declared_gpus and n < ctx.declared_gpus:
        raise ProbeFailed(f"{n} CUDA devices visible, {ctx.declared_gpus:g} declared")
    return f"{n} CUDA devices checked"


def default_probe(ctx: ProbeContext) -> str:
    bad = condition_files(ctx)
    if bad:
        raise ProbeFailed(bad)
    return accelerator_check(ctx)
