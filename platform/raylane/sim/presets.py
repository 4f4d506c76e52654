"""Named policies for replays and comparisons: each a set of choices on the core's axes plus what the simulator tells
the policy about runtimes. Every preset runs through the same ``cycle``; none has code of its own.

A preset leaves admission (quotas) and the teams to the cluster setup: a comparison on "one shared cluster" replays
with admission ``none``. ``max_examined`` is lowered where the policy keeps strict order (no backfill): past the
first workload blocked for capacity such a cycle admits nothing, so a deeper look only writes pending reasons a
replay does not read; the simulator repeats a cycle at the same instant while it admits, so the decisions stay those
of the live depth (``tests/sim/test_presets.py`` checks FIFO's are identical) at a fraction of the cost.

Presets
- ``fifo``: first come, first served, strict order (no backfill), no preemption. The baseline.
- ``priority``: class priority, then FIFO; a higher class preempts a lower one of its team (the core's default
  preemption). On a trace with one class it orders like FIFO.
- ``fair-share``: the team furthest below its weighted share goes first; strict order, no preemption.
- ``greedy``: FIFO order, but anything that fits starts (Kueue's BestEffortFIFO); big gangs may starve.
- ``easy``: FIFO with EASY backfilling on exact runtime estimates (its best case); ``easy-noisy`` on estimates off
  by a log-normal factor (sigma 0.5).
- ``las``: Tiresias' discretized 2D-LAS: least attained GPU-service first over queues split at 1, 4, 16, 64 and 256
  GPU-hours (``LAS_LADDER``: two queues at 1 and 10, the preset before, put every gang of 16-64 GPUs in one FIFO
  queue past 10 GPU-hours, 1.69x the oracle on the big-gangs mix), FIFO inside a queue, preempting leases that rank after a waiting job, but none that has run less than an hour
  since its last (re)start (hysteresis, ``HYSTERESIS``): no job is preempted more than once per hour it runs.
  Knows no durations.
- ``las-easy``: the same LAS with EASY backfilling on no estimates: a gang blocked for capacity reserves the nodes it
  will get (running leases are assumed to end ``default_runtime`` after they started), and work behind it starts on
  the other nodes instead of leaving them idle. The same hysteresis. Knows no durations.
- ``qssf``: Helios' quasi-shortest-service-first: the least predicted GPU-time first (GPUs times the median of the
  runtime learned from the jobs that ended before it arrived, ``raylane.runtimes``), EASY backfill on those
  predictions, no preemption. Told no durations: it learns them as the replay goes.
- ``gittins``: Tiresias' 2D-Gittins index over the learned runtime distributions inside LAS's queues (the same
  ladder and hysteresis), EASY backfill on predictions. Learns as the replay goes.
- ``srtf-predicted``: shortest predicted remaining time first (the median of the learned distribution given the
  service had), EASY on predictions, preemptive with the LAS presets' hysteresis. Learns as the replay goes.
- ``srtf-oracle``: shortest remaining time first with exact durations, preemptive, EASY backfill on exact
  estimates: the lower-bound reference no policy that does not know durations should beat.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping

from raylane.errors import UnknownNameError
from raylane.scheduling.types import LAS_LADDER, SchedulerConfig
from raylane.sim.engine import SimOptions

__all__ = ["Preset", "PRESETS", "COMPARISON", "HYSTERESIS", "get_preset", "apply_preset"]

# Strict-order policies look this deep per cycle (see the module docstring).
STRICT_EXAMINED = 4

HOUR = 3600.0

# The hysteresis of the LAS presets: an ordering-driven preemption stops no lease that has run less than an hour
# since its last (re)start. Without it one Philly job was preempted 248 times under las-easy; with it no job is
# preempted more than once per hour of its runtime, at no cost in average JCT (docs/simulator.md).
HYSTERESIS = dict(hysteresis_min_run_s=1 * HOUR)


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    scheduler: Mapping[str, Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    # Whether the policy is told true durations (an oracle, not a fair competitor).
    knows_durations: bool = False


_P = [
    Preset("fifo", "FIFO, strict order, no preemption",
           dict(ordering="fifo", backfill="none", preemption="none"), dict(max_examined=STRICT_EXAMINED)),
    Preset("priority", "class priority then FIFO, strict order, preempts lower classes",
           dict(ordering="priority", backfill="none", preemption="default"), dict(max_examined=STRICT_EXAMINED)),
    Preset("fair-share", "team furthest below its share first, strict order, no preemption",
           dict(ordering="fair-share", backfill="none", preemption="none"), dict(max_examined=STRICT_EXAMINED)),
    Preset("greedy", "FIFO order, anything that fits starts (BestEffortFIFO)",
           dict(ordering="fifo", backfill="greedy", preemption="none")),
    Preset("easy", "FIFO with EASY backfill on exact estimates",
           dict(ordering="fifo", backfill="easy", preemption="none"), dict(estimates="exact"), knows_durations=True),
    Preset("easy-noisy", "FIFO with EASY backfill on noisy estimates (log-normal, sigma 0.5)",
           dict(ordering="fifo", backfill="easy", preemption="none"), dict(estimates="noisy", noise_sigma=0.5),
           knows_durations=True),
    Preset("las", "Tiresias 2D-LAS: queues at 1, 4, 16, 64 and 256 GPU-hours, preemptive after 1 h of run",
           dict(ordering="las", backfill="none", preemption="ordering", las_thresholds=LAS_LADDER,
                **HYSTERESIS),
           dict(max_examined=STRICT_EXAMINED)),
    Preset("las-easy", "Tiresias 2D-LAS with EASY backfill on no estimates, preemptive after 1 h of run",
           dict(ordering="las", backfill="easy", preemption="ordering", las_thresholds=LAS_LADDER,
                **HYSTERESIS)),
    Preset("qssf", "Helios' QSSF: least predicted GPU-time first, EASY backfill on predicted runtimes",
           dict(ordering="qssf", backfill="easy", preemption="none"), dict(estimates="predicted")),
    Preset("gittins", "Tiresias 2D-Gittins on learned runtimes in LAS's queues, EASY on predicted, preemptive after 1 h",
           dict(ordering="gittins", backfill="easy", preemption="ordering", las_thresholds=LAS_LADDER,
                **HYSTERESIS), dict(estimates="predicted")),
    Preset("srtf-predicted", "SRTF on learned runtimes (median remaining), EASY on predicted, preemptive after 1 h",
           dict(ordering="srtf", backfill="easy", preemption="ordering", **HYSTERESIS), dict(estimates="predicted")),
    Preset("srtf-oracle", "SRTF on exact durations, preemptive, EASY backfill (lower-bound reference)",
           dict(ordering="srtf", backfill="easy", preemption="ordering"), dict(estimates="exact"),
           knows_durations=True),
]

PRESETS: Dict[str, Preset] = {p.name: p for p in _P}

# What ``--preset compare`` runs, in table order.
COMPARISON: List[str] = ["fifo", "priority", "fair-share", "greedy", "easy", "easy-noisy", "las", "las-easy",
                         "qssf", "gittins", "srtf-predicted", "srtf-oracle"]


def get_preset(name: str) -> Preset:
    p = PRESETS.get(name)
    if p is None:
        raise UnknownNameError("simulator preset", name, list(PRESETS))
    return p


def apply_preset(preset: Preset, config: SchedulerConfig, options: SimOptions) -> tuple[SchedulerConfig, SimOptions]:
    return replace(config, **dict(preset.scheduler)), replace(options, **dict(preset.options))
