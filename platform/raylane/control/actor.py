"""The control actor: one detached, named Ray actor, a thin shell around the control plane's state machine.

The logic (queue, leases, quotas, the journal, checkpoint pins, pipelines, nodes, the gate) is
``raylane.control.state.ControlState``, which imports no Ray. This actor:
- runs its loop: a full tick every ``tick_s`` and, in between, a cycle alone when a change wants one;
- answers ``request(credential, call, args)``, the one entry point besides ``ping``: the gate checks the call
  (arguments, credential, authorization; a refusal is audited and raised), the state machine runs it, and nothing is
  answered before what it changed is on disk (group commit: the requests of one turn of the event loop share one
  commit). The state machine is an attribute (``cs``), not methods of this class, and Ray's own ways in are
  refused (``Sealed``, below), so no *method* reached through the handle goes around ``request()``;
- reads Ray for it (``RayHost``: the node table, drain notices, the job table, placement groups) and runs its queue
  forecasts on a thread of their own (``RayHost.forecast``);
- carries out its effects (``raylane.control.effects``) after committing the journal entries that decided them:
  placement groups reserved (and reported placed or failed) and removed, gangs killed, jobs stopped, MLflow runs
  closed, health probes run, drivers waiting for their admission woken (each wait bounded and woken on its own:
  ``raylane.control.waits``). Ray's placement-group calls are synchronous
  round trips to the GCS, so they run on threads of their own (``PlacementGroups``), never on the loop.

Restarted (it is created with ``max_restarts=-1``), it replays the journal: a lease whose reservation is gone goes
back to the queue at its original submit time.

Sealed against Ray's own back doors (``Sealed``). Ray gives every actor class two methods of its own (``ray.actor.
_modify_class`` subclasses the class): ``__ray_call__(fn)`` runs any function inside the actor, and
``__ray_terminate__`` ends it for good (an intentional exit, which ``max_restarts`` does not cover). Both are
replaced here, on the class and on the subclass Ray makes, by methods that refuse and write an audit row: tokens,
roles and the journal change only through ``request()``. What the actor cannot refuse is ``ray.kill(handle)``
(the GCS ends the process): ``ControlWatch``, a second detached actor, starts the control plane again from its
journal when it is gone, and the restarted actor journals an audit row saying so. Ray deserializes every task's
arguments with pickle before the method runs: a caller that crafted them (an object whose ``__reduce__`` names a
function) would run code here without any method. The first thing the actor does is guard that
(``raylane.control.unpickle``): in this process Ray's pickles resolve plain data types and exception classes only,
anything else is refused before it is called and audited. What that leaves open (the GCS's key-value store, the
journal file): docs/security.md ("Code inside the cluster").
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import zlib
from typing import Any, Dict, List, Optional

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from raylane.control import api
from raylane.control import checkpoints as ckrefs
from raylane.control import effects as fx
from raylane.control import ends, unpickle
from raylane.control.journal import Journal
from raylane.control.host import Host
from raylane.control.waits import TooManyRequestsError, Waits

log = logging.getLogger("raylane.control")

# Between full ticks, cycles run on changes no closer together than this (ControlActor._loop).
CYCLE_SPACING_S = 0.02
# Threads that make and remove placement groups (PlacementGroups): each call is a synchronous round trip to the GCS.
PG_THREADS = 2


class RayHost(Host):
    """The control plane's view of Ray (``raylane.control.state.Host``)."""

    def __init__(self):
        self._jobs_client = None  # ray.job_submission.JobSubmissionClient, made at first use
        self._forecasts: Optional[concurrent.futures.ThreadPoolExecutor] = None  # forecast's thread, made at first use

    def nodes(self) -> List[Dict[str, Any]]:
        return ray.nodes()

    def draining(self) -> Dict[str, int]:
        try:
            from ray._private.state import state as ray_state

            return ray_state.get_draining_nodes()
        except Exception:  # noqa: BLE001 - an older GCS without drain support: nothing is draining
            return {}

    def jobs(self):
        """Ray's jobs API, one client kept (making one asks the dashboard for its version first)."""
        if self._jobs_client is None:
            from ray.job_submission import JobSubmissionClient

            self._jobs_client = JobSubmissionClient("http://" + ray._private.worker.get_dashboard_url())
        return self._jobs_client

    def job_table(self) -> Optional[Dict[str, str]]:
        try:
            return {j.submission_id: str(j.status) for j in self.jobs().list_jobs() if j.submission_id}
        except Exception:  # noqa: BLE001 - no dashboard or no answer: asked again, from a new client, next time
            self._jobs_client = None
            return None

    def placement_groups(self) -> Dict[str, str]:
        return {v["name"]: v.get("state", "") for v in placement_group_table().values()
                if v.get("state") != "REMOVED" and v.get("name")}

    def forecast(self, run, done) -> None:
        """On a thread of its own, ``done`` called back on the loop: the GIL changes hands every few ms, so the loop
        keeps answering (on the loop, a plan of thousands pending stalled it for a second or more). A forecast that
        fails is logged and gives None (the ETAs before it stay)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the loop (no caller does this now): at once, as the base host does
            return super().forecast(run, done)
        if self._forecasts is None:
            self._forecasts = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raylane-forecast")

        def advice():
            try:
                return run()
            except Exception:  # noqa: BLE001 - a forecast is advice: the queue goes on without it
                log.exception("queue forecast failed")
                return None

        # Timed as the base host times it, on this thread; its answer goes back to the loop.
        self._forecasts.submit(super().forecast, advice, lambda *got: loop.call_soon_threadsafe(done, *got))


class PlacementGroups:
    """Ray's placement-group calls, made off the actor's event loop.

    ``placement_group()`` and ``remove_placement_group()`` are synchronous round trips to the GCS (about 1.4 ms each
    on 2 busy cores, more under load), during which a loop that made them would answer nothing and run no cycle.
    They run here on ``threads`` threads of their own (Ray releases the GIL while it waits for the GCS). All the
    calls for one group name run on one thread, in the order they were asked for: a group is made before it is
    removed, and removed before a group of the same name (a resized lease's) is made again. The handles made are
    kept by name for the removal; each name is only ever touched from its own thread."""

    def __init__(self, threads: int = PG_THREADS):
        self._threads = [concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"raylane-pg-{i}")
                         for i in range(threads)]
        self._handles: Dict[str, Any] = {}  # group name -> the handle made here (Ray looks others up by name)

    def _thread(self, name: str) -> concurrent.futures.ThreadPoolExecutor:
        return self._threads[zlib.crc32(name.encode()) % len(self._threads)]

    def make(self, e: fx.Reserve) -> "concurrent.futures.Future":
        """Create ``e``'s detached group, one bundle per worker pinned to its node: a future of its handle, or of
        the error that stopped it."""
        def make_it():
            pg = placement_group([e.bundle] * len(e.placement), strategy=e.strategy, name=e.pg_name,
                                 lifetime="detached",
                                 bundle_label_selector=[{"ray.io/node-id": nid} for nid in e.placement])
            self._handles[e.pg_name] = pg
            return pg

        return self._thread(e.pg_name).submit(make_it)

    def remove(self, name: str, made: Any = None) -> "concurrent.futures.Future":
        """Remove the group ``name`` (gone already: nothing to do); with ``made``, only that handle (a failed
        reservation's, which a newer group of the same name must outlive)."""
        def remove_it():
            pg = self._handles.get(name)
            if made is not None:
                if pg is made:
                    del self._handles[name]
                pg = made
            else:
                self._handles.pop(name, None)
            try:
                remove_placement_group(pg if pg is not None else ray.util.get_placement_group(name))
            except Exception:  # noqa: BLE001 - already removed, or never made
                pass

        return self._thread(name).submit(remove_it)


# Ray's own methods of every actor (ray.actor._modify_class) that run code in it or end it: refused (Sealed).
SEALED = ("__ray_call__", "__ray_terminate__")
# How often the watcher (ControlWatch) looks for the control actor, and how long a start may take.
WATCH_S = 2.0


async def _refuse_ray_call(self, fn: Any = None, *args: Any, **kwargs: Any) -> Any:
    """Ray's ``__ray_call__`` (run ``fn`` inside this actor): refused, and audited."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"[:200]
    _refused(self, "__ray_call__", f"code sent through Ray's actor handle ({name!r}) does not run in the control "
                                   f"plane: every call goes through request()")


async def _refuse_ray_terminate(self) -> None:
    """Ray's ``__ray_terminate__`` (end this actor for good): refused, and audited."""
    _refused(self, "__ray_terminate__", "the control plane is not stopped through its actor handle: `raylane down` "
                                        "stops it (raylane.control.client.stop_control)")


def _refused(actor: Any, what: str, reason: str) -> None:
    from raylane.errors import PermissionDeniedError

    shell = getattr(actor, "shell", None)  # the watcher has none: its refusals are logged
    if shell is not None:
        shell.audit(what, "refused", reason)
    else:
        log.warning("%s refused: %s", what, reason)
    raise PermissionDeniedError(f"{what}: refused: {reason}")


class Sealed(type):
    """The metaclass of the control plane's actor classes: Ray's ``__ray_call__`` and ``__ray_terminate__`` are
    replaced by refusals on the class and on every subclass, the one Ray makes of it included (Ray 2.60 adds its
    methods in a subclass, ``ray.actor._modify_class``, which would otherwise win over methods of the class)."""

    def __init__(cls, name, bases, ns, **kw):
        super().__init__(name, bases, ns, **kw)
        cls.__ray_call__ = _refuse_ray_call
        cls.__ray_terminate__ = _refuse_ray_terminate


class ControlActor(metaclass=Sealed):
    """The Ray actor class: ``request`` and ``ping`` are all Ray exposes (Ray makes every method of an actor class
    callable through its handle, so the shell's own methods live in ``ControlShell``); Ray's ``__ray_call__`` and
    ``__ray_terminate__`` are refused and audited (``Sealed``)."""

    def __init__(self, policy: Dict[str, Any], journal_path: str, tick_s: float = 1.0,
                 admit_timeout_s: float = 30.0, auth: Optional[Dict[str, Any]] = None,
                 cancel_grace_s: float = ends.CANCEL_GRACE_S, cluster: Optional[Dict[str, Any]] = None):
        """``auth``, ``cluster``: see ``ControlState``."""
        unpickle.install()  # from here on, a call's pickled arguments are plain data or refused
        restarted = _restart_cause(auth)
        if auth is not None:
            auth = {k: v for k, v in auth.items() if k != "restarted_by"}
        self.shell = ControlShell(policy, journal_path, tick_s, admit_timeout_s, auth, cancel_grace_s, cluster)
        if restarted:
            self.shell.audit("control-restart", "recovered", restarted)

    async def request(self, credential: Any, call: Any, args: Any = None) -> Any:
        """The one entry point (``ControlShell.request``)."""
        return await self.shell.request(credential, call, args)

    async def ping(self) -> bool:
        self.shell._ensure_loop()
        return True


class ControlShell:
    """The actor's work: its loop, requests, and carrying out the state machine's effects."""

    def __init__(self, policy: Dict[str, Any], journal_path: str, tick_s: float, admit_timeout_s: float,
                 auth: Optional[Dict[str, Any]], cancel_grace_s: float, cluster: Optional[Dict[str, Any]] = None):
        self.tick_s = tick_s
        self.admit_timeout_s = admit_timeout_s
        self.host = RayHost()
        # Group commit: one commit per turn of the event loop (_durable), and before each effect (_carry_out).
        from raylane.control.state import ControlState  # here: see raylane.control.host

        self.cs = ControlState(policy, Journal(journal_path, batched=True), self.host, time.time, tick_s, auth,
                               cancel_grace_s, cluster)
        self._commit_waiters: Optional[asyncio.Future] = None
        self._wake: Optional[asyncio.Event] = None
        self.waits = Waits()  # open wait_admission calls, bounded (raylane.control.waits)
        self._loop_task: Optional[asyncio.Task] = None
        self.pgs = PlacementGroups()
        self._carry_out()  # what recovery and the bootstrap decided

    def audit(self, what: str, outcome: str, reason: str) -> None:
        """An audit row with no principal (Ray says not who called), committed at once."""
        self.cs.gate.record(None, what, "@control", outcome, reason, now=time.time())
        self.cs.journal.commit()

    # ------------------------------------------------------------------------------------------- requests
    async def request(self, credential: Any, call: Any, args: Any = None) -> Any:
        """The one entry point: check the call, wait for an admission if it asks to, run it in the state machine;
        answer once what it changed is on disk and its effects are under way."""
        self._ensure_loop()
        cs = self.cs
        try:
            p, req = cs.check(credential, call, args)
            if isinstance(req, api.WaitAdmission) and cs.awaits_admission(req.workload_id):
                await self._wait_admission(p, req)
            out = cs.handle(p, req)
        finally:
            await self._durable()
            self._carry_out()
        return out

    async def _wait_admission(self, p, req: api.WaitAdmission) -> None:
        """Hold the call until the workload is woken (``fx.Wake``) or its timeout passes. Past a bound on open waits
        (``raylane.control.waits``) it is refused at once, audited (identical refusals share a row)."""
        # Authentication off: every caller is the same anonymous operator, so no bound per credential.
        key = p.token_id if self.cs.gate.enabled else None
        try:
            await self.waits.wait(key, req.workload_id, req.timeout_s)
        except TooManyRequestsError as exc:
            self.cs.gate.record(p, "wait_admission", req.workload_id, "refused", f"{type(exc).__name__}: {exc}",
                                now=self.cs.clock())
            raise

    # ---------------------------------------------------------------------------------------------- commit
    async def _durable(self) -> None:
        """Wait until the journal's pending entries are committed. The requests that journaled in the same turn of
        the event loop share one commit (group commit): a burst of submissions costs one fsync per turn."""
        if not self.cs.journal.pending:
            return
        if self._commit_waiters is None:
            loop = asyncio.get_running_loop()
            self._commit_waiters = loop.create_future()
            loop.call_soon(self._group_commit)
        await asyncio.shield(self._commit_waiters)

    def _group_commit(self) -> None:
        waiters, self._commit_waiters = self._commit_waiters, None
        try:
            self.cs.journal.commit()
        except Exception as exc:  # noqa: BLE001 - each waiting request fails with it
            waiters.set_exception(exc)
            return
        waiters.set_result(None)

    # --------------------------------------------------------------------------------------------- effects
    def _carry_out(self) -> None:
        """Commit what the state machine journaled, then do what it decided, in order."""
        effects = self.cs.take_effects()
        if self.cs.wants_cycle and self._wake is not None:  # before the loop starts, its first tick runs anyway
            self.cs.wants_cycle = False
            self._wake.set()
        if not effects:
            return
        self.cs.journal.commit()  # journal first, then act
        for e in effects:
            try:
                self._do(e)
            except Exception:  # noqa: BLE001 - one failed effect must not stop the others; logged
                log.exception("effect %s failed", e)

    def _do(self, e: fx.Effect) -> None:
        if isinstance(e, fx.Reserve):
            self._spawn(self._confirm(e, self.pgs.make(e)))
        elif isinstance(e, fx.RemoveReservation):
            self.pgs.remove(e.pg_name)
        elif isinstance(e, fx.KillWorkers):
            for h in e.handles:
                try:
                    ray.kill(h, no_restart=True)
                except Exception:  # noqa: BLE001 - already dead
                    pass
        elif isinstance(e, fx.StopJob):
            try:
                self.host.jobs().stop_job(e.job_id)
            except Exception as exc:  # noqa: BLE001 - the job may be gone already
                log.info("stop_job %s: %s", e.job_id, exc)
        elif isinstance(e, fx.Wake):
            self.waits.wake(e.workload_id)
        elif isinstance(e, fx.RunProbes):
            self._spawn(self._probe_all(e))
        elif isinstance(e, ends.CloseRun):
            self._spawn(self._close_run(e))
        elif isinstance(e, fx.RequestNodes):
            # A GCS round trip (the coordinator is found by name): off the loop, on a thread of the default pool.
            asyncio.get_event_loop().run_in_executor(None, request_nodes, e)
        elif isinstance(e, fx.PinCheckpoint):  # hard links, quick: on the loop
            self.cs.pin_copied(e.workload_id, e.path, ckrefs.copy_pin(e.source, e.path))
        elif isinstance(e, fx.DropPin):
            ckrefs.drop_copy(e.path)
        else:
            raise TypeError(f"unknown effect {e!r}")

    def _spawn(self, coro) -> None:
        asyncio.get_event_loop().create_task(coro)

    async def _confirm(self, e: fx.Reserve, made: "concurrent.futures.Future") -> None:
        """Wait for ``e``'s group to be made (``PlacementGroups``), then placed; report it placed, or failed (and
        removed) when it could not be made or was not placed within the admission timeout."""
        try:
            pg = await asyncio.wrap_future(made)
        except Exception as exc:  # noqa: BLE001 - any failure to reserve is rolled back the same way
            self.cs.reservation_failed(e.workload_id, e.pg_name, f"placement group could not be created: {exc}")
            self._carry_out()
            return
        try:
            await asyncio.wait_for(pg.ready(), timeout=self.admit_timeout_s)
        except Exception as exc:  # noqa: BLE001
            self.pgs.remove(e.pg_name, made=pg)
            self.cs.reservation_failed(e.workload_id, e.pg_name,
                                       f"reservation not ready in {self.admit_timeout_s:g}s ({type(exc).__name__})")
        else:
            self.cs.reservation_ready(e.workload_id, e.pg_name)
        self._carry_out()

    async def _probe_all(self, e: fx.RunProbes) -> None:
        """Run the policy's probe on every node at once, pinned there, within its timeout."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from raylane.health import run_probe

        task = ray.remote(num_cpus=0, max_retries=0)(run_probe)
        refs = {nid: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
                                  name=f"raylane-probe-{nid[:8]}").remote(e.probe, e.conditions_dir, gpus)
                for nid, gpus in zip(e.node_ids, e.gpus)}

        async def one(nid, ref):
            try:
                return nid, await asyncio.wait_for(ref, timeout=e.timeout_s)
            except asyncio.TimeoutError:
                ray.cancel(ref, force=True)
                return nid, (False, f"the probe did not finish within {e.timeout_s:g}s")
            except ray.exceptions.TaskUnschedulableError:
                return nid, None  # Ray places no new work there: gone or draining, no verdict on its health
            except Exception as exc:  # noqa: BLE001 - the task could not run there: the node's verdict
                return nid, (False, f"the probe could not run: {type(exc).__name__}: {str(exc)[:200]}")

        verdicts: Dict[str, Any] = {}
        try:
            verdicts = dict(await asyncio.gather(*(one(n, r) for n, r in refs.items())))
        finally:
            self.cs.probed(verdicts)
            self._carry_out()

    async def _close_run(self, action: ends.CloseRun) -> None:
        """End the MLflow run a driver left open, in a task (MLflow is not imported here)."""
        note = None
        try:
            note = await _close_run_task.remote(action.uri, action.run_id, action.status, action.reason)
        except Exception as exc:  # noqa: BLE001 - the task died: tried again at the next watch
            log.warning("closing MLflow run %s of %s: %s", action.run_id, action.workload_id, exc)
        self.cs.run_closed(action.workload_id, note)
        await self._durable()
        self._carry_out()

    # ------------------------------------------------------------------------------------------------ loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_event_loop().create_task(self._loop())

    def _poke(self) -> None:
        self._ensure_loop()
        self._wake.set()

    async def _loop(self) -> None:
        """A full tick every ``tick_s``; in between, a change (a submission, a release) runs a cycle alone, at
        most one every ``CYCLE_SPACING_S``: the requests that arrive meanwhile are answered first, and a burst of
        them is scheduled by one cycle, not one each."""
        last_full = 0.0
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, last_full + self.tick_s - time.time()))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            full = time.time() - last_full >= self.tick_s
            try:
                unpickle.drain(self.audit)
                self.cs.tick(full=full)
                self.cs.journal.commit()
                self._carry_out()
            except Exception:  # the loop must survive a bad tick; the error is logged with its traceback
                log.exception("control loop tick failed")
            if full:
                last_full = time.time()
            await asyncio.sleep(CYCLE_SPACING_S)


def _restart_cause(auth: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why this actor is starting again, if it is: Ray restarted it (its process died or was killed with
    ``no_restart=False``), or the watcher started it after it was gone (``auth["restarted_by"]``)."""
    if (auth or {}).get("restarted_by"):
        return str(auth["restarted_by"])
    try:
        if ray.get_runtime_context().was_current_actor_reconstructed:
            return "Ray restarted the control actor (its process died or was killed); the journal was replayed"
    except Exception:  # noqa: BLE001 - outside an actor (a test): not a restart
        pass
    return None


WATCH_NAME = "raylane-control-watch"


class ControlWatch(metaclass=Sealed):
    """A detached actor that starts the control plane again when it is gone (``ray.kill(handle)`` ends an actor for
    good, whatever its ``max_restarts``). It keeps the control actor's creation arguments and nothing else: it
    holds no token, reads no journal, and answers only ``ping``; ``__ray_call__`` is refused (``Sealed``): a function
    run here could change the arguments the next control actor starts with. ``raylane down`` stops it first."""

    def __init__(self, start: Dict[str, Any], every_s: float = WATCH_S):
        import threading

        unpickle.install()
        # A thread running a module function: every method of an actor class is callable through its handle.
        self.starts = [0]
        threading.Thread(target=_watch_loop, args=(start, every_s, self.starts), name="raylane-control-watch",
                         daemon=True).start()

    def ping(self) -> int:
        """How many times it has started the control actor again."""
        return self.starts[0]


def _watch_loop(start: Dict[str, Any], every_s: float, starts: List[int]) -> None:
    from raylane.control.api import CONTROL_NAME, NAMESPACE

    while True:
        time.sleep(every_s)
        try:
            ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
            continue
        except ValueError:
            pass  # gone: no live actor has that name
        except Exception:  # noqa: BLE001 - the GCS did not answer: asked again next time
            continue
        try:
            starts[0] += 1
            handle = start_actor(start, restarted_by=f"the control actor was gone (stopped from outside Raylane, "
                                                     f"e.g. ray.kill); its watcher started it again "
                                                     f"(restart {starts[0]} by this watcher)")
            ray.get(handle.ping.remote(), timeout=300)
            log.warning("the control actor was gone: started again")
        except Exception:  # noqa: BLE001 - tried again at the next look
            log.exception("starting the control actor again failed")


def start_actor(start: Dict[str, Any], restarted_by: Optional[str] = None):
    """Create the detached control actor on the head node (or find it running) from its creation arguments
    ``start``: policy, journal, tick_s, admit_timeout_s, auth, cluster (``raylane.control.client.start_control``)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raylane.control.api import CONTROL_NAME, NAMESPACE

    auth = dict(start.get("auth") or {})
    if restarted_by:
        auth["restarted_by"] = restarted_by
    remote = ray.remote(ControlActor).options(
        name=CONTROL_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, num_cpus=0, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(_head_node_id(), soft=False),
        # Ray starts worker processes at nice 15 (its worker_niceness), below the jobs' drivers and every other
        # process on the head: the control plane that governs them runs at the default priority, as Ray's own
        # job supervisors do (ray.dashboard.modules.job.job_manager).
        runtime_env={"env_vars": {"RAY_worker_niceness": "0"}},
    )
    return remote.remote(start["policy"], start["journal"], start["tick_s"], start["admit_timeout_s"], auth,
                         cluster=start.get("cluster"))


def start_watch(start: Dict[str, Any]):
    """The watcher of the control actor (``ControlWatch``), created detached on the head node, or found running."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raylane.control.api import NAMESPACE

    return ray.remote(ControlWatch).options(
        name=WATCH_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, max_restarts=-1,
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(_head_node_id(), soft=False),
    ).remote(start)


def _head_node_id() -> str:
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return n["NodeID"]
    return ray.get_runtime_context().get_node_id()


# The requester id under which the control plane's ask reaches Ray's autoscaling coordinator.
REQUESTER_ID = "raylane-control"


def request_nodes(e: fx.RequestNodes) -> None:
    """Carry out ``e`` through Ray's autoscaling coordinator, which merges the asks of every requester on the
    cluster (Ray Data and Ray Train ask through it too) into one ``ray.autoscaler.sdk.request_resources`` call. A
    direct call would be overwritten by the coordinator's own within its next tick (20 s) once it exists."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:  # a Ray without the coordinator: no other requester to merge with
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[dict(b) for b in e.bundles],
                          bundle_label_selectors=[dict(s) for s in e.selectors] if e.bundles else None)
        return
    try:
        coordinator = get_or_create_autoscaling_coordinator()
        if e.bundles:
            coordinator.request_resources.remote(requester_id=REQUESTER_ID, resources=[dict(b) for b in e.bundles],
                                                 expire_after_s=e.expire_s,
                                                 label_selectors=[dict(s) for s in e.selectors])
        else:
            coordinator.cancel_request.remote(REQUESTER_ID)
    except Exception:  # noqa: BLE001 - asked again at the next renewal; logged
        log.exception("asking the autoscaler for %d bundles failed", len(e.bundles))


@ray.remote(num_cpus=0, max_retries=0)
def _close_run_task(uri: Optional[str], run_id: str, status: str, reason: str) -> str:
    from raylane.tracking import close_run

    return close_run(uri, run_id, status, reason)
