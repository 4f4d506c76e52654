"""The serving driver: a Ray Serve application whose replicas hold their GPUs under leases from the control actor,
so that a traffic burst reclaims GPUs from preemptible training and a lull gives them back.

Ray never preempts to make room, so the driver turns a replica shortfall into queue demand the scheduling core
understands: one ``serving``-class workload per replica (``<app>-replica-<n>``, a gang of one worker of the
replica's resources, the spec's team). The core admits it on free capacity, or preempts the cheapest preemptible
training of that team (or of teams that borrow) for it, which checkpoints and yields first; non-preemptible work and
other teams' in-quota work are never candidates. Once the lease's reservation is ready the driver hands it over
(``report running``: the reservation placement group goes, the ledger keeps the capacity counted) and asks Serve
for one more replica (Serve's external-scaler API: the app runs with ``external_scaler_enabled=True`` and its
built-in autoscaler off). Scale-down goes the other way: Serve stops a replica, and once its actor is gone the
lease is released and the training that waits is admitted again.

Ray never has to guess where a replica goes: each replica also needs one unit of the app's *slot* resource
(``raylane_serve_<app>``), which exists only on nodes where the driver holds a lease, as many as it holds there.
The driver sets it with the GCS's resize call (``GcsClient.resize_raylet_resource_instances``, internal: what
KubeRay uses for in-place resizes) before scaling up, and lowers it once a replica is gone.

The autoscaling decision is the driver's own (``raylane.launchers.autoscale``): it reads each running replica's
ongoing requests (the replica actor's ``get_num_ongoing_requests``, which Serve's routers probe too; it runs in its
own concurrency group, so a busy replica still answers) and aims at ``target_ongoing_requests`` per replica, with
the spec's up- and down-scale delays. A lease goes back only after it has been held for the downscale delay, so
a reclaimed GPU is not returned by the next lull; that training is not preempted again before its class's minimum
runtime is the core's rule.

What runs in each replica is the user's code: ``serve.model.deployment`` names a Ray Serve deployment or a plain
class, and every replica constructs it with ``serve.model.args`` as keyword arguments. ``load_deployment`` imports
it and checks the args (against the class's ``config_schema`` when it declares one, and against its constructor)
before the app registers, so nothing queues for a deployment that cannot start. The driver knows no deployment by
name: the reference LM server is one among others, named by its spec.

Words
- *app*: the Serve application, named after the spec; its own workload record (no resources, class of the spec)
  carries the job id and shows the replica counts as its detail in ``raylane queue``.
- *lease*: one replica's workload record. pending (submitted) -> held (handed to Serve) -> released.
- *demand*: the moment a lease is submitted; *serving*: the moment the replica it paid for is RUNNING.
- *slot*: a unit of the app's custom resource on a node; replicas need one each.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import ray

from raylane import entrypoints, metrics
from raylane.config.loader import MISSING, load_spec_from_dict
from raylane.config.serve import ServeModelSpec
from raylane.control.api import EndState, Outcome
from raylane.control.journal import Kind
from raylane.control.records import TERMINAL, State
from raylane.control.state import GiB
from raylane.errors import RetryableError, ValidationError
from raylane.launchers.autoscale import Autoscaling, ReplicaScaler, pick_release

__all__ = ["run_serving", "ServingDriver", "ReplicaLease", "slot_resource", "load_deployment"]

log = logging.getLogger("raylane.serve")

GRACEFUL_SHUTDOWN_S = 10.0
MAX_STEP_FAILURES = 20
_TRANSIENT = (RetryableError, ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError)
DEPLOYMENT_FIELD = "serve.model.deployment"
ARGS_FIELD = "serve.model.args"


def slot_resource(app: str) -> str:
    return "raylane_serve_" + "".join(c if c.isalnum() else "_" for c in app)


@dataclass
class ReplicaLease:
    wid: str
    index: int
    demand_at: float
    state: str = "pending"  # pending -> held -> released (or cancelled while pending)
    node: Optional[str] = None
    granted_at: Optional[float] = None
    serving_at: Optional[float] = None
    released_at: Optional[float] = None
    replica_id: Optional[str] = None
    reclaimed_from: List[str] = field(default_factory=list)
    reclaimed_gpus: float = 0.0
    reason: str = ""

    @property
    def path(self) -> str:
        return "reclaim" if self.reclaimed_from else "free"

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__, path=self.path)


class NodeSlots:
    """The app's slot resource per node, as this driver sets it (it is the only writer)."""

    def __init__(self, resource: str):
        self.resource = resource
        self.count: Counter = Counter()
        self._gcs = None

    def _client(self):
        if self._gcs is None:
            from ray._raylet import GcsClient

            self._gcs = GcsClient(address=ray.get_runtime_context().gcs_address)
        return self._gcs

    def set(self, node: str, n: int) -> None:
        self.count[node] = n
        self._client().resize_raylet_resource_instances(node, {self.resource: float(n)})

    def open(self, node: str) -> None:
        self.set(node, self.count[node] + 1)

    def close(self, node: str) -> None:
        self.set(node, max(0, self.count[node] - 1))

    def close_all(self) -> None:
        for node, n in list(self.count.items()):
            if n:
                try:
                    self.set(node, 0)
                except Exception as exc:  # noqa: BLE001 - a node gone: nothing left to close
                    log.info("slot %s on %s: %s", self.resource, node[:8], exc)


