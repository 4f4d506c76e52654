"""Policies and workload specs as users write them: pydantic models (``models``) and YAML loading (``loader``).

See ``raylane.config.models`` for the schema and ``raylane.config.loader`` for how files become models and how
errors are reported (every error of a file at once, each as field path, bad value and what is allowed).
"""
from raylane.config.loader import (
    default_policy_path,
    load_policy,
    load_policy_from_dict,
    load_spec,
    load_spec_from_dict,
)
from raylane.config.models import (
    ClusterPolicy,
    GangSpec,
    QuotaSpec,
    ResourcesSpec,
    RunMetadata,
    SchedulerSpec,
    TeamSpec,
    WorkloadClassSpec,
    WorkloadSpec,
    parse_duration,
    parse_memory,
    validate_spec_against_policy,
)

__all__ = [
    "ClusterPolicy",
    "GangSpec",
    "QuotaSpec",
    "ResourcesSpec",
    "RunMetadata",
    "SchedulerSpec",
    "TeamSpec",
    "WorkloadClassSpec",
    "WorkloadSpec",
    "default_policy_path",
    "load_policy",
    "load_policy_from_dict",
    "load_spec",
    "load_spec_from_dict",
    "parse_duration",
    "parse_memory",
    "validate_spec_against_policy",
]
