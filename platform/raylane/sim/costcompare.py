"""The cost comparison of ``raylane sim-autoscale``: a fixed cluster against autoscaled node groups, cost against JCT.

This module owns issue 28's simulator goal and its figures: the same trace and policy replayed on a fixed cluster
(meant to be sized for the trace's peak) and on autoscaled clusters, each priced per GPU-hour. ``compare_rows``
gives one row per replay's summary (``raylane.sim.metrics.summarize``): GPU-hours bought and cost over the trace's
submit window (first to last submit: a slice of a steady stream of work, where clusters compare fairly) and over
the whole replay (to the last completion, which charges a fixed cluster for idling while the last long jobs end),
nodes (mean and largest), average and median JCT, and the ratios of the submit window's cost and of the average JCT
to the fixed run, with whether the goal holds (cost at most ``GOAL_COST`` of the fixed cluster's for an average JCT
at most ``GOAL_JCT`` times its, every job finished). ``peak_gpus`` is the trace's *peak*: the most GPUs its jobs
would hold at once if each ran from its submit for its duration, the size a fixed cluster needs so that no job
waits for GPUs (up to how they pack). The command that replays and prints them is ``raylane.cli.sim_autoscale``.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from raylane.sim.traces import Trace

__all__ = ["GOAL_COST", "GOAL_JCT", "peak_gpus", "compare_rows"]

# The goal: the autoscaled groups cost at most this share of the fixed cluster's, for an average JCT at most this
# many times the fixed cluster's.
GOAL_COST = 0.60
GOAL_JCT = 1.10


def peak_gpus(trace: Trace) -> float:
    """The most GPUs the trace's jobs hold at once if each runs from its submit for its duration (a job that ends
    as another starts does not overlap it)."""
    events = sorted([(j.submit, 1, j.gpus) for j in trace.jobs] + [(j.submit + j.duration, 0, -j.gpus)
                                                                    for j in trace.jobs])
    held = peak = 0.0
    for _, _, g in events:
        held += g
        peak = max(peak, held)
    return peak


def compare_rows(summaries: List[Tuple[str, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """One row per run (the first is the fixed cluster's): its figures and its ratios to the first."""
    base = summaries[0][1]
    rows = []
    for label, s in summaries:
        cap = s.get("capacity") or {}
        win = cap.get("submit_window") or {}
        cost_ratio = _ratio(win.get("cost"), ((base.get("capacity") or {}).get("submit_window") or {}).get("cost"))
        jct_ratio = _ratio(s["jct"]["mean"], base["jct"]["mean"])
        rows.append({
            "run": label, "cluster": s["cluster"], "finished": s["jobs"]["finished"], "jobs": s["jobs"]["total"],
            "window_gpu_hours": win.get("gpu_hours", math.nan), "window_cost": win.get("cost", math.nan),
            "window_cost_spot": win.get("cost_spot", math.nan),
            "gpu_hours": cap.get("gpu_hours", math.nan), "cost": cap.get("cost", math.nan),
            "cost_spot": cap.get("cost_spot", math.nan), "nodes_mean": cap.get("nodes_mean", math.nan),
            "nodes_max": cap.get("nodes_max", 0), "reclaims": cap.get("reclaims", 0),
            "utilization_bought": cap.get("utilization_bought", math.nan),
            "jct_mean": s["jct"]["mean"], "jct_p50": s["jct"]["p50"], "queue_mean": s["queueing"]["mean"],
            "cost_ratio": cost_ratio, "jct_ratio": jct_ratio,
            "goal_met": (cost_ratio <= GOAL_COST + 1e-12 and jct_ratio <= GOAL_JCT + 1e-12
                         and s["jobs"]["finished"] == base["jobs"]["finished"]) if rows else None,
        })
    return rows


def _ratio(a: Optional[float], b: Optional[float]) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b
