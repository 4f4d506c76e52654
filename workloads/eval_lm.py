"""Evaluation of the reference language model: mean next-byte loss and perplexity on a corpus's val split.

The evaluation set is fixed: ``batches * batch_size`` windows spread evenly over the split (``data.eval_windows``),
no randomness, so two checkpoints evaluated on the same corpus are compared on the same bytes.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from workloads import checkpoint as ckpt
from workloads.data import CorpusConfig, eval_windows, load_corpus
from workloads.model import ByteTransformer, ModelConfig

__all__ = ["evaluate", "mean_loss", "load_model"]


@torch.no_grad()
def mean_loss(model: nn.Module, data: torch.Tensor, *, windows: int, batch_size: int) -> float:
    """Mean cross-entropy per byte over ``windows`` evenly spread windows of ``data``; leaves ``model`` in eval mode."""
    model.eval()
    context = model.config.context
    x_all, y_all = eval_windows(data, count=windows, context=context)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, windows, batch_size):
        x, y = x_all[i : i + batch_size].to(device), y_all[i : i + batch_size].to(device)
        logits, _ = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    return total / count


def load_model(checkpoint_dir: str) -> tuple[ByteTransformer, dict[str, Any]]:
    """The model of a checkpoint, on CPU in eval mode, and its ``meta.json``."""
    meta = ckpt.read_meta(checkpoint_dir)
    model = ByteTransformer(ModelConfig.model_validate(meta["model"]))
    model.load_state_dict(ckpt.read_state(checkpoint_dir)["model"])
    return model.eval(), meta


def evaluate(
    checkpoint_dir: str,
    *,
    batches: int = 8,
    batch_size: Optional[int] = None,
    corpus: Optional[Mapping[str, Any]] = None,
) -> dict[str, float]:
    """``{"val_loss", "perplexity"}`` of a checkpoint on a val split.

    The split is that of the corpus the checkpoint trained on, with any key of ``corpus`` (``subdir``,
    ``max_bytes``, ``val_fraction``) overriding it: ``corpus={"subdir": "email"}`` evaluates a pretraining
    checkpoint on the fine-tuning corpus. ``batch_size`` defaults to the run's.
    """
    if batches < 1:
        raise ValueError(f"batches: got {batches!r}; allowed: an integer >= 1")
    model, meta = load_model(checkpoint_dir)
    train_cfg = meta["train"]
    corpus_cfg = CorpusConfig.model_validate({**train_cfg["corpus"], **(corpus or {})})
    size = batch_size or int(train_cfg["batch_size"])
    with _deterministic():
        val = mean_loss(model, load_corpus(corpus_cfg).val, windows=batches * size, batch_size=size)
    return {"val_loss": val, "perplexity": math.exp(val)}


class _deterministic:
    """Deterministic algorithms while evaluating, the caller's setting afterwards."""

    def __enter__(self) -> None:
        self._prev = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)

    def __exit__(self, *exc: object) -> None:
        torch.use_deterministic_algorithms(self._prev[0], warn_only=self._prev[1])
