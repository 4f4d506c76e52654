"""The live control plane under load (issue 27): submissions, admissions with placement groups, stalls, `raylane queue`.

Scene: a local multi-node Ray cluster (``ray.cluster_utils.Cluster``, ``tests.raytest.start_cluster``): a head without
GPUs and ``--nodes`` nodes of ``--gpus`` logical GPUs each (default 9 x 8, the issue's shape). The detached control
actor is started as `raylane up` starts it (``raylane.control.client.start_control``: authentication on, every call
made with the operator's token, ``tick_s`` 1 s, a sqlite journal in a temporary folder), with the scheduler and
classes of policies/local.yaml and one team, ``bench``, whose nominal quota is the whole cluster. Every workload is a
one-worker, one-GPU ``pretrain`` gang (``tests.raytest.spec``). The first workloads fill the cluster and get
placement groups; the rest wait. Nothing ever runs on a reservation: a workload whose reservation is placed is ended
by its ``release`` (FINISHED, SUCCEEDED), which frees its GPU and removes its placement group.

Before the phases, the bench waits for the control plane's first health probe on every node (a Ray task on each,
whose first run starts a worker process there: seconds of CPU each on a small machine) and for the CPUs to be quiet
(``settle``); it settles again before the churn's window, once its releasers' processes have started.

Phases, in order (each client is a thread of this driver with a ``ControlClient`` of its own):
0. Ray alone (``ray_alone``): no control plane, a 1-GPU placement group on every GPU, and each one placed is removed
   and made again on its node, for 15 s, from one thread: the placement-group work of the churn's admissions with
   nothing else asking, what Ray's own processes give on this machine (printed beside the admissions/s);
   0b. Ray alone, calls (``calls_alone``): an actor made as the control actor is, whose ``request`` answers at once,
   called ``--multi`` times with a submission's arguments from ``--clients`` clients: what Ray gives of phase 2's
   calls here (printed beside the submissions/s from ``--clients`` clients);
1. ``--single`` submissions from one client, one after the other (``ControlClient.submit``);
2. ``--multi`` submissions from ``--clients`` clients at once;
3. churn: the queue topped up to ``--backlog`` pending workloads, then for ``--churn-s`` seconds ``--clients``
   releasers take the live workloads in the order the control plane admits them (submit time: one team, one class),
   wait for each one's reservation to be placed (``wait_admission``) and release it, so that GPUs free and the control
   plane admits from the backlog. The releasers are drivers: each a Ray actor, a process of its own at the drivers'
   CPU priority (``--releasers processes``, ``--drivers`` at once in each), not threads of this process (``--releasers
   threads``, the measurement before: their calls shared one interpreter with the monitor). Each waits for an answer
   before its next call, so the rate is at most the releasers at once over two round trips. Printed: admissions/s
   (the fall of ``info()["pending"]`` over the window, nothing being submitted meanwhile) and reservations placed and
   released per second; then, once settled, the placement groups Ray holds in state CREATED against the leases the
   control plane reports (they must be equal);
4. a burst of ``--burst`` submissions from ``--clients`` clients: the rate over the burst and over its first and last
   10% (how it falls as the queue grows), and the count: every id answered is in ``queue()``, ``queue()`` holds
   exactly the live workloads, ``info()`` counts as many, and no call failed;
5. `raylane queue` at as many entries as are live then, timed three ways: ``ControlClient.queue()`` alone; the CLI's
   command (``raylane.cli.cluster.queue``) in this process, its calls and its printing (as it prints off a terminal)
   into a string; and ``raylane queue`` in a new process, as a user runs it (the interpreter's start, the imports
   and joining Ray included). Then the placement groups against the leases once more.

Phases 3 and 4 also print the CPU time the actor's process used (``time.process_time`` in the actor), so that its
own work shows apart from waiting for a CPU on a busy machine (phase 3 also this process's, the releasers' when they
are threads). Through them a monitor calls ``info`` every 50 ms and
records each answer's latency: the longest is the actor's longest stall (it includes this driver's own delay, which
on a busy machine is not nothing); its pending counts also tell when a churn's backlog ran dry, and admissions/s is
taken up to then. Printed beside the figures: the issue's goals and the baseline measured before the work on it, on
the same shape of cluster (a reference table, not measured here), with ratios. Timings are printed, not asserted
(CONVENTIONS 10). The defaults are small enough for `make bench` on a 2-core machine (under 2 minutes there); the
issue's sizes:

    python -m tests.bench.bench_live [--nodes 9 --gpus 8] [--single N] [--multi N] [--clients 8]
        [--backlog 3000] [--churn-s S] [--releasers processes|threads] [--drivers 1] [--burst 10000] [--profile]

``--profile``: cProfile runs inside the control actor (on its event loop's thread) through phases 3 and 4, and its
top functions by own time are printed (the profiler slows the actor: that run's figures are low). The cluster, the
actor and the journal's folder are removed at the end, also after a failure.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

TEAM = "bench"
CLASS = "pretrain"
MONITOR_EVERY_S = 0.05

# The goals, and what was measured on the same shape of cluster before the work on it.
GOALS = {"multi": 500.0, "admissions": 200.0, "stall_s": 1.0, "queue_s": 2.0}
BASELINE_LABEL = "baseline (1652e1d, issue 27)"
BASELINE = {"single": 50.0, "multi": 58.0, "burst": 26.0, "admissions": 2.9, "queue_s": 52.0}
BASELINE_ROWS = [
    ("submissions/s, 1 client", "50 /s"),
    ("submissions/s, 8 clients", "58 /s"),
    ("burst of 10,000 submissions", "26 /s"),
    ("admissions/s, backlog of 2,900 pending", "2.9 /s"),
    ("raylane queue (CLI), 13,000 entries", "52 s"),
]


# ------------------------------------------------------------------------------------------- submissions
@dataclass
class Submitted:
    """What one batch of submissions answered: each id with its submit time (the control plane's) and the moment
    (``perf_counter``) its answer came back; calls that failed, with the error."""

    asked: int
    t0: float
    done: List[float] = field(default_factory=list)
    ids: Dict[str, float] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (max(self.done) - self.t0) if self.done else float("nan")

    @property
    def rate(self) -> float:
        return len(self.done) / self.seconds if self.done else 0.0

    def tenths(self) -> List[float]:
        """Submissions/s over each tenth of the answers, in order (empty below 10 answers)."""
        d = sorted(self.done)
        if len(d) < 10:
            return []
        cuts = [self.t0] + [d[len(d) * i // 10 - 1] for i in range(1, 11)]
        return [(len(d) * (i + 1) // 10 - len(d) * i // 10) / max(cuts[i + 1] - cuts[i], 1e-9) for i in range(10)]

    def tenth_rates(self) -> Tuple[float, float]:
        """Submissions/s over the first and the last 10% of the answers."""
        t = self.tenths()
        return (t[0], t[-1]) if t else (float("nan"), float("nan"))


def submit_many(clients, n: int, prefix: str, deadline_s: float) -> Submitted:
    """``n`` one-GPU workloads named ``<prefix><i>``, spread over ``clients`` (one thread each); a client stops once
    ``deadline_s`` has passed, so a slow control plane shows as fewer answers, not as a hang."""
    from tests.raytest import spec

    out = Submitted(n, time.perf_counter())
    lock = threading.Lock()
    stop_at = out.t0 + deadline_s

    def work(k: int, ctl) -> None:
        for i in range(k, n, len(clients)):
            if time.perf_counter() > stop_at:
                with lock:
                    out.errors.append(f"deadline of {deadline_s:g}s passed")
                return
            try:
                view = ctl.submit(spec(f"{prefix}{i}", TEAM, CLASS, gpu=1, cpu=0.5))
            except Exception as exc:  # noqa: BLE001 - counted and shown; the bench goes on
                with lock:
                    out.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            t = time.perf_counter()
            with lock:
                out.done.append(t)
                out.ids[view.id] = view["submit_time"]

    _run_threads([lambda k=k, c=c: work(k, c) for k, c in enumerate(clients)], deadline_s + 120, "submitters")
    return out


def _run_threads(fns: List[Callable[[], None]], timeout_s: float, what: str) -> None:
    threads = [threading.Thread(target=f, daemon=True, name=f"{what}-{i}") for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    end = time.perf_counter() + timeout_s
    for t in threads:
        t.join(timeout=max(0.0, end - time.perf_counter()))
    alive = sum(t.is_alive() for t in threads)
    if alive:
        raise RuntimeError(f"{alive} of {len(threads)} {what} still running after {timeout_s:g}s")


# ------------------------------------------------------------------------------------------------ stalls
class Monitor:
    """Calls ``info`` every ``every`` seconds (start to start, or back to back when an answer takes longer) and keeps
    (start, latency, pending workloads) of each call (pending None when the call failed)."""

    def __init__(self, ctl, every: float = MONITOR_EVERY_S):
        self.ctl, self.every = ctl, every
        self.samples: List[Tuple[float, float, Optional[int]]] = []
        self.errors: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="stall-monitor")

    def __enter__(self) -> "Monitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.ctl.timeout + 10)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0, pending = time.perf_counter(), None
            try:
                pending = self.ctl.info()["pending"]
            except Exception as exc:  # noqa: BLE001 - a timed-out call is a stall as long as the timeout
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            lat = time.perf_counter() - t0
            self.samples.append((t0, lat, pending))
            self._stop.wait(max(0.0, self.every - lat))

    def window(self, t0: float, t1: float) -> List[float]:
        """Latencies of the calls that started in ``[t0, t1]``."""
        return [lat for t, lat, _ in list(self.samples) if t0 <= t <= t1]

    def drained_at(self, t0: float, t1: float, floor: int) -> float:
        """When the first call started in ``[t0, t1]`` saw at most ``floor`` pending (``t1`` if none did): a
        backlog that runs dry before the window ends admits nothing more, and its rate is taken up to then."""
        return next((t for t, _, n in list(self.samples) if t0 <= t <= t1 and n is not None and n <= floor), t1)

    def line(self, t0: float, t1: float) -> str:
        lats = sorted(self.window(t0, t1))
        if not lats:
            return "no sample"
        p = lambda q: lats[min(len(lats) - 1, int(q * len(lats)))]  # noqa: E731
        at = max((x for x in list(self.samples) if t0 <= x[0] <= t1), key=lambda x: x[1])[0] - t0
        return (f"longest {lats[-1] * 1e3:,.0f} ms (asked {at:.1f} s in), p99 {p(.99) * 1e3:,.0f} ms, p50 "
                f"{p(.5) * 1e3:,.0f} ms ({len(lats)} calls)")


# ----------------------------------------------------------------------------------------------- churn
@dataclass
class Churned:
    """A churn window ``[t0, t1]`` (``perf_counter``): the pending count before and after, the workloads released,
    the calls that failed; ``admitting_s``: from ``t0`` until the pending count reached its last value (the backlog
    ran dry, or the window ended), set from the monitor's samples."""

    t0: float
    t1: float
    pending_before: int
    pending_after: int
    released: List[str]
    errors: List[str]
    admitting_s: float = 0.0

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0

    @property
    def admissions(self) -> int:
        return self.pending_before - self.pending_after

    @property
    def admissions_rate(self) -> float:
        return self.admissions / max(self.admitting_s or self.seconds, 1e-9) if self.admissions > 0 else 0.0

    @property
    def release_rate(self) -> float:
        return len(self.released) / max(self.seconds, 1e-9)


def release_each(ctl, take: Callable[[], Optional[str]], stop_at: float, released: Callable[[str], None],
                 failed: Callable[[str], None]) -> None:
    """One releaser, as a driver does it: each workload that ``take`` hands out is waited for (``wait_admission``)
    until its reservation is placed, then released (FINISHED, SUCCEEDED); until ``stop_at`` (``time.time()``)."""
    from raylane.control.client import EndState, Outcome

    while time.time() < stop_at and (wid := take()) is not None:
        while (left := stop_at - time.time()) > 0:
            try:
                view = ctl.wait_admission(wid, timeout_s=min(2.0, max(0.1, left)))
                if view.ready:
                    ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED, detail="bench_live churn")
                    released(wid)
                    break
                if view.terminal:
                    break
            except Exception as exc:  # noqa: BLE001 - counted and shown
                failed(f"{wid}: {type(exc).__name__}: {exc}"[:300])
                break


