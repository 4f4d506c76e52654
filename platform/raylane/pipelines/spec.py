"""The ``kind: pipeline`` spec under its first address: it lives in ``raylane.config.pipeline`` beside the other
specs, so that the control plane (``raylane.control.actor_pipelines``) reads it without importing this package."""
from raylane.config.pipeline import (DONE_H, DURATION_ESTIMATE, H, PIN, PIPELINE_FIELDS, PLANNERS, STAGE_KINDS,
                                     PipelineSpec, StageSpec, ancestors, demand, estimate_s, expand,
                                     load_pipeline_spec, output_dir, output_location, plan_nodes, planning_problem,
                                     replan_problem, stage_ids)

__all__ = ["STAGE_KINDS", "PIPELINE_FIELDS", "PLANNERS", "DURATION_ESTIMATE", "StageSpec", "PipelineSpec",
           "load_pipeline_spec", "ancestors", "stage_ids", "output_dir", "expand", "estimate_s", "output_location",
           "H", "DONE_H", "demand", "planning_problem", "plan_nodes", "PIN", "replan_problem"]