class ServingDriver:
    """One serving workload from deploy to shutdown. ``run()`` loops; ``leases`` is what happened to each replica."""

    def __init__(self, spec: Dict[str, Any], *, ctl, job_id: Optional[str] = None, poll_s: float = 0.5,
                 say: Callable[[str], None] = None):
        parsed = load_spec_from_dict(spec, f"spec {spec.get('name', '?')}")
        if parsed.serve is None:  # the spec validation guarantees it for kind: serve
            raise ValueError("run_serving needs a kind: serve spec")
        self.spec = parsed.model_dump(by_alias=True, mode="json", exclude_none=True)
        self.sv = parsed.serve
        self.ctl = ctl
        self.job_id = job_id
        self.poll_s = poll_s
        self.say = say or (lambda m: print(f"[raylane] {m}", flush=True))
        self.app = parsed.name
        self.team = parsed.team
        self.route = self.sv.route_prefix or f"/{self.app}"
        # Resolved and its args checked here, before start() registers anything: a bad deployment queues nothing.
        self.served = load_deployment(self.sv.model)
        self.deployment = self.sv.model.deployment.replace(":", ".").rsplit(".", 1)[1]
        self.auto = Autoscaling.from_spec(self.sv.autoscaling)
        self.scaler = ReplicaScaler(self.auto)
        self.slots = NodeSlots(slot_resource(self.app))
        self.leases: List[ReplicaLease] = []
        self.app_id: Optional[str] = None
        self.url: Optional[str] = None
        self.target = self.auto.min_replicas
        self.ongoing = 0.0
        self.running = 0
        self.restarts = 0
        self._serve_target = 0
        self._releasing = 0
        self._replicas: Dict[str, Dict[str, Any]] = {}  # replica id -> last details seen
        self._stopping: Dict[str, Dict[str, Any]] = {}  # replicas on their way out, until their actor is gone
        self._probes: Dict[str, Any] = {}
        self._detail = ""
        self._labels = {"app": self.app, "team": self.team}

    # --------------------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Register the app, hold ``min_replicas`` leases (reclaiming if it must), deploy the Serve application."""
        app_spec = dict(self.spec, gang={"workers": 1})
        rec = self.ctl.submit(app_spec, job_id=self.job_id)
        self.app_id = rec["id"]
        self.say(f"serving app {self.app} registered as {self.app_id} (job {self.job_id or '-'})")
        rec = self._wait_ready(self.app_id)
        self.ctl.running(self.app_id, job_id=self.job_id, note="serving driver started")
        metrics.SERVE_LATENCY_OBJECTIVE.set(self.sv.latency_objective_ms / 1000.0, **self._labels)
        for _ in range(self.auto.min_replicas):
            self._demand(time.time())
        deadline = time.time() + 600
        while any(l.state == "pending" for l in self.leases):
            if time.time() > deadline:
                raise TimeoutError(f"{self.app}: min_replicas leases not admitted in 600s")
            self._advance_pending(time.time())
            time.sleep(self.poll_s / 2)
        self._deploy()
        self._serve_target = self.held_count
        self.say(f"{self.app} serving at {self.url} with {self._serve_target} replica(s)")

    def run(self, stop: Optional[threading.Event] = None) -> Dict[str, Any]:
        """Deploy, then follow the traffic until ``stop`` is set or the app's workload is cancelled."""
        stop = stop or threading.Event()
        final: Optional[EndState] = EndState.SUCCEEDED
        try:
            self.start()
            next_status = 0.0
            failures = 0
            while not stop.is_set():
                now = time.time()
                try:
                    self.step(now)
                    failures = 0
                except _TRANSIENT as exc:
                    # The control actor restarting, or Serve's controller slow to answer: try again next poll.
                    failures += 1
                    log.warning("%s: step failed (%d in a row): %s", self.app, failures, exc)
                    if failures >= MAX_STEP_FAILURES:
                        raise
                if now >= next_status:
                    next_status = now + 2.0
                    if self.ctl.status(self.app_id)["state"] in TERMINAL:
                        final = None
                        break
                stop.wait(self.poll_s)
        except BaseException:
            final = EndState.FAILED
            raise
        finally:
            self.shutdown(final)
        return self.result()

    def shutdown(self, final: Optional[EndState]) -> None:
        """Delete the Serve app, give every lease back, close the slots, end the app's record with ``final``."""
        try:
            from ray import serve

            serve.delete(self.app)
        except Exception as exc:  # noqa: BLE001 - never deployed, or Serve gone
            log.info("serve.delete(%s): %s", self.app, exc)
        now = time.time()
        for l in self.leases:
            try:
                if l.state == "pending":
                    self.ctl.cancel(l.wid)
                    l.state = "cancelled"
                elif l.state == "held":
                    self.ctl.release(l.wid, Outcome.FINISHED, state=EndState.SUCCEEDED, detail="serving app shut down")
                    l.state, l.released_at = "released", now
            except Exception as exc:  # noqa: BLE001 - keep giving the others back
                log.warning("giving back %s: %s", l.wid, exc)
        self.slots.close_all()
        self._gauges()
        if self.app_id and final:
            detail = self._summary()
            self.ctl.release(self.app_id, Outcome.FINISHED if final is EndState.SUCCEEDED else Outcome.FAILED,
                             state=final, detail=detail)
            self.say(f"{self.app} shut down: {detail}")

    def result(self) -> Dict[str, Any]:
        rec = self.ctl.status(self.app_id) if self.app_id else {"id": None, "state": State.FAILED.value}
        return {"id": rec["id"], "state": rec["state"], "preemptions": rec.get("preemptions", 0),
                "restarts": self.restarts, "url": self.url, "leases": [l.as_dict() for l in self.leases]}

    @property
    def held_count(self) -> int:
        return sum(l.state == "held" for l in self.leases)

    # ----------------------------------------------------------------------------------------------- the loop
    def step(self, now: float) -> None:
        """One pass: observe Serve, decide, move leases, scale Serve."""
        self._observe(now)
        decision = self.scaler.observe(now, self.ongoing)
        self.target = decision.target
        pending = [l for l in self.leases if l.state == "pending"]
        committed = self.held_count - self._releasing + len(pending)
        if self.target > committed:
            for _ in range(self.target - committed):
                self._demand(now)
            self._event(f"wants {self.target} replicas ({decision.reason}); asked for "
                        f"{self.target - committed} more GPU lease(s)")
        elif self.target < committed:
            excess = committed - self.target
            for l in reversed(pending[-excess:]):  # the newest demands go first: they cost nothing yet
                self.ctl.cancel(l.wid)
                l.state = "cancelled"
                excess -= 1
            while excess > 0 and self._scale_down_one(now):
                excess -= 1
        self._advance_pending(now)
        self._sync_serve()
        self._gauges()
        self._report_detail()

    def _demand(self, now: float) -> ReplicaLease:
        index = len(self.leases)
        lease_spec = dict(self.spec, name=f"{self.app}-replica-{index}",
                          gang={"workers": 1, "resources": self.spec["serve"]["replica"]["resources"]},
                          run=dict(self.spec["run"], intent=f"replica {index} of {self.app}: "
                                                            f"{self.spec['run']['intent']}"))
        rec = self.ctl.submit(lease_spec, job_id=None)
        lease = ReplicaLease(rec["id"], index, now)
        self.leases.append(lease)
        return lease

    def _advance_pending(self, now: float) -> None:
        """Hand every admitted lease over to Serve: open a slot on its node and raise the Serve target."""
        for l in [l for l in self.leases if l.state == "pending"]:
            rec = self.ctl.wait_admission(l.wid, 0.01)
            if rec["state"] in TERMINAL:
                l.state = "cancelled"
                continue
            l.reason = rec.get("reason") or ""
            if not rec.get("ready") or not _pg_created(rec.get("pg_name")):
                continue
            # With the job id, a lease still held when the job ends (driver killed) is freed by the control actor's
            # job watch. Pending leases carry none: cancelling one must not stop the job.
            reply = self.ctl.running(l.wid, job_id=self.job_id,
                         note=f"replica of {self.app}: GPU handed to Ray Serve")
            if reply["state"] != State.RUNNING:
                continue
            l.state, l.node, l.granted_at = "held", rec["placement"][0], time.time()
            self._find_victims(l)
            self.slots.open(l.node)
            if l.reclaimed_from:
                self._event(f"replica {l.index} reclaimed {l.reclaimed_gpus:g} GPU(s) from "
                            f"{', '.join(l.reclaimed_from)} after {l.granted_at - l.demand_at:.1f}s")

    def _find_victims(self, lease: ReplicaLease) -> None:
        """The workloads the core preempted or shrank for ``lease`` (their journal names it), with the GPUs each
        gave: a whole gang's at the size it ran at, or the workers an elastic gang shrank by."""
        for row in self.ctl.queue():
            if not (row.get("preemptions") or row.get("resizes") or row.get("state") == State.RESIZING) \
                    or row["id"] == lease.wid:
                continue
            st = self.ctl.explain(row["id"])
            gpus = _gpus_given(st, lease.wid)
            if not gpus:
                continue
            lease.reclaimed_from.append(row["id"])
            lease.reclaimed_gpus += gpus
            labels = dict(self._labels, victim_team=st["team"])
            metrics.SERVE_RECLAIMS.inc(1, **labels)
            metrics.SERVE_RECLAIMED_GPUS.inc(gpus, **labels)

    def _scale_down_one(self, now: float) -> bool:
        """Lower the Serve target by one if a held lease may go back yet (held for the downscale delay)."""
        held = [(l.wid, l.granted_at) for l in self.leases if l.state == "held"]
        if self.held_count - self._releasing <= self.auto.min_replicas:
            return False
        # Leases already on their way out are not candidates again: count only the rest.
        ready = [h for h in held if now - h[1] >= self.auto.downscale_delay_s]
        if len(ready) <= self._releasing:
            return False
        self._releasing += 1
        self._event(f"scaling down to {self.held_count - self._releasing} replica(s)")
        return True

    def _sync_serve(self) -> None:
        want = self.held_count - self._releasing
        if want == self._serve_target:
            return
        from ray.serve._private.common import DeploymentID

        ctrl = _serve_controller()
        ray.get(ctrl.update_deployment_replicas.remote(DeploymentID(name=self.deployment, app_name=self.app), want),
                timeout=30)
        self._serve_target = want

    def _observe(self, now: float) -> None:
        """Replicas as Serve reports them; ongoing requests from the running ones; stopped replicas' leases."""
        replicas = _replica_details(self.app, self.deployment)
        seen = {r["replica_id"]: r for r in replicas}
        # A replica that left (or is stopping) gives its slot back once its actor is really gone.
        for rid, r in list(self._replicas.items()):
            if (rid not in seen or seen[rid]["state"] == "STOPPING") and rid not in self._stopping:
                self._stopping[rid] = r
        for rid, r in list(self._stopping.items()):
            if _actor_gone(r.get("actor_name")):
                del self._stopping[rid]
                self._replicas.pop(rid, None)
                self._probes.pop(r.get("actor_name"), None)
                self._replica_gone(r, now)
        for rid, r in seen.items():
            if r["state"] != "STOPPING":
                self._replicas[rid] = r
        running = [r for r in replicas if r["state"] == "RUNNING"]
        self.running = len(running)
        # New running replicas are the ones the oldest unserved leases paid for.
        known = {l.replica_id for l in self.leases if l.replica_id}
        waiting = sorted((l for l in self.leases if l.state == "held" and l.serving_at is None),
                         key=lambda l: l.granted_at)
        for r in running:
            if r["replica_id"] not in known and waiting:
                l = waiting.pop(0)
                l.replica_id, l.serving_at = r["replica_id"], now
                metrics.SERVE_DEMAND_TO_SERVING.observe(now - l.demand_at, path=l.path, **self._labels)
                if l.index >= self.auto.min_replicas:
                    self._event(f"replica {l.index} serving {now - l.demand_at:.1f}s after its demand ({l.path})")
        self.ongoing = self._probe(running)

    def _replica_gone(self, r: Dict[str, Any], now: float) -> None:
        node = r.get("node_id")
        if self._releasing <= 0:
            self.restarts += 1  # Serve replaces it; the lease stays held for the replacement
            for l in self.leases:
                if l.replica_id == r["replica_id"]:
                    l.replica_id = None
            return
        on_node = [(l.wid, l.granted_at) for l in self.leases if l.state == "held" and l.node == node]
        wid = pick_release(on_node, now, self.auto.downscale_delay_s) or pick_release(on_node, now, 0.0)
        if wid is None:
            return
        lease = next(l for l in self.leases if l.wid == wid)
        self._releasing -= 1
        self.slots.close(node)
        self.ctl.release(wid, Outcome.FINISHED, state=EndState.SUCCEEDED,
                         detail=f"replica scaled down after {now - lease.granted_at:.0f}s")
        lease.state, lease.released_at = "released", now
        self._event(f"replica lease {wid} given back after {now - lease.granted_at:.0f}s")

    def _probe(self, running: List[Dict[str, Any]]) -> float:
        refs = []
        for r in running:
            name = r.get("actor_name")
            h = self._probes.get(name)
            if h is None:
                try:
                    h = self._probes[name] = ray.get_actor(name, namespace=_serve_namespace())
                except ValueError:
                    continue
            refs.append(h.get_num_ongoing_requests.remote())
        total = 0.0
        for ref in refs:
            try:
                total += ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - a replica going away: its requests are retried elsewhere
                pass
        return total

    def _deploy(self) -> None:
        from ray import serve

        target = self.served
        opts = dict(
            name=self.deployment,
            num_replicas=self.held_count,
            max_ongoing_requests=self.sv.replica.max_ongoing_requests,
            ray_actor_options=self._actor_options(),
            graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
            graceful_shutdown_wait_loop_s=0.2,
            health_check_period_s=2.0,
        )
        dep = target.options(**opts) if isinstance(target, serve.Deployment) else serve.deployment(target, **opts)
        serve.run(dep.bind(**self.sv.model.args), name=self.app, route_prefix=self.route, external_scaler_enabled=True)
        self.url = _http_url(self.route)

    def _actor_options(self) -> Dict[str, Any]:
        r = self.sv.replica.resources
        opts: Dict[str, Any] = {"num_cpus": r.cpu, "num_gpus": r.gpu, "resources": {self.slots.resource: 1}}
        if r.memory:
            opts["memory"] = int(r.memory * GiB)
        # The replica's Python finds the repository's packages (workloads, raylane) as the driver does.
        path = os.environ.get("PYTHONPATH")
        if path:
            opts["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        return opts

    # ------------------------------------------------------------------------------------------ reporting
    def _wait_ready(self, wid: str) -> Dict[str, Any]:
        while True:
            rec = self.ctl.wait_admission(wid, 2.0)
            if rec["state"] in TERMINAL:
                raise RuntimeError(f"{wid} ended before it started: {rec['state']} {rec.get('reason', '')}")
            if rec.get("ready"):
                return rec

    def _event(self, note: str) -> None:
        log.info("%s: %s", self.app, note)
        if self.app_id:
            self.ctl.event(self.app_id, note=note)

    def _gauges(self) -> None:
        metrics.SERVE_REPLICAS_WANTED.set(self.target, **self._labels)
        metrics.SERVE_REPLICAS_RUNNING.set(self.running, **self._labels)
        metrics.SERVE_REPLICA_LEASES_PENDING.set(sum(l.state == "pending" for l in self.leases), **self._labels)
        metrics.SERVE_ONGOING_REQUESTS.set(self.ongoing, **self._labels)

    def _report_detail(self) -> None:
        pending = sum(l.state == "pending" for l in self.leases)
        reclaims = sum(bool(l.reclaimed_from) for l in self.leases)
        detail = (f"replicas {self.running} running / {self.target} wanted"
                  + (f", {pending} waiting for GPUs" if pending else "")
                  + f", {self.ongoing:g} ongoing, reclaims {reclaims}")
        if detail != self._detail:
            self._detail = detail
            self.ctl.event(self.app_id, detail=detail)

    def _summary(self) -> str:
        served = [l.serving_at - l.demand_at for l in self.leases if l.serving_at]
        reclaims = sum(bool(l.reclaimed_from) for l in self.leases)
        return (f"{len(self.leases)} replica lease(s), {reclaims} by reclaim; demand to serving "
                + (f"max {max(served):.1f}s" if served else "-"))


def run_serving(spec: Dict[str, Any], *, ctl, job_id: Optional[str] = None, stop: Optional[threading.Event] = None,
                poll_s: float = 0.5) -> Dict[str, Any]:
    """Serve ``spec`` (kind: serve) until the job is stopped, the app's workload is cancelled, or ``stop`` is set.

    Returns ``{"id", "state", "preemptions", "restarts", "url", "leases"}``: the app's record and what happened
    to each replica lease (demand, grant, serving and release times, what it reclaimed). A deployment that cannot be
    imported, or args that do not fit it, raise ``ValidationError`` before anything registers (``load_deployment``).
    """
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        # `ray job stop` sends SIGTERM: shut down cleanly (replicas drained, leases given back).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return ServingDriver(spec, ctl=ctl, job_id=job_id, poll_s=poll_s).run(stop)


# ------------------------------------------------------------------------------------------- Ray helpers

def _serve_namespace() -> str:
    from ray.serve._private.constants import SERVE_NAMESPACE

    return SERVE_NAMESPACE


def _serve_controller():
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME

    return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=_serve_namespace())


