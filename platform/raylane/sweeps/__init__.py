"""Hyperparameter sweeps under team quotas: the pieces the sweep driver (``raylane.launchers.tune``) puts together.

- ``raylane.sweeps.conventions``: Tune's conventions as a sweep reads them: the time attribute a trial's progress is
  counted in (the spec's ``time_attr``, else ``step``, else Tune's ``training_iteration``) and the static checks of
  a trainable (a PBT sweep's must checkpoint), run before anything queues.
- ``raylane.sweeps.build``: a ``SweepSpec`` -> Ray Tune's param space, search algorithm and trial scheduler, by name.
- ``raylane.sweeps.quota``: the grant (slots held from the control actor) and the two wrappers that make Tune keep
  to it: ``QuotaScheduler`` (no trial starts or resumes past the grant; a trial over it is paused with its
  checkpoint) and ``GrantLimiter`` (no new trial is drawn past it).
- ``raylane.sweeps.rungs``: synchronous ASHA (``scheduler: {type: asha, synchronous: true}``): each rung decided
  once over every trial that must reach it, so the stopped trials do not depend on timing; pure ``Halving`` and its
  Tune shell ``SynchronousHalvingScheduler``.
- ``raylane.sweeps.tracking``: MLflow child runs per trial under the sweep's parent run, the best trial, and the
  compute an early-stopping scheduler saved.
"""
