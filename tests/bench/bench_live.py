"""The live control plane under load (issue 27): submissions, admissions with placement groups, stalls, `raylane queue`.

Scene: a local multi-node Ray cluster (``ray.cluster_utils.Cluster``, ``tests.raytest.start_cluster``): a head without
GPUs and ``--nodes`` nodes of ``--gpus`` logical GPUs each (default 9 x 8, the issue's shape). The detached control
actor is started as `raylane up` starts it (``raylane.control.client.start_control``: authentication on, every call
made with the operator's token, ``tick_s`` 1 s, a sqlite journal in a temporary folder), with the scheduler and
classes of policies/local.yaml and one team, ``bench``, whose nominal quota is the whole cluster. Every workload is a
one-worker, one-GPU ``pretrain`` gang (``tests.raytest.spec``). The first workloads fill the cluster and get
placement groups; the rest wait. Nothing ever runs on a reservation: a workload whose reservation is placed is ended
by its ``release`` (FINISHED, SUCCEEDED), which frees its GPU and removes its placement group.

Phases, in order (each client is a thread of this driver with a ``ControlClient`` of its own):
1. ``--single`` submissions from one client, one after the other (``ControlClient.submit``);
2. ``--multi`` submissions from ``--clients`` clients at once;
3. churn: the queue topped up to ``--backlog`` pending workloads, then for ``--churn-s`` seconds ``--clients``
   releasers take the live workloads in the order the control plane admits them (submit time: one team, one class),
   wait for each one's reservation to be placed (``wait_admission``) and release it, so that GPUs free and the control
   plane admits from the backlog. Printed: admissions/s (the fall of ``info()["pending"]`` over the window, nothing
   being submitted meanwhile) and reservations placed and released per second; then, once settled, the placement
   groups Ray holds in state CREATED against the leases the control plane reports (they must be equal);
4. a burst of ``--burst`` submissions from ``--clients`` clients: the rate over the burst and over its first and last
   10% (how it falls as the queue grows), and the count: every id answered is in ``queue()``, ``queue()`` holds
   exactly the live workloads, ``info()`` counts as many, and no call failed;
5. `raylane queue` at as many entries as are live then: ``ControlClient.queue()`` and the CLI's table
   (``raylane.cli_cluster.queue_table`` printed by a rich Console 160 columns wide, the CLI's width off a terminal,
   into a string), timed apart; then the placement groups against the leases once more.

During phases 3 and 4 a monitor calls ``info`` every 50 ms and records each answer's latency: the longest is the
actor's longest stall (it includes this driver's own delay, which on a busy machine is not nothing). Its pending
counts also tell when a churn's backlog ran dry: admissions/s is taken up to then. Printed beside
the figures: the issue's goals and the baseline measured before the work on it, on the same shape of cluster (a
reference table, not measured here), with ratios. Timings are printed, not asserted (CONVENTIONS 10). The defaults
are small enough for `make bench` on a 2-core machine (a few minutes); the issue's sizes:

    python -m tests.bench.bench_live [--nodes 9 --gpus 8] [--single N] [--multi N] [--clients 8]
        [--backlog 3000] [--churn-s S] [--burst 10000] [--profile]

``--profile``: cProfile runs inside the control actor (on its event loop's thread) through phases 3 and 4, and its
top functions by own time are printed. The cluster, the actor and the journal's folder are removed at the end, also
after a failure.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import tempfile
import threading
import time
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

    def tenth_rates(self) -> Tuple[float, float]:
        """Submissions/s over the first and the last 10% of the answers."""
        d = sorted(self.done)
        k = max(1, len(d) // 10)
        if len(d) < 2 * k + 1:
            return float("nan"), float("nan")
        return k / max(d[k - 1] - self.t0, 1e-9), k / max(d[-1] - d[-k - 1], 1e-9)


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
        return (f"longest {lats[-1] * 1e3:,.0f} ms, p99 {p(.99) * 1e3:,.0f} ms, p50 {p(.5) * 1e3:,.0f} ms "
                f"({len(lats)} calls)")


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


def churn(clients, order: List[str], window_s: float, info: Callable[[], dict]) -> Churned:
    """Release, for ``window_s`` seconds, each workload of ``order`` once its reservation is placed, taking them in
    that order (the control plane's admission order), one releaser per client."""
    from raylane.control.client import EndState, Outcome

    lock = threading.Lock()
    nxt = [0]
    released: List[str] = []
    errors: List[str] = []
    pending_before = info()["pending"]
    t0 = time.perf_counter()
    stop_at = t0 + window_s
    ends: List[float] = []

    def work(ctl) -> None:
        while time.perf_counter() < stop_at:
            with lock:
                if nxt[0] >= len(order):
                    break
                wid = order[nxt[0]]
                nxt[0] += 1
            while (left := stop_at - time.perf_counter()) > 0:
                try:
                    view = ctl.wait_admission(wid, timeout_s=min(2.0, max(0.1, left)))
                    if view.ready:
                        ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED, detail="bench_live churn")
                        with lock:
                            released.append(wid)
                        break
                    if view.terminal:
                        break
                except Exception as exc:  # noqa: BLE001 - counted and shown
                    with lock:
                        errors.append(f"{wid}: {type(exc).__name__}: {exc}"[:300])
                    break
        with lock:
            ends.append(time.perf_counter())

    _run_threads([lambda c=c: work(c) for c in clients], window_s + 120, "releasers")
    return Churned(t0, max(ends) if ends else time.perf_counter(), pending_before, info()["pending"], released, errors)


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
def queue_timed(ctl) -> Tuple[list, float, float, int]:
    """(rows, seconds of ``queue()``, seconds of the CLI's table rendered, characters rendered)."""
    from rich.console import Console

    from raylane.cli_cluster import queue_table

    t0 = time.perf_counter()
    rows = ctl.queue()
    t1 = time.perf_counter()
    buf = io.StringIO()
    Console(file=buf, width=160).print(queue_table(rows))
    t2 = time.perf_counter()
    return rows, t1 - t0, t2 - t1, len(buf.getvalue())


