"""The options of ``raylane sim``: ``SimArgs``, the one definition of its flags, and the command built from it.

This module owns what the command's flags are: each field of ``SimArgs`` carries its default and, in its metadata
(``flag(...)``), the flag's names, its help and whether it is the positional argument. ``command`` turns such a
dataclass into a typer command: a function whose ``__signature__`` has one parameter per field (typer reads it as it
reads a written-out signature) and which calls its ``run`` with the dataclass built from what was given. So a flag
is added, renamed or documented in one place, and ``raylane sim --help`` shows what ``SimArgs`` says.

Words
- *flag*: one field's command-line form (``Flag``): its names (``--generate``; none: typer's own from the field's
  name, ``--las-thresholds``), its help, argument or option.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import typer

from raylane.scheduling.preemption import VICTIM_COSTS
from raylane.sim.engine import ESTIMATES
from raylane.sim.generate import MIXES
from raylane.sim.presets import PRESETS
from raylane.sim.traces import FORMATS

__all__ = ["SimArgs", "Flag", "flag", "flag_of", "command"]

# The key of a field's ``Flag`` in its metadata.
FLAG = "raylane.cli.flag"


@dataclass(frozen=True)
class Flag:
    """How one field of an options dataclass appears on the command line."""

    names: Tuple[str, ...] = ()  # "--generate", "--plots/--no-plots"; none: typer's, from the field's name
    help: Optional[str] = None
    argument: bool = False  # the command's positional argument rather than an option
    metavar: Optional[str] = None


def flag(default: Any, *names: str, help: Optional[str] = None, argument: bool = False,
         metavar: Optional[str] = None) -> Any:
    """A dataclass field with ``default`` and its command-line form (``Flag``)."""
    return field(default=default, metadata={FLAG: Flag(names, help, argument, metavar)})


def flag_of(f: dataclasses.Field) -> Flag:
    """The ``Flag`` of a field; a field without one is a mistake of its dataclass, named here."""
    try:
        return f.metadata[FLAG]
    except KeyError:
        raise TypeError(f"field {f.name!r} has no flag: declare it with raylane.cli.sim_args.flag(...)") from None


def command(options: type, run: Callable[[Any], None], *, name: str, doc: str) -> Callable[..., None]:
    """A typer command with one parameter per field of the dataclass ``options`` (its type, default, flag and help)
    that calls ``run(options(**given))``."""
    hints = typing.get_type_hints(options)
    params = []
    for f in dataclasses.fields(options):
        spec = flag_of(f)
        info = (typer.Argument(f.default, metavar=spec.metavar, help=spec.help) if spec.argument
                else typer.Option(f.default, *spec.names, metavar=spec.metavar, help=spec.help))
        params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info,
                                        annotation=hints[f.name]))

    def cmd(**given: Any) -> None:
        run(options(**given))

    cmd.__signature__ = inspect.Signature(params, return_annotation=None)
    cmd.__name__ = cmd.__qualname__ = name
    cmd.__doc__ = doc
    return cmd


@dataclass(frozen=True)
class SimArgs:
    """The options of ``raylane sim``, one field per flag: its default, and its flag and help (``flag``). A field
    left None leaves the choice to the policy file, the preset or the simulator."""

    trace_path: Optional[Path] = flag(
        None, argument=True, metavar="[TRACE]",
        help="trace CSV (Philly, Tiresias or generic format); none with --generate")
    generate_mix: Optional[str] = flag(
        None, "--generate", help="replay a generated trace of this workload mix instead of a file: "
                                 + ", ".join(MIXES) + " (drawn from --seed)")
    from_journal: Optional[Path] = flag(
        None, "--from-journal", help="replay a Raylane control plane's own journal (its submissions, nodes and node "
                                     "losses) instead of a trace file; --policy: the policy to try on it")
    jobs: int = flag(2000, "--jobs", help="with --generate: how many jobs")
    load: float = flag(0.9, "--load", help="with --generate: GPU-time asked over the cluster's, over the submit span")
    users: int = flag(
        0, "--users", help="with --generate: give the jobs this many users and job names, each user's jobs of a "
                           "typical length (0: none)")
    write_trace: Optional[Path] = flag(
        None, "--write-trace", help="with --generate: also write the trace as a generic CSV")
    format: Optional[str] = flag(
        None, "--format", help="trace format: " + ", ".join(FORMATS) + " (default: recognised from the header)")
    team_column: Optional[str] = flag(
        None, "--team-column", help="column whose value is the job's team ('none': one team); default: Philly's "
                                    "cluster, generic team or user")
    user_column: Optional[str] = flag(
        None, "--user-column", help="column whose value is the job's user (a team's user rule reads it; 'none': no "
                                    "users); default: a 'user' column if present")
    start: Optional[str] = flag(None, help="keep jobs submitted from this date (or second) on")
    end: Optional[str] = flag(None, help="keep jobs submitted before this date (or second)")
    limit: Optional[int] = flag(None, help="keep only the first N jobs (after --start/--end)")
    cluster: Optional[Path] = flag(None, "--cluster", help="cluster YAML (node groups)")
    nodes: Optional[int] = flag(None, "--nodes", help="cluster from flags: number of nodes")
    gpus_per_node: int = flag(8, "--gpus-per-node")
    cpus_per_node: float = flag(0.0, "--cpus-per-node", help="0: CPUs not modelled")
    memory_per_node: float = flag(0.0, "--memory-per-node", help="GiB; 0: not modelled")
    features: Optional[str] = flag(None, "--features", help="comma-separated node tags")
    policy: Optional[Path] = flag(None, "--policy", help="policy YAML (policies/*.yaml format)")
    preset: Optional[List[str]] = flag(
        None, "--preset", help="named policy (repeatable; 'compare' for all): " + ", ".join(PRESETS))
    ordering: Optional[str] = flag(None, help="override the ordering policy")
    backfill: Optional[str] = flag(None, help="override the backfill policy")
    preemption: Optional[str] = flag(None, help="override the preemption policy")
    victim_cost: Optional[str] = flag(
        None, "--victim-cost", help="how victims of one class priority are priced: "
                                    + ", ".join(VICTIM_COSTS.names()) + " (default lost_work)")
    admission: Optional[str] = flag(None, help="override the admission policy (quota | none)")
    las_thresholds: Optional[str] = flag(None, help="LAS queue thresholds in GPU-time, e.g. '1h,10h'")
    hysteresis_min_run: Optional[str] = flag(
        None, help="ordering preemption (LAS, SRTF) stops no lease that ran less than this since its (re)start, e.g. "
                   "1h (0: off)")
    hysteresis_fraction: Optional[float] = flag(
        None, help="... nor one that ran less than this fraction of the time it had run before its (re)start")
    job_class: Optional[str] = flag(None, "--class", help="policy class of jobs whose trace names none")
    checkpoint_every: Optional[str] = flag(None, help="override the class's checkpoint interval, e.g. 5m")
    estimates: Optional[str] = flag(None, help="runtime estimates the policy sees: " + ", ".join(ESTIMATES))
    noise_sigma: Optional[float] = flag(None, help="log-normal sigma of noisy estimates")
    seed: int = flag(0, help="seed of the noisy estimates, the drawn failures and --generate")
    stop_delay: Optional[float] = flag(None, help="seconds from a preemption to the resources being free")
    tick: Optional[float] = flag(
        None, help="seconds between clock-triggered cycles (default: 300 when preemption is on, else none)")
    max_examined: Optional[int] = flag(None, help="workloads a cycle looks at, at most")
    fidelity: Optional[str] = flag(
        None, help="how closely the replay follows the live control plane: trace (cycles every 300 s and at each "
                   "change, settled at once; cheap) or live (a cycle a second, stop delays capped at each class's "
                   "grace, resizes that wait for the gang, hand-over); default: live with --from-journal, else "
                   "trace")
    handover: Optional[str] = flag(
        None, help="with --fidelity live: time from an admission to its gang running (Ray Train's start), e.g. "
                   "30s; default: the journal's measured median with --from-journal, else 0")
    placement: Optional[List[str]] = flag(
        None, "--placement", help="placement of jobs whose trace names none (default pack); repeatable: one run per "
                                  "placement, to compare them (e.g. on stranded GPUs)")
    fail: Optional[List[str]] = flag(
        None, "--fail", help="a node failure, NODE@TIME[+DOWN], e.g. node-003@2h+30m (repeatable; without +DOWN it "
                             "never comes back)")
    drain: Optional[List[str]] = flag(
        None, "--drain", help="a drain, NODE@TIME[+FOR]: no new leases from TIME, its leases preempted, back in "
                              "service after FOR (repeatable)")
    node_events: Optional[Path] = flag(
        None, "--node-events", help="CSV of outages: time,node,event (fail|drain),duration")
    mtbf: Optional[str] = flag(
        None, "--mtbf", help="mean time between failures of each node, e.g. 30d (failures drawn with --seed)")
    repair: str = flag("1h", "--repair", help="time a node drawn to fail by --mtbf stays down")
    drain_deadline: str = flag(
        "0", "--drain-deadline", help="how long a drain lets leases run before preempting them (0: at once; none: "
                                      "wait for them to end)")
    elastic_speedup: Optional[str] = flag(
        None, "--elastic-speedup", help="speedup curve of elastic jobs whose trace names none: linear or amdahl:P "
                                        "(serial fraction P), for all classes or per class, e.g. "
                                        "'pretrain=amdahl:0.05,linear' (default linear)")
    resize_overhead: Optional[str] = flag(
        None, "--resize-overhead", help="time an elastic job makes no progress after each resize (its restart), "
                                        "e.g. 1m (default 60s)")
    idle_timeout: Optional[str] = flag(
        None, "--idle-timeout", help="growable node groups: how long a node holds no lease before it is removed, "
                                     "e.g. 10m (default 5m, Ray's autoscaler's)")
    spot_reclaim_per_hour: Optional[float] = flag(
        None, "--spot-reclaim-per-hour", help="spot node groups: reclaims per node-hour, drawn per node with --seed "
                                              "(default 0.01; 0: none)")
    out: Optional[Path] = flag(None, "--out", help="directory for summary.json, table.txt and PNG plots")
    as_json: bool = flag(False, "--json", help="print the JSON report instead of the table")
    plots: bool = flag(True, "--plots/--no-plots", help="write PNG plots into --out")
    progress: bool = flag(True, "--progress/--no-progress", help="show a progress bar (on stderr)")
