"""Raylane's trace-driven simulator: the scheduling core driven by a simulated clock and simulated nodes.

The simulator imports ``raylane.scheduling`` and has no copy of it: ``engine.Simulator`` keeps a ``ClusterState``,
calls ``cycle`` on its snapshots and plays the executor (leases run until their work is done or they are stopped),
changing the state through ``raylane.scheduling.lifecycle`` as the control plane does.

Modules: ``traces`` (Philly, Tiresias and generic CSV), ``cluster`` (cluster files and flags), ``types`` (options,
result, error), ``engine`` (jobs to workloads, the loop over instants), ``replay`` (one replay's world: events,
jobs, outages, series), ``stranded`` (the stranded-GPU figure), ``outages`` (node failures and drains), ``presets``
(named policies), ``metrics`` (the figures), ``plots`` (PNG), ``costcompare`` (the figures of a fixed cluster
against autoscaled ones). The commands ``raylane sim`` and ``raylane sim-autoscale`` are ``raylane.cli.sim`` and
``raylane.cli.sim_autoscale``: the simulator is a library they use, and imports nothing of the command line.
"""
from raylane.sim.cluster import ClusterSpec, cluster_from_flags, load_cluster
from raylane.sim.engine import DEFAULT_CLASS, ESTIMATES, SimOptions, SimResult, SimulationError, Simulator, simulate
from raylane.sim.metrics import summarize
from raylane.sim.outages import NodeDrain, NodeFailure, Outages
from raylane.sim.presets import COMPARISON, PRESETS, apply_preset, get_preset
from raylane.sim.traces import Trace, TraceJob, load_trace

__all__ = [
    "ClusterSpec", "cluster_from_flags", "load_cluster", "DEFAULT_CLASS", "ESTIMATES", "SimOptions", "SimResult",
    "SimulationError", "Simulator", "simulate", "summarize", "NodeDrain", "NodeFailure", "Outages", "COMPARISON",
    "PRESETS", "apply_preset", "get_preset", "Trace", "TraceJob", "load_trace",
]
