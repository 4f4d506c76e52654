"""Raylane's reference ML workloads: a byte-level transformer LM trained on Python's standard library sources.

Real torch, small enough for two CPU cores. Nothing here imports Ray except ``workloads.ray_train`` and
``workloads.ray_tune``, and importing this package imports nothing (not even torch).

- ``workloads.data``: the corpus (stdlib ``.py`` files, sorted, cut at ``max_bytes``), its train/val split, its
  snapshot id, and ``batch_at(seed, step)``, the pure step -> batch function that makes resume exact.
- ``workloads.model``: ``ModelConfig`` and ``ByteTransformer`` (pre-LN decoder, SDPA, tied output).
- ``workloads.train_lm``: ``train(config, *, hooks) -> TrainResult``, shared by pretraining and fine-tuning
  (``init_from``, ``finetune_config``); ``TrainHooks`` is the runner's contract, ``LocalHooks`` the local runner,
  ``ForwardingHooks`` the base for wrappers (metrics loggers).
- ``workloads.checkpoint``: the checkpoint directory (``state.pt`` + ``meta.json``).
- ``workloads.eval_lm``: ``evaluate(checkpoint_dir) -> {"val_loss", "perplexity"}``.
- ``workloads.ray_train``: ``train_loop_per_worker`` for ``ray.train.torch.TorchTrainer``, and ``check_config``.
- ``workloads.ray_tune``: ``lm_trainable``, a Ray Tune function trainable (one trial, reports and checkpoints
  together; what Raylane's sweeps run for ``trainable: workloads.train_lm``).
"""