def _replica_details(app: str, deployment: str) -> List[Dict[str, Any]]:
    details = ray.get(_serve_controller().get_serve_instance_details.remote(), timeout=30)
    dep = details.get("applications", {}).get(app, {}).get("deployments", {}).get(deployment)
    return [dict(r, state=str(getattr(r["state"], "value", r["state"]))) for r in (dep or {}).get("replicas", [])]


def _http_url(route: str) -> str:
    details = ray.get(_serve_controller().get_serve_instance_details.remote(), timeout=30)
    http = details.get("http_options") or {}
    host = http.get("host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{host}:{http.get('port', 8000)}{route}"


def _actor_gone(name: Optional[str]) -> bool:
    if not name:
        return True
    try:
        ray.get_actor(name, namespace=_serve_namespace())
    except ValueError:
        return True
    return False


def _pg_created(name: Optional[str]) -> bool:
    if not name:
        return False
    for v in ray.util.placement_group_table().values():
        if v.get("name") == name and v.get("state") == "CREATED":
            return True
    return False


def _gpus_given(view: Dict[str, Any], wid: str) -> float:
    """GPUs the workload of ``view`` (an ``explain`` with its journal) gave up for ``wid``: its whole gang when it
    was preempted for it, the workers it shrank by when it was resized for it (an elastic gang). 0 when neither,
    or when the journal is not the caller's to read."""
    per = float(((view.get("spec") or {}).get("gang") or {}).get("resources", {}).get("gpu", 0) or 0)
    mark, workers, given = f"{wid} (", 0, 0.0
    for e in view.get("journal") or ():
        kind = e["kind"]
        if kind in (Kind.ADMITTED, Kind.RESIZED):
            workers = len(e.get("placement") or ())
        elif kind == Kind.PREEMPTING and f"preempted: {mark}" in (e.get("note") or ""):
            given += workers * per
        elif kind == Kind.RESIZING and e["to_workers"] < e["from_workers"] and f"for {mark}" in e.get("reason", ""):
            given += (e["from_workers"] - e["to_workers"]) * per
    return given


# ------------------------------------------------------------------------------------------- the deployment

def load_deployment(model: ServeModelSpec, *, working_dir: Optional[str] = None) -> Any:
    """The Ray Serve deployment or class ``model.deployment`` names, with ``model.args`` checked for it.

    The args are checked against the class's ``config_schema`` (a pydantic model, as entrypoints declare one) when it
    has one, then against its constructor: an argument it does not take, or one it requires and the spec leaves out.
    ``ValidationError`` naming ``serve.model.deployment`` or ``serve.model.args.<field>``, the value and what is
    allowed. ``working_dir``: where the user's code is, when not on the path already (the job's working directory
    is)."""
    with entrypoints.on_path(working_dir):
        target = _import_deployment(model.deployment)
    cls = _deployment_class(target)
    if cls is None:
        raise ValidationError("spec", [(DEPLOYMENT_FIELD, model.deployment,
                                        f"a class or a Ray Serve deployment of one, which every replica constructs "
                                        f"with serve.model.args; it names a {type(target).__name__}")])
    errors = []
    schema = entrypoints.config_schema(cls)
    if schema is not None:
        errors = [(_args_path(path), value, allowed)
                  for path, value, allowed in entrypoints.schema_errors(schema, model.args)]
    errors = errors or _constructor_errors(cls, model.args, model.deployment)
    if errors:
        raise ValidationError(f"serve.model.args of {model.deployment}", errors)
    return target


def _import_deployment(path: str) -> Any:
    module, attr = path.split(":", 1) if ":" in path else path.rsplit(".", 1)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or module
        if module == missing or module.startswith(missing + "."):
            why = (f"module {module!r} not found: run from the project's folder, submit with --working-dir, "
                   f"or install the package")
        else:  # the user's module was found but it imports something that is not installed
            why = f"importing {module!r} failed: it needs module {missing!r}, which is not installed"
        raise ValidationError("spec", [(DEPLOYMENT_FIELD, path, why)]) from None
    except Exception as exc:  # noqa: BLE001 - any error at import time is the user's code failing to load
        raise ValidationError("spec", [(DEPLOYMENT_FIELD, path, f"importing {module!r} failed: "
                                                                f"{type(exc).__name__}: {exc}")]) from None
    if not hasattr(mod, attr):
        known = sorted(n for n, v in vars(mod).items() if not n.startswith("_") and inspect.isclass(v)
                       and getattr(v, "__module__", None) == mod.__name__)
        raise ValidationError("spec", [(DEPLOYMENT_FIELD, path, f"module {module!r} has no {attr!r}; its classes: "
                                                                f"{', '.join(known[:20]) or '(none)'}")])
    return getattr(mod, attr)


def _deployment_class(target: Any) -> Optional[type]:
    """The class a replica constructs: ``target`` itself, or the class a Ray Serve deployment wraps."""
    from ray import serve

    if isinstance(target, serve.Deployment):
        target = target.func_or_class
    return target if inspect.isclass(target) else None


def _args_path(path: str) -> str:
    """``config.<field>`` (``entrypoints.schema_errors``' words) as the spec's path, ``serve.model.args.<field>``."""
    return ARGS_FIELD + path[len("config"):] if path == "config" or path.startswith("config.") else path


def _constructor_errors(cls: type, args: Dict[str, Any], path: str) -> List[tuple]:
    """What keeps ``cls(**args)`` from binding: unknown keyword arguments, required ones left out."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a class without a readable signature (C-implemented): let it be constructed
        return []
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    errors: List[tuple] = []
    if not takes_any:
        takes = f"{cls.__name__}() takes " + (", ".join(named) if named else "no arguments")
        errors += [(f"{ARGS_FIELD}.{k}", v, f"unknown argument; {takes}") for k, v in args.items() if k not in named]
    for n, p in params.items():
        if p.default is not p.empty or n in args:
            continue
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            errors.append((f"{ARGS_FIELD}.{n}", MISSING, f"required: {cls.__name__}() has no default for it"))
        elif p.kind is p.POSITIONAL_ONLY:
            errors.append((DEPLOYMENT_FIELD, path, f"{cls.__name__}() needs the positional-only argument {n!r}; "
                                                   f"replicas are constructed with keyword arguments only"))
    return errors
