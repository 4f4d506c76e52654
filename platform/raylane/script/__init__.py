"""Script mode: a user's existing Ray Train script, run unchanged under Raylane.

    ray job submit --working-dir . -- python -m raylane.run --team T --class C train.py ARGS...
    raylane submit --script train.py --team T --class C -- ARGS...

``python -m raylane.run`` runs the script as the job's driver, as ``__main__`` with ``sys.argv = [train.py, *ARGS]``
(``raylane.script.runner``), after installing this package's hooks, Raylane's only integration points with the
script:
- ``raylane.script.trainer``: every ``fit()`` of a Ray Train V2 trainer (``DataParallelTrainer.fit``; TorchTrainer,
  and the Lightning and Transformers loops on it) becomes a training workload of the team and class given, its gang
  taken from the trainer's ``ScalingConfig``, queued and admitted under the team's quota before any worker starts,
  preempted, resumed and retried by the training launcher; ``fit()`` returns the ``ray.train.Result`` of its last
  attempt, or raises a ``ray.train.TrainingFailedError`` when the workload did not succeed. Another trainer type is
  refused by name.
- ``raylane.script.tuner``, when present: every ``Tuner.fit()`` likewise.
What the script does outside ``fit()`` (its data preparation, its own ``@ray.remote`` tasks) runs as the job's
driver would, with no lease (docs/training.md).

This package owns the hooks' installed state: ``install`` and ``uninstall`` are the only ways to change it.
"""
from __future__ import annotations

from raylane.script.context import ScriptContext

__all__ = ["ScriptContext", "install", "uninstall"]


def _tuner():
    try:
        from raylane.script import tuner
    except ImportError:
        return None
    return tuner if callable(getattr(tuner, "install", None)) else None


def install(ctx: ScriptContext) -> None:
    """Install every script-mode hook for ``ctx``'s script (the trainer's, and the tuner's when it exists)."""
    from raylane.script import trainer

    trainer.install(ctx)
    tuner = _tuner()
    if tuner is not None:
        tuner.install(ctx)


def uninstall() -> None:
    """Remove every script-mode hook (Ray's own methods are back)."""
    from raylane.script import trainer

    tuner = _tuner()
    if tuner is not None and callable(getattr(tuner, "uninstall", None)):
        tuner.uninstall()
    trainer.uninstall()
