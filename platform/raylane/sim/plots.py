"""PNG figures of replays (matplotlib, Agg backend: no display needed).

- ``jct_cdf.png``: the CDF of job completion times, one line per run, log time axis.
- ``timeline.png``: GPU utilization and queue length over simulated time, one line per run.
- ``nodes.png`` (runs on clusters with growable, priced or spot groups): nodes joined (and starting) against the
  queue length over simulated time, one line per run.
Several runs on one figure compare policies on the same trace.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from raylane.sim.engine import SimResult  # noqa: E402
from raylane.sim.metrics import binned  # noqa: E402

__all__ = ["plot_jct_cdf", "plot_timeline", "plot_nodes", "write_plots"]

Run = Tuple[str, SimResult]

# Runs that decide alike draw the same line; dashes keep each one visible under the others.
_STYLES = ("-", "--", "-.", ":")


def _style(k: int) -> str:
    return _STYLES[k % len(_STYLES)]


def plot_jct_cdf(runs: Sequence[Run], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (label, r) in enumerate(runs):
        jct = sorted(r.finish[j] - r.jobs[j].submit for j in range(len(r.jobs)) if r.finish[j] >= 0)
        if not jct:
            continue
        n = len(jct)
        ax.plot([max(x, 1.0) for x in jct], [(i + 1) / n for i in range(n)], label=label, lw=1.4, ls=_style(k))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("JCT CDF" + (" (partial)" if any(r.partial for _, r in runs) else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_timeline(runs: Sequence[Run], path: Path, bins: int = 400) -> Path:
    fig, (ax_u, ax_q) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    span = max((r.end_time - r.times[0] for _, r in runs if r.times), default=0.0)
    unit, unit_s = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0)
    for k, (label, r) in enumerate(runs):
        if not r.times:
            continue
        t0, t1 = r.times[0], r.end_time if r.end_time > r.times[0] else r.times[-1]
        x, busy = binned(r.times, r.busy, t0, t1, bins)
        _, queued = binned(r.times, r.queued, t0, t1, bins)
        xs = [(v - t0) / unit_s for v in x]
        ax_u.plot(xs, [b / r.total_gpus for b in busy], label=label, lw=1.0, ls=_style(k))
        ax_q.plot(xs, queued, label=label, lw=1.0, ls=_style(k))
    ax_u.set_ylabel("GPU utilization")
    ax_u.set_ylim(0, 1.05)
    ax_u.grid(True, alpha=0.3)
    ax_u.legend(fontsize=8, loc="lower right")
    ax_q.set_ylabel("pending workloads")
    ax_q.set_xlabel(f"simulated time ({unit})")
    ax_q.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_nodes(runs: Sequence[Run], path: Path, bins: int = 400) -> Path:
    """Nodes joined (solid) and starting (thin) over time above the pending workloads, for the runs with a
    ``capacity`` log (time-weighted means over ``bins`` intervals)."""
    runs = [(label, r) for label, r in runs if r.capacity is not None and r.times]
    fig, (ax_n, ax_q) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    span = max((r.end_time - r.times[0] for _, r in runs), default=0.0)
    unit, unit_s = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0)
    for k, (label, r) in enumerate(runs):
        t0, t1 = r.times[0], r.end_time if r.end_time > r.times[0] else r.times[-1]
        x, nodes = binned(r.times, r.capacity.nodes, t0, t1, bins)
        _, starting = binned(r.times, r.capacity.starting, t0, t1, bins)
        _, queued = binned(r.times, r.queued, t0, t1, bins)
        xs = [(v - t0) / unit_s for v in x]
        line, = ax_n.plot(xs, nodes, label=f"{label}: joined", lw=1.2, ls=_style(k))
        if any(starting):
            ax_n.plot(xs, starting, label=f"{label}: starting", lw=0.7, ls=":", color=line.get_color())
        ax_q.plot(xs, queued, label=label, lw=1.0, ls=_style(k), color=line.get_color())
    ax_n.set_ylabel("nodes")
    ax_n.grid(True, alpha=0.3)
    ax_n.legend(fontsize=8, loc="upper right")
    ax_q.set_ylabel("pending workloads")
    ax_q.set_xlabel(f"simulated time ({unit})")
    ax_q.grid(True, alpha=0.3)
    ax_q.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(runs: Sequence[Run], out_dir: Path) -> List[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = [plot_jct_cdf(runs, out_dir / "jct_cdf.png"), plot_timeline(runs, out_dir / "timeline.png")]
    if any(r.capacity is not None for _, r in runs):
        out.append(plot_nodes(runs, out_dir / "nodes.png"))
    return out
