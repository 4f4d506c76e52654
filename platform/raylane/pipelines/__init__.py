"""Pipelines on Ray: a ``kind: pipeline`` spec of dependent stages, each a workload of any one-lease kind, planned
on the cluster's nodes (``raylane.planning``), admitted stage by stage by the control actor and driven by one Ray job
(``python -m raylane.run pipeline.yaml``). See docs/pipelines.md.

- ``raylane.config.pipeline``: the spec, its checks, its expansion into stage
  workloads, the planning problem.
- ``raylane.pipelines.driver``: the job's driver (``run_pipeline``) and ``check`` (what ``raylane spec check`` and
  ``raylane submit`` run on a pipeline).
- ``raylane.control.pipelines`` / ``raylane.control.state_pipelines``: the control plane's side.
"""
