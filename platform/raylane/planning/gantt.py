"""Gantt charts of a plan, and of a plan beside the run that followed it: ``write_gantt`` writes a PNG.

One row per node (in order of first use), a bar per stage labelled with its name; stages that share a node at once
get a lane each within its row. A dependency between two nodes is an arrow from the producer's finish to the
consumer's start, labelled with the GB it moves; when ``network`` is given, the transfer itself is a thin hatched span
on the consumer's row (the planned panel only: measured node names need not be the network's). With ``actual`` (a
``Plan`` of measured times in hours from the pipeline's start; its node names may differ) there are two panels,
planned above and actual below, in one time unit: hours, or minutes when the run (or the plan, without one) is
shorter than an hour; they share the time range unless one is more than three times the other.

matplotlib is imported inside ``write_gantt`` (its Agg canvas, no pyplot state), so importing the planning core
does not load it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from raylane.planning.model import Network, Pipeline, Plan

ROW_H = 0.42  # inches per lane


def _lanes(plan: Plan) -> Tuple[List[str], Dict[str, Tuple[float, float]]]:
    """Nodes in order of first use, and per stage (y centre, bar height) in row units (row i spans i..i+1)."""
    nodes: List[str] = []
    for p in sorted(plan.placements, key=lambda p: (p.start_h, p.node)):
        if p.node not in nodes:
            nodes.append(p.node)
    where: Dict[str, Tuple[float, float]] = {}
    for i, node in enumerate(nodes):
        lanes: List[float] = []  # each lane's latest finish
        mine = sorted((p for p in plan.placements if p.node == node), key=lambda p: (p.start_h, p.stage))
        lane_of = {}
        for p in mine:
            k = next((k for k, f in enumerate(lanes) if f <= p.start_h + 1e-9), len(lanes))
            lanes[k:k + 1] = [p.finish_h]
            lane_of[p.stage] = k
        h = 0.8 / max(len(lanes), 1)
        for p in mine:
            where[p.stage] = (i + 0.1 + h * (lane_of[p.stage] + 0.5), h * 0.9)
    return nodes, where


def write_gantt(path, pipeline: Pipeline, plan: Plan, actual: Optional[Plan] = None, title: str = "",
                network: Optional[Network] = None) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [("planned", plan, network)] + ([("actual", actual, None)] if actual is not None else [])
    spans = [max((p.finish_h for p in pl.placements), default=0.0) for _, pl, _ in panels]
    minutes = spans[-1] < 1.0
    scale, unit = (60.0, "minutes") if minutes else (1.0, "hours")
    shared = max(spans) <= 3 * max(min(spans), 1e-9)
    layouts = [_lanes(pl) for _, pl, _ in panels]
    heights = [1.0 + ROW_H * 2.2 * max(len(nodes), 1) for nodes, _ in layouts]
    fig = Figure(figsize=(10, sum(heights) + (0.4 if title else 0)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    colours = {s.name: f"C{i % 10}" for i, s in enumerate(pipeline.stages)}
    stages = {s.name: s for s in pipeline.stages}
    for ax, (label, pl, net), (nodes, where), span in zip(axes, panels, layouts, spans):
        by = pl.by_stage()
        for p in pl.placements:
            y, h = where[p.stage]
            ax.barh(y, (p.finish_h - p.start_h) * scale, left=p.start_h * scale, height=h,
                    color=colours.get(p.stage, "0.7"), edgecolor="black", linewidth=0.6)
            ax.text((p.start_h + p.finish_h) / 2 * scale, y, p.stage, ha="center", va="center", fontsize=8,
                    clip_on=True)
        for prod, cons in pipeline.edges():
            if prod not in by or cons not in by or by[prod].node == by[cons].node:
                continue
            (yp, _), (yc, hc) = where[prod], where[cons]
            x0, x1 = by[prod].finish_h * scale, by[cons].start_h * scale
            ax.annotate("", xy=(x1, yc), xytext=(x0, yp),
                        arrowprops={"arrowstyle": "->", "color": "0.35", "lw": 0.8, "shrinkA": 0, "shrinkB": 0})
            gb = stages[prod].output_gb
            if gb > 0:
                ax.text((x0 + x1) / 2, (yp + yc) / 2, f"{gb:g} GB", fontsize=7, color="0.3", ha="center")
            if net is not None and gb > 0:
                xfer = net.transfer_h(gb, by[prod].node, by[cons].node) * scale
                ax.barh(yc + hc / 2 + 0.04, xfer, left=x0, height=0.06, color="white", edgecolor="0.35",
                        hatch="////", linewidth=0.5)
        ax.axvline(span * scale, color="0.2", linestyle="--", linewidth=0.8)
        ax.set_yticks([i + 0.5 for i in range(len(nodes))], nodes)
        ax.set_ylim(max(len(nodes), 1), 0)
        ax.set_xlim(0, (max(spans) if shared else span) * scale * 1.03 or 1)
        ax.set_xlabel(f"time from the pipeline's start ({unit})")
        name = f" ({pl.planner})" if pl.planner and pl.planner != label else ""
        ax.set_title(f"{label}{name}: makespan {span * scale:.3g} {'min' if minutes else 'h'}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return str(path)