# -------------------------------------------------------------------------------------------- profiling
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

        task = getattr(actor, "_loop_task", None)
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

        asyncio.run_coroutine_threadsafe(on_loop(), actor._loop_task.get_loop()).result(timeout=60)
        s = _io.StringIO()
        pstats.Stats(actor._bench_profile, stream=s).sort_stats("tottime").print_stats(top)
        del actor._bench_profile
        return s.getvalue()

    return ray.get(handle.__ray_call__.remote(stop, top), timeout=120)


# ------------------------------------------------------------------------------------------------ report
def _ratio(x: float, base: Optional[float]) -> str:
    return f"{x / base:,.1f}x" if base and x == x else "-"


def _met(ok: Optional[bool]) -> str:
    return "-" if ok is None else ("met" if ok else "NOT met")


def print_summary(rows) -> None:
    """rows: (measure, figure text, at what size, goal text, met, baseline text, ratio to baseline text)."""
    head = ("measure", "this run", "size", "goal", "", BASELINE_LABEL, "vs baseline")
    rows = [(*r[:4], _met(r[4]), *r[5:]) for r in rows]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=9, help="GPU nodes (besides a head without GPUs); default 9")
    ap.add_argument("--gpus", type=int, default=8, help="logical GPUs per node; default 8")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients of phases 2-4; default 8")
    ap.add_argument("--single", type=int, default=150, help="submissions from one client; default 150")
    ap.add_argument("--multi", type=int, default=400, help="submissions from --clients clients; default 400")
    ap.add_argument("--backlog", type=int, default=800,
                    help="pending workloads when the churn starts (issue: thousands; the baseline's 2,900); "
                         "default 800")
    ap.add_argument("--churn-s", type=float, default=20.0, help="the churn's window in seconds; default 20")
    ap.add_argument("--burst", type=int, default=1500, help="burst of submissions (issue: 10,000); default 1500")
    ap.add_argument("--tick-s", type=float, default=1.0, help="the actor's slow tick (`raylane up`: 1 s)")
    ap.add_argument("--no-auth", action="store_true", help="run the control plane without authentication")
    ap.add_argument("--phase-timeout", type=float, default=900.0,
                    help="seconds any one phase may take before its clients stop; default 900")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the control actor through the churn and the burst, print its top functions")
    args = ap.parse_args(argv)
    for name in ("nodes", "gpus", "clients", "single", "multi", "burst"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: got {getattr(args, name)}; allowed: at least 1")
    if args.backlog < 0 or args.churn_s <= 0:
        ap.error(f"--backlog {args.backlog} / --churn-s {args.churn_s:g}: allowed: a backlog >= 0, a window > 0")

    import ray

    from raylane.control.client import ControlClient, start_control, stop_control
    from tests.raytest import local_policy, start_cluster, stop_cluster

    total_gpus = args.nodes * args.gpus
    print(f"bench_live: {args.nodes} nodes x {args.gpus} logical GPUs ({total_gpus} GPUs) and a head without GPUs; "
          f"1-GPU {CLASS} gangs of team {TEAM} (nominal quota {total_gpus} GPUs); sizes: --single {args.single}, "
          f"--multi {args.multi} from --clients {args.clients}, --backlog {args.backlog} with --churn-s "
          f"{args.churn_s:g}, --burst {args.burst} (issue: 10,000 burst, backlog in the thousands); "
          f"auth {'off' if args.no_auth else 'on'}, tick {args.tick_s:g} s", flush=True)
    print(f"{BASELINE_LABEL}, same shape of cluster (reference, not measured here):")
    for what, fig in BASELINE_ROWS:
        print(f"  {what:<42} {fig}")
    print(f"goals: >= {GOALS['multi']:.0f} submissions/s from 8 clients, >= {GOALS['admissions']:.0f} admissions/s "
          f"with placement groups, no stall over {GOALS['stall_s']:g} s, `raylane queue` under {GOALS['queue_s']:g} s "
          f"at 10,000 entries", flush=True)

    workdir = tempfile.mkdtemp(prefix="raylane-bench-live-")
    cluster = None
    t_start = time.perf_counter()
    try:
        t0 = time.perf_counter()
        cluster = start_cluster(gpu_nodes=tuple((f"gpu-{i}", ["gpu-sim"]) for i in range(args.nodes)),
                                gpus=args.gpus, cpus=max(1, args.gpus), head_cpus=2)
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        policy = local_policy()
        policy["teams"] = {TEAM: {"quotas": {"gpu": {"nominal": total_gpus}}}}
        ctl = start_control(policy, os.path.join(workdir, "journal.db"), tick_s=args.tick_s,
                            auth_enabled=not args.no_auth)
        handle, cred = ctl.handle, ctl.credential
        clients = [ControlClient(handle, cred, timeout=120.0) for _ in range(args.clients)]
        info = ctl.info
        if info()["nodes"] < args.nodes:
            raise RuntimeError(f"the control plane sees {info()['nodes']} nodes, not {args.nodes}")
        print(f"cluster and control actor up in {time.perf_counter() - t0:.1f} s; scheduler "
              f"{policy['scheduler']['ordering']}/{policy['scheduler']['admission']}, at most "
              f"{policy['scheduler']['max_admissions_per_cycle']} admissions per cycle", flush=True)
        live: Dict[str, float] = {}  # workload id -> its submit time, for every workload not ended

        def report_submits(what: str, s: Submitted) -> None:
            live.update(s.ids)
            print(f"{what}: {len(s.done)} of {s.asked} answered in {s.seconds:.2f} s, {s.rate:,.1f} /s; "
                  f"errors {len(s.errors)}" + (f" (first: {s.errors[0]})" if s.errors else ""), flush=True)

        # 1-2. Submission rates.
        one = submit_many(clients[:1], args.single, "one-", args.phase_timeout)
        report_submits("1. submissions, 1 client", one)
        multi = submit_many(clients, args.multi, "multi-", args.phase_timeout)
        report_submits(f"2. submissions, {args.clients} clients", multi)

        profiling = False
        if args.profile:
            profile_start(handle)
            profiling = True
        monitor_ctl = ControlClient(handle, cred, timeout=120.0)
        with Monitor(monitor_ctl) as mon:
            # 3. Churn over a backlog.
            top_up = max(0, args.backlog - info()["pending"])
            if top_up:
                filled = submit_many(clients, top_up, "backlog-", args.phase_timeout)
                report_submits(f"3. backlog topped up with {top_up}", filled)
            order = sorted(live, key=lambda w: (live[w], w))
            ch = churn(clients, order, args.churn_s, info)
            c0, c1 = ch.t0, ch.t1
            ch.admitting_s = mon.drained_at(c0, c1, ch.pending_after) - c0
            for wid in ch.released:
                live.pop(wid, None)
            print(f"3. churn: backlog of {ch.pending_before} pending, {ch.seconds:.1f} s: {ch.admissions} admitted, "
                  f"{ch.admissions_rate:,.1f} admissions/s (over {ch.admitting_s:.1f} s, until the pending count "
                  f"reached {ch.pending_after}); {len(ch.released)} reservations placed and released, "
                  f"{ch.release_rate:,.1f} /s; {ch.pending_after} pending at the end; errors {len(ch.errors)}"
                  + (f" (first: {ch.errors[0]})" if ch.errors else ""), flush=True)
            print(f"   stalls during the churn: {mon.line(c0, c1)}", flush=True)
            pg_churn = placement_groups_vs_leases(ctl)
            print(f"   placement groups CREATED {pg_churn[0]}, leases {pg_churn[1]}, groups still pending "
                  f"{pg_churn[2]}: {'equal' if pg_churn[3] else 'NOT equal'}", flush=True)

            # 4. The burst.
            b0 = time.perf_counter()
            burst = submit_many(clients, args.burst, "burst-", args.phase_timeout)
            b1 = time.perf_counter()
            report_submits(f"4. burst of {args.burst}, {args.clients} clients", burst)
            first, last = burst.tenth_rates()
            print(f"   first 10%: {first:,.1f} /s, last 10%: {last:,.1f} /s (last / first {last / first:.2f})",
                  flush=True)
            print(f"   stalls during the burst: {mon.line(b0, b1)}", flush=True)
        if mon.errors:
            print(f"   the monitor's calls that failed: {len(mon.errors)} (first: {mon.errors[0]})")
        if profiling:
            profiling = False
            print("control actor, cProfile over the churn and the burst (by own time):\n"
                  + profile_stop(handle), flush=True)

        # 5. The queue, and the count after the burst.
        queue_ctl = ControlClient(handle, cred, timeout=max(600.0, args.phase_timeout))
        rows, q_s, render_s, chars = queue_timed(queue_ctl)
        shown = {r.id for r in rows}
        st = info()
        missing = [w for w in burst.ids if w not in shown]
        counted = (not burst.errors and len(burst.ids) == args.burst and not missing and shown == set(live)
                   and st["pending"] + st["leases"] == len(live))
        print(f"4. count: {len(burst.ids)} ids answered of {args.burst}, {len(missing)} of them missing from "
              f"queue(); queue() {len(rows)} entries, {len(live)} live expected "
              f"({len(shown - set(live))} unexpected, {len(set(live) - shown)} missing); info(): "
              f"{st['pending']} pending + {st['leases']} leases; errors {len(burst.errors)}: "
              f"{'all accounted for' if counted else 'NOT accounted for'}", flush=True)
        print(f"5. raylane queue at {len(rows):,} entries: queue() {q_s:.2f} s, the CLI's table {render_s:.2f} s "
              f"({chars:,} characters), together {q_s + render_s:.2f} s", flush=True)
        pg_end = placement_groups_vs_leases(ctl)
        print(f"   at the end: placement groups CREATED {pg_end[0]}, leases {pg_end[1]}, groups still pending "
              f"{pg_end[2]}: {'equal' if pg_end[3] else 'NOT equal'}", flush=True)

        stall = max([lat for _, lat, _ in mon.samples] or [float("nan")])
        queue_total = q_s + render_s
        scale = f"{len(rows):,} entries"
        print(f"summary ({os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} now: above the CPU count, "
              f"every figure includes waiting for a CPU):")
        print_summary([
            ("submissions/s, 1 client", f"{one.rate:,.1f} /s", f"{len(one.done)}", "", None,
             f"{BASELINE['single']:g} /s", _ratio(one.rate, BASELINE["single"])),
            (f"submissions/s, {args.clients} clients", f"{multi.rate:,.1f} /s", f"{len(multi.done)}",
             f">= {GOALS['multi']:.0f} /s", multi.rate >= GOALS["multi"], f"{BASELINE['multi']:g} /s",
             _ratio(multi.rate, BASELINE["multi"])),
            ("burst", f"{burst.rate:,.1f} /s", f"{len(burst.done):,} (first 10% {first:,.0f}/s, last "
             f"{last:,.0f}/s)", "", None, f"{BASELINE['burst']:g} /s (10,000)", _ratio(burst.rate, BASELINE["burst"])),
            ("admissions/s with placement groups", f"{ch.admissions_rate:,.1f} /s",
             f"backlog {ch.pending_before:,}", f">= {GOALS['admissions']:.0f} /s",
             ch.admissions_rate >= GOALS["admissions"], f"{BASELINE['admissions']:g} /s (2,900)",
             _ratio(ch.admissions_rate, BASELINE["admissions"])),
            ("longest stall (churn and burst)", f"{stall:.2f} s", f"{len(mon.samples)} calls",
             f"<= {GOALS['stall_s']:g} s", stall <= GOALS["stall_s"], "", "-"),
            ("raylane queue (call + table)", f"{queue_total:.2f} s", scale, f"< {GOALS['queue_s']:g} s (10,000)",
             queue_total < GOALS["queue_s"] if len(rows) >= 10_000 else None, f"{BASELINE['queue_s']:g} s (13,000)",
             f"{BASELINE['queue_s'] / max(queue_total, 1e-9):,.1f}x faster"),
        ])
        print(f"  checks: burst accounted for: {counted}; placement groups = leases after the churn: {pg_churn[3]}, "
              f"at the end: {pg_end[3]}; errors: {len(one.errors) + len(multi.errors) + len(ch.errors) + len(burst.errors)}"
              f" (monitor {len(mon.errors)})", flush=True)
    finally:
        try:
            if ray.is_initialized():
                stop_control()
        except Exception as exc:  # noqa: BLE001 - the cluster goes anyway
            print(f"stopping the control actor: {type(exc).__name__}: {exc}")
        if cluster is not None:
            stop_cluster(cluster)
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"bench_live: {time.perf_counter() - t_start:.1f} s in all", flush=True)


if __name__ == "__main__":
    main()
