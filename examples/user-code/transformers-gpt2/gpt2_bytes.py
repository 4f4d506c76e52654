"""A Hugging Face Transformers ``Trainer`` training a two-layer GPT-2 over bytes, under Ray Train.

Nothing is downloaded: the model is built from a ``GPT2Config`` (a vocabulary of the 256 byte values plus BOS, EOS
and PAD, a tiny width) and the corpus is made at run time from the docstrings of Python's standard library. The
hub is switched off (``HF_HUB_OFFLINE=1``) before Transformers is imported.

``train_loop_per_worker`` is Ray's documented Transformers pattern: ``ray.train.huggingface.transformers.
RayTrainReportCallback`` (after each save of the ``Trainer``, it reports the saved checkpoint with the merged log
metrics, ``step`` included), ``prepare_trainer``, and ``trainer.train(resume_from_checkpoint=...)`` from
``ray.train.get_checkpoint()`` when there is one, so a preempted or restarted run goes on from its last save with
the optimizer, the LR schedule, the RNG states and the position in the data it had.

This module imports only pydantic at the top (Transformers takes seconds to import), so checking a spec against
``GPT2BytesConfig`` is instant.

Run it without Raylane on a local Ray: ``python gpt2_bytes.py [--workers 2]``.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

BOS, EOS, PAD = 256, 257, 258
VOCAB = 259
# Standard-library modules whose docstrings make the corpus (the same text wherever the same Python runs).
CORPUS_MODULES = ("json", "collections", "functools", "itertools", "textwrap", "string", "re", "pathlib",
                  "dataclasses", "argparse", "logging", "csv", "heapq", "bisect", "random", "statistics",
                  "fractions", "decimal", "datetime", "calendar", "shutil", "tempfile", "glob", "fnmatch",
                  "difflib", "pprint", "enum", "contextlib", "abc", "typing", "inspect", "unittest")


class GPT2BytesConfig(BaseModel):
    """The loop's config (the spec's ``config``); unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(200, ge=1)
    batch_size: int = Field(16, ge=1, le=1024, description="per worker")
    lr: float = Field(3e-3, gt=0, le=1.0)
    warmup_steps: int = Field(10, ge=0)
    save_steps: int = Field(20, ge=1, description="steps between checkpoints (each one is reported to Ray)")
    log_every: int = Field(10, ge=1, description="steps between loss logs; must divide save_steps")
    context: int = Field(64, ge=8, le=1024, description="tokens (bytes) per training sequence")
    n_embd: int = Field(32, ge=8, le=1024)
    n_layer: int = Field(2, ge=1, le=24)
    n_head: int = Field(2, ge=1, le=32)
    corpus_bytes: int = Field(100_000, ge=1_000, le=1_000_000,
                              description="size of the docstring corpus (about 200 kB are there)")
    seed: int = 0

    # Field validators (not a model validator), so an error names the field it is about.
    @field_validator("log_every")
    @classmethod
    def _divides_save_steps(cls, v: int, info: ValidationInfo) -> int:
        save = info.data.get("save_steps")
        if save is not None and save % v:
            raise ValueError(f"must divide save_steps ({save}): each checkpoint is reported with the loss logged "
                             "at its step")
        return v

    @field_validator("n_head")
    @classmethod
    def _divides_width(cls, v: int, info: ValidationInfo) -> int:
        width = info.data.get("n_embd")
        if width is not None and width % v:
            raise ValueError(f"must divide n_embd ({width})")
        return v


def docstring_corpus(max_bytes: int) -> bytes:
    """Docstrings of the standard-library modules in ``CORPUS_MODULES`` (and of their public members), in a fixed
    order, UTF-8, cut at ``max_bytes``."""
    import importlib
    import inspect

    parts: List[str] = []
    size = 0
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        objects = [module] + [getattr(module, n) for n in sorted(getattr(module, "__all__", None) or dir(module))
                              if not n.startswith("_") and hasattr(module, n)]
        for obj in objects:
            doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)) else None
            if doc:
                parts.append(doc)
                size += len(doc) + 2
        if size >= max_bytes:
            break
    return "\n\n".join(parts).encode("utf-8")[:max_bytes]


class ByteBlocks:
    """A map-style dataset of ``context``-long token blocks (BOS, then bytes) for causal LM training: each item is
    ``{"input_ids", "labels"}`` (GPT-2 shifts the labels itself)."""

    def __init__(self, data: bytes, context: int):
        import torch

        tokens = torch.tensor(list(data), dtype=torch.long)
        per = context - 1
        n = len(tokens) // per
        if n == 0:
            raise ValueError(f"corpus of {len(data)} bytes is shorter than one block of {context} tokens")
        body = tokens[: n * per].view(n, per)
        self.blocks = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), body], dim=1)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        block = self.blocks[i]
        return {"input_ids": block, "labels": block.clone()}


def build_model(cfg: GPT2BytesConfig):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=cfg.context, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
                        n_head=cfg.n_head, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def train_loop_per_worker(config: Mapping[str, Any]) -> Dict[str, Any]:
    # `config` has no default on purpose: Ray Train passes the config only to a function whose parameter is required.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before Transformers is imported: nothing may reach the hub
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    import ray.train
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    cfg = GPT2BytesConfig.model_validate(dict(config))
    cuda = torch.cuda.is_available()
    if not cuda:
        # Ray Train points Accelerate at the worker's GPU (ACCELERATE_TORCH_DEVICE=cuda:<i>) whenever the gang has
        # GPUs; a gang of logical GPUs (no CUDA in this torch build) trains on the CPU, and DDP runs over gloo.
        os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    torch.manual_seed(cfg.seed)
    dataset = ByteBlocks(docstring_corpus(cfg.corpus_bytes), cfg.context)
    args = TrainingArguments(
        # Each worker saves into a folder of its own; RayTrainReportCallback hands rank 0's latest save to Ray.
        output_dir=tempfile.mkdtemp(prefix="gpt2-bytes-"),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="cosine",
        logging_strategy="steps",
        logging_steps=cfg.log_every,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=1,  # Ray keeps the checkpoints; the local folder needs only the newest
        report_to="none",
        disable_tqdm=True,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # every parameter gets a gradient; the check costs a graph traversal
        seed=cfg.seed,
    )
    trainer = Trainer(model=build_model(cfg), args=args, train_dataset=dataset, data_collator=default_data_collator,
                      callbacks=[RayTrainReportCallback()])
    trainer = prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        out = trainer.train()
    else:
        with checkpoint.as_directory() as d:
            out = trainer.train(resume_from_checkpoint=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
    return {"step": out.global_step, "train_loss": out.training_loss}


# Checked wherever the spec is checked (`raylane spec check`, submission): a bad key or value is refused up front.
train_loop_per_worker.config_schema = GPT2BytesConfig


def main() -> None:
    """Run the loop with a bare ``TorchTrainer`` on a local Ray (no Raylane)."""
    import argparse

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=GPT2BytesConfig().max_steps)
    ap.add_argument("--name", default="gpt2-bytes", help="run name: the same name resumes that run")
    ap.add_argument("--storage-path", default=os.path.join(tempfile.gettempdir(), "gpt2-bytes-runs"))
    args = ap.parse_args()
    ray.init(num_cpus=max(2, args.workers))
    result = TorchTrainer(train_loop_per_worker, train_loop_config={"max_steps": args.max_steps},
                          scaling_config=ScalingConfig(num_workers=args.workers),
                          run_config=RunConfig(name=args.name, storage_path=args.storage_path)).fit()
    print("metrics:", result.metrics, "\ncheckpoint:", result.checkpoint)


if __name__ == "__main__":
    main()