def _releaser_actor():
    """The Ray actor class of ``churn``'s releasers in processes of their own, as drivers are: ``num_cpus=0``, at
    the drivers' CPU priority (Ray starts its workers at nice 15), this module travelling to them by value (it is
    not importable on a Ray worker)."""
    import ray
    import ray.cloudpickle

    if __name__ != "__main__":
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @ray.remote(num_cpus=0, max_restarts=0, runtime_env={"env_vars": {"RAY_worker_niceness": "0"}})
    class Releaser:
        def __init__(self, ctl):
            self.ctl = ctl
            self.ctl.info()  # joined: the control actor found and called once before the window opens

        def run(self, ids: List[str], stop_at: float, drivers: int) -> Tuple[List[str], List[str], float]:
            """``drivers`` releasers at once (threads), each taking the next of ``ids``."""
            lock = threading.Lock()
            it = iter(ids)
            released: List[str] = []
            errors: List[str] = []

            def take() -> Optional[str]:
                with lock:
                    return next(it, None)

            threads = [threading.Thread(target=release_each, args=(self.ctl, take, stop_at, released.append,
                                                                   errors.append), daemon=True)
                       for _ in range(drivers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=max(0.0, stop_at - time.time()) + 90)
            return released, errors, time.time()

    return Releaser


def settle(after: str, quiet_pct: float = 50.0, max_s: float = 120.0) -> None:
    """Wait until this machine's CPUs are quiet (under ``quiet_pct`` percent busy over two seconds in a row, at most
    ``max_s``), and say how long it took: starting processes (the releasers, and those Ray starts besides, the
    first health probes' workers on every node) takes seconds of CPU each on a small machine, and a window opened
    meanwhile measures them, not the control plane."""
    import psutil

    t0 = time.perf_counter()
    quiet = 0
    while quiet < 2 and time.perf_counter() - t0 < max_s:
        quiet = quiet + 1 if psutil.cpu_percent(interval=1.0) < quiet_pct else 0
    took = time.perf_counter() - t0
    _say(f"   settled after {after}: CPUs under {quiet_pct:g}% busy after {took:.1f} s"
         + ("" if quiet >= 2 else f" (not quiet within {max_s:g} s: measuring anyway)"))


def first_probes(ctl, timeout_s: float = 120.0) -> None:
    """Wait until the control plane has its first health probe's verdict on every node (``health.probe_interval``,
    a Ray task on each node, whose first run starts a worker process there), then until the CPUs are quiet."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if all(n.get("probe", {}).get("at") for n in ctl.nodes()):
            break
        time.sleep(0.5)
    took = time.perf_counter() - t0
    _say(f"first health probes done on every node in {took:.1f} s")
    settle("the first health probes")


def churn(clients, order: List[str], window_s: float, info: Callable[[], dict], processes: bool = True,
          drivers: int = 1) -> Churned:
    """Release, for ``window_s`` seconds, each workload of ``order`` once its reservation is placed, taking them in
    that order (the control plane's admission order). ``processes``: one Ray actor per client, actor *k* taking
    ``order[k::n]`` with ``drivers`` releasers (threads) at once, as drivers are processes of their own and each
    running workload has one; else one releaser per client, a thread of this process, all taking the next from one
    shared cursor (their calls then share this process's one interpreter lock with the monitor, and the bench's own
    client can be what limits the rate). A releaser waits for each answer before its next call, so the rate is at
    most the releasers at once over two calls' round trip: with few of them it measures the calls' latency, not the
    control plane's throughput."""
    import ray

    lock = threading.Lock()
    released: List[str] = []
    errors: List[str] = []
    ends: List[float] = []
    if processes:
        Releaser = _releaser_actor()
        actors = [Releaser.remote(c) for c in clients]
        ray.get([a.__ray_ready__.remote() for a in actors], timeout=120)
        settle("the releasers' processes started")
    pending_before = info()["pending"]
    t0 = time.perf_counter()
    stop_at = time.time() + window_s
    if processes:
        try:
            out = ray.get([a.run.remote(order[k::len(actors)], stop_at, drivers) for k, a in enumerate(actors)],
                          timeout=window_s + 120)
        finally:
            for a in actors:
                ray.kill(a)
        for done, failed, _ in out:
            released += done
            errors += failed
        # Each releaser's end, on this process's clock (perf_counter and time.time() differ by a constant here).
        ends = [t - time.time() + time.perf_counter() for _, _, t in out]
    else:
        nxt = [0]

        def take() -> Optional[str]:
            with lock:
                if nxt[0] >= len(order):
                    return None
                nxt[0] += 1
                return order[nxt[0] - 1]

        def work(ctl) -> None:
            release_each(ctl, take, stop_at, lambda w: _locked(lock, released.append, w),
                         lambda e: _locked(lock, errors.append, e))
            _locked(lock, ends.append, time.perf_counter())

        _run_threads([lambda c=c: work(c) for c in clients], window_s + 120, "releasers")
    return Churned(t0, max(ends) if ends else time.perf_counter(), pending_before, info()["pending"], released, errors)


def _locked(lock: threading.Lock, fn: Callable, *args) -> None:
    with lock:
        fn(*args)


def placement_groups_vs_leases(ctl, timeout_s: float = 60.0) -> Tuple[int, int, int, bool]:
    """(CREATED placement groups of the control plane, leases it reports, its groups still PENDING, equal), polled
    until equal with nothing pending, or ``timeout_s`` (reservations asked for just before are still being placed)."""
    from ray.util.placement_group import placement_group_table

    deadline = time.perf_counter() + timeout_s
    while True:
        leases = ctl.info()["leases"]
        states = [v.get("state") for v in placement_group_table().values()
                  if str(v.get("name") or "").startswith("raylane-")]
        created, waiting = states.count("CREATED"), states.count("PENDING") + states.count("RESCHEDULING")
        if (created == leases and not waiting) or time.perf_counter() > deadline:
            return created, leases, waiting, created == leases
        time.sleep(0.5)


# ---------------------------------------------------------------------------------------------- the queue
@dataclass
class QueueTimes:
    """`raylane queue` at ``entries`` entries: ``call_s`` the ``queue()`` call alone; ``cli_s`` the CLI's command
    (``raylane.cli.cluster.queue``) run in this process, its ``queue()`` and ``info()`` calls and its printing into
    a string (``lines`` printed); ``process_s`` the command in a new process as a user runs it (the interpreter's
    start, imports and joining Ray included). A run that failed has None, and ``failures`` says why."""

    entries: int
    call_s: float
    cli_s: Optional[float]
    lines: int
    process_s: Optional[float]
    failures: List[str]


@contextlib.contextmanager
def _env(**values: Optional[str]):
    """This process's environment with ``values`` set (None: unset), put back afterwards."""
    before = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def queue_timed(ctl, address: str, timeout_s: float) -> Tuple[list, QueueTimes]:
    """The rows of ``queue()`` and the three timings of ``QueueTimes``. The CLI finds the cluster by ``RAY_ADDRESS``
    and the caller by ``RAYLANE_TOKEN`` (the operator's token; unset without authentication), so a `raylane up`
    cluster of this machine's user is never the one it reaches."""
    from raylane.cli import cluster as cluster_commands

    token = ctl.credential.token if ctl.credential is not None else None
    env = {"RAY_ADDRESS": address, "RAYLANE_TOKEN": token, "RAYLANE_CREDENTIALS": None, "RAY_AUTH_MODE": None}
    t0 = time.perf_counter()
    rows = ctl.queue()
    t1 = time.perf_counter()
    buf, failures, cli_s = io.StringIO(), [], None
    try:
        with _env(**env), contextlib.redirect_stdout(buf):
            cluster_commands.queue(all_=False, as_json=False)
        cli_s = time.perf_counter() - t1
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - typer.Exit and what the command let through
        failures.append(f"in this process: {type(exc).__name__}: {exc}"[:300])
    process_s = None
    child = {k: v for k, v in os.environ.items() if k not in env}
    child.update({k: v for k, v in env.items() if v is not None})
    t3 = time.perf_counter()
    try:
        out = subprocess.run([str(Path(sys.executable).parent / "raylane"), "queue"], env=child, capture_output=True,
                             text=True, timeout=timeout_s)
        if out.returncode == 0:
            process_s = time.perf_counter() - t3
        else:
            failures.append(f"a new process: exit status {out.returncode}: "
                            f"{(out.stderr or out.stdout).strip()[-300:]}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        failures.append(f"a new process: {type(exc).__name__}: {exc}"[:300])
    return rows, QueueTimes(len(rows), t1 - t0, cli_s, buf.getvalue().count("\n"), process_s, failures)


# -------------------------------------------------------------------------------------------- profiling
def actor_cpu_s(handle) -> Optional[float]:
    """CPU seconds the control actor's process has used (all its threads), None if it cannot tell: beside a
    phase's wall time it tells the actor's own work from waiting for a CPU on a busy machine."""
    import ray

    try:
        return ray.get(handle.__ray_call__.remote(lambda actor: time.process_time()), timeout=60)
    except Exception:  # noqa: BLE001 - a figure less, not a failed benchmark
        return None


def _cpu_line(cpu0: Optional[float], cpu1: Optional[float], wall_s: float) -> str:
    if cpu0 is None or cpu1 is None:
        return "the actor's CPU time: unknown"
    return (f"the actor's process used {cpu1 - cpu0:.1f} s of CPU in {wall_s:.1f} s "
            f"({(cpu1 - cpu0) / max(wall_s, 1e-9):.0%} of one CPU)")


def profile_start(handle) -> None:
    """cProfile on the control actor's event loop thread, where every call and tick runs. ``__ray_call__`` runs its
    function on another thread of the actor, so the profiler is switched on from the loop (the loop of the actor's
    tick task); the functions travel by value, so the actor's worker need not import this module."""
    import ray

    def start(actor):
        import asyncio
        import cProfile

        async def on_loop():
            actor._bench_profile = cProfile.Profile()
            actor._bench_profile.enable()

        task = getattr(actor.shell, "_loop_task", None)
        if task is None:
            raise RuntimeError("the control actor has no loop task to find its event loop by (it has answered no "
                               "call yet, or its loop is kept elsewhere now)")
        asyncio.run_coroutine_threadsafe(on_loop(), task.get_loop()).result(timeout=30)

    ray.get(handle.__ray_call__.remote(start), timeout=60)


def profile_stop(handle, top: int = 30) -> str:
    """Switch the profiler off (on the loop) and return its top ``top`` functions by own time."""
    import ray

    def stop(actor, top):
        import asyncio
        import io as _io
        import pstats

        async def on_loop():
            actor._bench_profile.disable()

        asyncio.run_coroutine_threadsafe(on_loop(), actor.shell._loop_task.get_loop()).result(timeout=60)
        s = _io.StringIO()
        pstats.Stats(actor._bench_profile, stream=s).sort_stats("tottime").print_stats(top)
        del actor._bench_profile
        return s.getvalue()

    return ray.get(handle.__ray_call__.remote(stop, top), timeout=120)


# ------------------------------------------------------------------------------------------------ phases
@dataclass
class Measured:
    """What the phases measured (``pg_*``: ``placement_groups_vs_leases`` after the churn and at the end)."""

    clients: int
    one: Submitted
    multi: Submitted
    churned: Churned
    burst: Submitted
    pg_churn: Tuple[int, int, int, bool]
    pg_end: Tuple[int, int, int, bool]
    counted: bool
    queue: QueueTimes
    stall_s: float
    monitor: Monitor
    ray_alone: float = float("nan")  # placement groups made, placed and removed per second by Ray alone (phase 0)
    calls_alone: float = float("nan")  # calls answered at once per second by Ray alone, phase 2's clients (phase 0b)


def _say(line: str) -> None:
    print(line, flush=True)


def _submitted(what: str, s: Submitted, live: Dict[str, float]) -> None:
    live.update(s.ids)
    _say(f"{what}: {len(s.done)} of {s.asked} answered in {s.seconds:.2f} s, {s.rate:,.1f} /s; errors "
         f"{len(s.errors)}" + (f" (first: {s.errors[0]})" if s.errors else ""))


def _pg_line(what: str, pg: Tuple[int, int, int, bool]) -> None:
    _say(f"   {what}: placement groups CREATED {pg[0]}, leases {pg[1]}, groups still pending {pg[2]}: "
         f"{'equal' if pg[3] else 'NOT equal'}")


def phase_churn(args, clients, ctl, mon: Monitor, live: Dict[str, float]) -> Churned:
    """3: the backlog topped up to ``--backlog``, then released in admission order for ``--churn-s`` seconds."""
    top_up = max(0, args.backlog - ctl.info()["pending"])
    if top_up:
        _submitted(f"3. backlog topped up with {top_up}", submit_many(clients, top_up, "backlog-", args.phase_timeout),
                   live)
    cpu0, own0 = actor_cpu_s(ctl.handle), time.process_time()
    ch = churn(clients, sorted(live, key=lambda w: (live[w], w)), args.churn_s, ctl.info,
               processes=args.releasers == "processes", drivers=args.drivers)
    cpu1, own1 = actor_cpu_s(ctl.handle), time.process_time()
    ch.admitting_s = mon.drained_at(ch.t0, ch.t1, ch.pending_after) - ch.t0
    for wid in ch.released:
        live.pop(wid, None)
    _say(f"3. churn: backlog of {ch.pending_before} pending, {ch.seconds:.1f} s: {ch.admissions} admitted, "
         f"{ch.admissions_rate:,.1f} admissions/s (over {ch.admitting_s:.1f} s, until the pending count reached "
         f"{ch.pending_after}); {len(ch.released)} reservations placed and released, {ch.release_rate:,.1f} /s; "
         f"errors {len(ch.errors)}" + (f" (first: {ch.errors[0]})" if ch.errors else ""))
    _say(f"   {_cpu_line(cpu0, cpu1, ch.seconds)}; this bench's process (releasers: {args.releasers}"
         + (f", {args.drivers} per process" if args.releasers == "processes" else "") + "; the "
         f"monitor) used {own1 - own0:.1f} s ({(own1 - own0) / max(ch.seconds, 1e-9):.0%} of one CPU)")
    _say(f"   stalls during the churn: {mon.line(ch.t0, ch.t1)}")
    return ch


def phase_burst(args, clients, ctl, mon: Monitor, live: Dict[str, float]) -> Submitted:
    """4: ``--burst`` submissions from every client at once."""
    b0, cpu0 = time.perf_counter(), actor_cpu_s(ctl.handle)
    burst = submit_many(clients, args.burst, "burst-", args.phase_timeout)
    b1, cpu1 = time.perf_counter(), actor_cpu_s(ctl.handle)
    _submitted(f"4. burst of {args.burst}, {len(clients)} clients", burst, live)
    first, last = burst.tenth_rates()
    _say(f"   per tenth of the burst: {', '.join(f'{r:,.0f}' for r in burst.tenths())} /s; last / first "
         f"{last / first:.2f}")
    _say(f"   {_cpu_line(cpu0, cpu1, b1 - b0)}")
    _say(f"   stalls during the burst: {mon.line(b0, b1)}")
    return burst


def phase_queue(args, ctl, address: str, burst: Submitted, live: Dict[str, float]) -> Tuple[bool, QueueTimes]:
    """5 (and 4's count): `raylane queue` timed, its rows checked against what was answered: (all accounted for,
    the timings)."""
    from raylane.control.client import ControlClient

    slow = ControlClient(ctl.handle, ctl.credential, timeout=max(600.0, args.phase_timeout))
    rows, q = queue_timed(slow, address, max(600.0, args.phase_timeout))
    shown = {r.id for r in rows}
    st = ctl.info()
    missing = [w for w in burst.ids if w not in shown]
    counted = (not burst.errors and len(burst.ids) == args.burst and not missing and shown == set(live)
               and st["pending"] + st["leases"] == len(live))
    _say(f"4. count: {len(burst.ids)} ids answered of {args.burst}, {len(missing)} of them missing from queue(); "
         f"queue() {len(rows)} entries, {len(live)} live expected ({len(shown - set(live))} unexpected, "
         f"{len(set(live) - shown)} missing); info(): {st['pending']} pending + {st['leases']} leases; errors "
         f"{len(burst.errors)}: {'all accounted for' if counted else 'NOT accounted for'}")
    _say(f"5. raylane queue at {q.entries:,} entries: queue() alone {q.call_s:.2f} s; the CLI's command in this "
         f"process (queue(), info(), printing {q.lines:,} lines) {_secs(q.cli_s)}; `raylane queue` in a new "
         f"process {_secs(q.process_s)}" + "".join(f"\n   failed, {f}" for f in q.failures))
    return counted, q


def ray_alone(args, window_s: float = 15.0) -> float:
    """0. What Ray alone sustains of the churn's placement-group work on this cluster, without the control plane:
    a 1-GPU group pinned to each GPU of the cluster, all at once (the churn's full cluster); then for ``window_s``
    seconds, each time one is placed, it is removed and a new one made on the same node (a release freeing a GPU
    and an admission taking it), from one thread of this process. Every admission of the churn costs Ray at least
    this (one group made, placed and removed), so its rate is what Ray's processes (the GCS, the raylets) give on
    this machine with nothing else asking. Returns groups per second."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    def make(nid: str):
        pg = placement_group([{"GPU": 1}], bundle_label_selector=[{"ray.io/node-id": nid}], lifetime="detached")
        return pg.ready(), (pg, nid)

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU"))
    inflight = dict(make(nid) for nid in nodes for _ in range(args.gpus))
    ray.get(list(inflight), timeout=args.phase_timeout)
    done = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        refs = list(inflight)
        ready, rest = ray.wait(refs, num_returns=1, timeout=5.0, fetch_local=False)
        if rest and ready:
            ready += ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=False)[0]
        for ref in ready:
            pg, nid = inflight.pop(ref)
            remove_placement_group(pg)
            ref2, made = make(nid)
            inflight[ref2] = made
            done += 1
    took = time.perf_counter() - t0
    for pg, _ in inflight.values():
        remove_placement_group(pg)
    rate = done / took
    _say(f"0. Ray alone: {done:,} placement groups placed, removed and made again on their node in {took:.1f} s "
         f"(one per GPU, {len(inflight)}, always): {rate:,.1f} /s (what Ray gives of the churn's work here)")
    settle("Ray alone")
    return rate


def calls_alone(args) -> float:
    """0b. What Ray alone sustains of the submissions' calls, without the control plane: an async actor made as the
    control actor is (no CPU, 1,000 calls at once, on the head, at the default CPU priority) whose ``request``
    answers at once, called ``--multi`` times with a submission's arguments from ``--clients`` threads of this
    process, as phase 2 calls the control plane. Every submission costs Ray at least such a call, so its rate is the
    ceiling of phase 2's on this machine. Returns calls per second."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raylane.control.client import head_node_id
    from tests.raytest import spec

    @ray.remote
    class Answer:
        async def request(self, credential, call, args):
            return {"id": args["spec"]["name"], "state": "PENDING"}

    actor = Answer.options(num_cpus=0, max_concurrency=1000, runtime_env={"env_vars": {"RAY_worker_niceness": "0"}},
                           scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False)).remote()
    payload = {"spec": spec("alone", TEAM, CLASS, gpu=1, cpu=0.5), "job_id": None}
    ray.get(actor.request.remote("token", "submit", payload), timeout=args.phase_timeout)

    def work(k: int) -> None:
        for _ in range(k, args.multi, args.clients):
            ray.get(actor.request.remote("token", "submit", payload), timeout=args.phase_timeout)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = args.multi / (time.perf_counter() - t0)
    ray.kill(actor)
    _say(f"0b. Ray alone, calls: {args.multi:,} calls answering at once, from {args.clients} clients: {rate:,.1f} /s "
         f"(what Ray gives of phase 2's calls here)")
    settle("Ray alone, calls")
    return rate


def run_phases(args, ctl, address: str) -> Measured:
    """The phases (0 to 5) against the running control plane ``ctl`` (an operator's client) of the Ray cluster at
    ``address``."""
    from raylane.control.client import ControlClient

    clients = [ControlClient(ctl.handle, ctl.credential, timeout=120.0) for _ in range(args.clients)]
    live: Dict[str, float] = {}  # workload id -> its submit time, for every workload not ended
    alone = ray_alone(args)
    calls = calls_alone(args)
    one = submit_many(clients[:1], args.single, "one-", args.phase_timeout)
    _submitted("1. submissions, 1 client", one, live)
    multi = submit_many(clients, args.multi, "multi-", args.phase_timeout)
    _submitted(f"2. submissions, {args.clients} clients", multi, live)
    if args.profile:
        profile_start(ctl.handle)
    with Monitor(ControlClient(ctl.handle, ctl.credential, timeout=120.0)) as mon:
        ch = phase_churn(args, clients, ctl, mon, live)
        pg_churn = placement_groups_vs_leases(ctl)
        _pg_line("after the churn", pg_churn)
        burst = phase_burst(args, clients, ctl, mon, live)
    if mon.errors:
        _say(f"   the monitor's calls that failed: {len(mon.errors)} (first: {mon.errors[0]})")
    if args.profile:
        _say("control actor, cProfile over the churn and the burst (by own time; the profiler slows the actor, so "
             "this run's figures are low):\n" + profile_stop(ctl.handle))
    counted, queue = phase_queue(args, ctl, address, burst, live)
    pg_end = placement_groups_vs_leases(ctl)
    _pg_line("at the end", pg_end)
    stall = max([lat for _, lat, _ in mon.samples] or [float("nan")])
    return Measured(args.clients, one, multi, ch, burst, pg_churn, pg_end, counted, queue, stall, mon, alone, calls)


# ------------------------------------------------------------------------------------------------ report
def _ratio(x: float, base: Optional[float]) -> str:
    return f"{x / base:,.1f}x" if base and x == x else "-"


def _secs(x: Optional[float]) -> str:
    return "failed" if x is None else f"{x:.2f} s"


def _met(ok: Optional[bool]) -> str:
    return "-" if ok is None else ("met" if ok else "NOT met")


def print_summary(m: Measured) -> None:
    """One line per figure: the figure, at what size, the goal and whether it is met, the baseline and the ratio."""
    first, last = m.burst.tenth_rates()
    ch, q = m.churned, m.queue
    big = q.entries >= 10_000
    rows = [
        ("submissions/s, 1 client", f"{m.one.rate:,.1f} /s", f"{len(m.one.done):,}", "", None,
         f"{BASELINE['single']:g} /s", _ratio(m.one.rate, BASELINE["single"])),
        (f"submissions/s, {m.clients} clients", f"{m.multi.rate:,.1f} /s", f"{len(m.multi.done):,}",
         f">= {GOALS['multi']:.0f} /s", m.multi.rate >= GOALS["multi"], f"{BASELINE['multi']:g} /s",
         _ratio(m.multi.rate, BASELINE["multi"])),
        ("  Ray alone: calls answered at once", f"{m.calls_alone:,.1f} /s", f"{m.clients} clients", "", None, "",
         f"submissions {m.multi.rate / m.calls_alone:.0%} of it" if m.calls_alone > 0 else "-"),
        ("burst, submissions/s", f"{m.burst.rate:,.1f} /s",
         f"{len(m.burst.done):,} (first 10% {first:,.0f}/s, last {last:,.0f}/s)", "", None,
         f"{BASELINE['burst']:g} /s (10,000)", _ratio(m.burst.rate, BASELINE["burst"])),
        ("admissions/s with placement groups", f"{ch.admissions_rate:,.1f} /s", f"backlog {ch.pending_before:,}",
         f">= {GOALS['admissions']:.0f} /s", ch.admissions_rate >= GOALS["admissions"],
         f"{BASELINE['admissions']:g} /s (2,900)", _ratio(ch.admissions_rate, BASELINE["admissions"])),
        ("  Ray alone: groups made, placed, removed", f"{m.ray_alone:,.1f} /s", "one a GPU, 1 thread",
         "", None, "", f"admissions {ch.admissions_rate / m.ray_alone:.0%} of it" if m.ray_alone > 0 else "-"),
        ("longest stall (backlog, churn, burst)", f"{m.stall_s:.2f} s", f"{len(m.monitor.samples):,} calls",
         f"<= {GOALS['stall_s']:g} s", m.stall_s <= GOALS["stall_s"], "", "-"),
        *[(f"raylane queue, {where}", _secs(secs), f"{q.entries:,} entries", f"< {GOALS['queue_s']:g} s (10,000)",
           secs < GOALS["queue_s"] if big and secs is not None else None, f"{BASELINE['queue_s']:g} s (13,000)",
           "-" if secs is None else f"{BASELINE['queue_s'] / max(secs, 1e-9):,.1f}x faster")
          for where, secs in (("in this process", q.cli_s), ("a new process", q.process_s))],
    ]
    load = os.getloadavg()
    _say(f"summary ({os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at "
         f"the end: above the CPU count, every figure includes waiting for a CPU; a goal at 10,000 entries is judged "
         f"only at that size):")
    head = ("measure", "this run", "size", "goal", "", BASELINE_LABEL, "vs baseline")
    rows = [(*r[:4], _met(r[4]), *r[5:]) for r in rows]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    errors = len(m.one.errors) + len(m.multi.errors) + len(ch.errors) + len(m.burst.errors)
    _say(f"  checks: burst accounted for: {m.counted}; placement groups CREATED = leases after the churn: "
         f"{m.pg_churn[3]}, at the end: {m.pg_end[3]}; failed calls: {errors} (monitor: {len(m.monitor.errors)})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=9, help="GPU nodes (besides a head without GPUs); default 9")
    ap.add_argument("--gpus", type=int, default=8, help="logical GPUs per node; default 8")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients of phases 2-4; default 8")
    ap.add_argument("--single", type=int, default=300, help="submissions from one client; default 300")
    ap.add_argument("--multi", type=int, default=1000, help="submissions from --clients clients; default 1000")
    ap.add_argument("--backlog", type=int, default=2000,
                    help="pending workloads when the churn starts (issue: thousands; the baseline's 2,900); "
                         "default 2000")
    ap.add_argument("--churn-s", type=float, default=30.0, help="the churn's window in seconds; default 30")
    ap.add_argument("--releasers", choices=("processes", "threads"), default="processes",
                    help="the churn's releasers: Ray actors of their own, as drivers are (default), or threads of "
                         "this process, which then limit the rate themselves on a small machine")
    ap.add_argument("--drivers", type=int, default=1,
                    help="with --releasers processes: releasers at once in each process (each running workload has "
                         "a driver of its own); default 1 (8 in all with 8 clients, as the issue's measurement)")
    ap.add_argument("--burst", type=int, default=3000, help="burst of submissions (issue: 10,000); default 3000")
    ap.add_argument("--tick-s", type=float, default=1.0, help="the actor's slow tick (`raylane up`: 1 s)")
    ap.add_argument("--no-auth", action="store_true", help="run the control plane without authentication")
    ap.add_argument("--phase-timeout", type=float, default=900.0,
                    help="seconds any one phase may take before its clients stop; default 900")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the control actor through the churn and the burst, print its top functions")
    args = ap.parse_args(argv)
    for name in ("nodes", "gpus", "clients", "single", "multi", "burst", "drivers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: got {getattr(args, name)}; allowed: at least 1")
    if args.backlog < 0 or args.churn_s <= 0 or args.tick_s <= 0 or args.phase_timeout <= 0:
        ap.error(f"--backlog {args.backlog}, --churn-s {args.churn_s:g}, --tick-s {args.tick_s:g}, --phase-timeout "
                 f"{args.phase_timeout:g}: allowed: a backlog of 0 or more, and times above 0")

    import ray

    from raylane.control.client import start_control, stop_control
    from tests.raytest import local_policy, start_cluster, stop_cluster

    total_gpus = args.nodes * args.gpus
    _say(f"bench_live: {args.nodes} nodes x {args.gpus} logical GPUs ({total_gpus} GPUs) and a head without GPUs; "
         f"1-GPU {CLASS} gangs of team {TEAM} (nominal quota {total_gpus} GPUs); sizes: --single {args.single}, "
         f"--multi {args.multi} from --clients {args.clients}, --backlog {args.backlog} with --churn-s "
         f"{args.churn_s:g}, --burst {args.burst} (issue: a burst of 10,000, a backlog in the thousands); auth "
         f"{'off' if args.no_auth else 'on'}, tick {args.tick_s:g} s")
    _say(f"{BASELINE_LABEL}, same shape of cluster (a reference, not measured here):\n"
         + "\n".join(f"  {what:<42} {fig}" for what, fig in BASELINE_ROWS))
    _say(f"goals: >= {GOALS['multi']:.0f} submissions/s from 8 clients, >= {GOALS['admissions']:.0f} admissions/s "
         f"with placement groups, no stall over {GOALS['stall_s']:g} s, `raylane queue` under {GOALS['queue_s']:g} s "
         f"at 10,000 entries")
    workdir = tempfile.mkdtemp(prefix="raylane-bench-live-")
    cluster = None
    t_start = time.perf_counter()
    try:
        cluster = start_cluster(gpu_nodes=tuple((f"gpu-{i}", ["gpu-sim"]) for i in range(args.nodes)),
                                gpus=args.gpus, cpus=args.gpus, head_cpus=2)
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        policy = local_policy()
        policy["teams"] = {TEAM: {"quotas": {"gpu": {"nominal": total_gpus}}}}
        ctl = start_control(policy, os.path.join(workdir, "journal.db"), tick_s=args.tick_s,
                            auth_enabled=not args.no_auth)
        seen = ctl.info()["nodes"]
        if seen < args.nodes:
            raise RuntimeError(f"the control plane sees {seen} nodes, not the {args.nodes} GPU nodes started")
        sched = policy["scheduler"]
        _say(f"cluster and control actor up in {time.perf_counter() - t_start:.1f} s; scheduler "
             f"{sched['ordering']}/{sched['admission']}/{sched['backfill']}, at most "
             f"{sched['max_admissions_per_cycle']} admissions per cycle")
        first_probes(ctl)
        print_summary(run_phases(args, ctl, cluster.address))
    finally:
        try:
            if ray.is_initialized():
                stop_control()
        except Exception as exc:  # noqa: BLE001 - the cluster goes anyway
            print(f"stopping the control actor: {type(exc).__name__}: {exc}")
        if cluster is not None:
            stop_cluster(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
        _say(f"bench_live: {time.perf_counter() - t_start:.1f} s in all")


if __name__ == "__main__":
    main()
