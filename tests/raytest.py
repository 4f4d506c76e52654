"""Shared helpers for tests on a real Ray cluster: a small multi-node cluster and polling with deadlines."""
from __future__ import annotations

import contextlib
import copy
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 30.0, every: float = 0.2, what: str = "condition",
             explain: Optional[Callable[[], str]] = None) -> T:
    """``pred()`` once it is truthy; AssertionError after ``timeout`` seconds, with ``explain()`` if given."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})"
                         + (f"\n{explain()}" if explain is not None else ""))


def wait_while_progressing(pred: Callable[[], T], progress: Callable[[], object], stall: float = 120.0,
                           every: float = 2.0, what: str = "condition") -> T:
    """``pred()`` once it is truthy, waiting as long as ``progress()`` keeps changing: AssertionError once it has
    stayed the same for ``stall`` seconds. For work whose length is known in steps, not seconds: a training run's
    last thousand steps take a minute on an idle machine and several when the suite's other module loads it too, but
    a run that moves on is not stuck."""
    seen, since = progress(), time.time()
    while True:
        last = pred()
        if last:
            return last
        now_seen = progress()
        if now_seen != seen:
            seen, since = now_seen, time.time()
        elif time.time() - since > stall:
            raise AssertionError(f"no progress for {stall:g}s waiting for {what} (last: {last!r}; "
                                 f"progress stuck at {seen!r})")
        time.sleep(every)


def local_policy(**class_overrides) -> dict:
    """policies/local.yaml as a dict, with per-class overrides, e.g. pretrain={"min_runtime": 0}."""
    data = yaml.safe_load((REPO / "policies" / "local.yaml").read_text())
    data = copy.deepcopy(data)
    for cls, over in class_overrides.items():
        data["classes"][cls].update(over)
    return data


_EMPTY_STORE: Optional[Path] = None


def empty_store(db: Path) -> str:
    """The URI of a new, empty MLflow sqlite store at ``db``: a copy of one that MLflow made in this process's first
    call. MLflow makes a new store by running every one of its schema migrations (about 3 s of CPU here); a test
    module's jobs would otherwise all wait on the first one's, and each module pay it again."""
    global _EMPTY_STORE
    if _EMPTY_STORE is None or not _EMPTY_STORE.exists():
        from mlflow import MlflowClient

        made = Path(tempfile.mkdtemp(prefix="rl-store-")) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()  # creates the tables
        _EMPTY_STORE = made
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_EMPTY_STORE, db)
    return f"sqlite:///{db}"


# The reference LM, one entrypoint among others.
LM_ENTRYPOINT = "workloads.ray_train:train_loop_per_worker"


def spec(name: str, team: str, cls: str, *, workers: int = 1, gpu: float = 1, cpu: float = 0.5,
         features=(), placement=None, config=None, kind: str = "train", entrypoint: Optional[str] = None) -> dict:
    gang = {"workers": workers, "resources": {"gpu": gpu, "cpu": cpu}, "features": list(features)}
    if placement:
        gang["placement"] = placement
    out = {"name": name, "team": team, "class": cls, "kind": kind, "gang": gang, "config": config or {},
           "run": {"intent": f"test {name}", "owner": "pytest"}}
    if kind == "train":
        out["entrypoint"] = entrypoint or LM_ENTRYPOINT
    return out


def start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim", "nvlink"]), ("gpu-b", ["gpu-sim", "ssd"])), gpus: int = 2,
                  cpus: int = 4, head_cpus: int = 2, dashboard: bool = False, node_types=None):
    """A head (no GPUs) and one node per entry with logical GPUs and feature labels; stop it with ``stop_cluster``.
    ``node_types``: node name -> its node type (the ``raylane.io/node-type`` label; default none).

    The dashboard and the agents listen on free ports, not Ray's defaults (8265, 52365), which another Ray session
    on the machine may hold. A cluster that fails to come up is stopped before the error is raised.
    """
    from ray._private.services import get_node_ip_address
    from ray._private.utils import get_ray_address_file, write_ray_address
    from ray.cluster_utils import Cluster

    from raylane.config.cluster import NodeGroup
    from raylane.localcluster import node_labels

    # A temp dir of its own (under TMPDIR, removed by stop_cluster): Ray's job supervisor points job drivers at the
    # cluster named in <temp dir>/ray_current_cluster, and the default one would name whichever started last.
    temp_dir = tempfile.mkdtemp(prefix="rl-")
    # cluster_utils also writes the default <TMPDIR>/ray/ray_current_cluster, and fails where that folder does not
    # exist yet (a machine that never ran Ray); what was there before is put back once the nodes are up.
    shared = Path(get_ray_address_file(None))
    shared.parent.mkdir(parents=True, exist_ok=True)
    before = shared.read_text() if shared.exists() else None
    # The GCS on a port chosen here, so that every process of the cluster can be told its own address (below).
    gcs_port = free_port()
    head = {"num_cpus": head_cpus, "num_gpus": 0, "include_dashboard": dashboard, "temp_dir": temp_dir,
            "dashboard_port": free_port(), "dashboard_agent_listen_port": free_port(), "gcs_server_port": gcs_port}
    c = Cluster(initialize_head=False, connect=False)
    c.raylane_temp_dir = temp_dir
    # Each node unpacks jobs' working dirs into a folder of its own. The nodes share one session folder on one
    # machine, and with it Ray's runtime_resources folder: when a job with a working dir starts, every other node's
    # runtime-env agent unpacks it again there with overwrite=True, deleting the copy the driver runs in (its
    # current directory is gone; importing torch after that dies in oneMKL). On a real cluster each node has its
    # own disk. (`raylane up` on one machine: raylane.tracking.ensure_cwd.)
    try:
        with own_address_for_cluster_processes(f"{get_node_ip_address()}:{gcs_port}"):
            c.add_node(**head, runtime_env_dir_name="runtime_resources_head")
            for name, feats in gpu_nodes:
                group = NodeGroup(name=name, features=feats, node_type=(node_types or {}).get(name, ""))
                c.add_node(num_cpus=cpus, num_gpus=gpus, labels=node_labels(group),
                           temp_dir=temp_dir, dashboard_agent_listen_port=free_port(),
                           runtime_env_dir_name=f"runtime_resources_{name}")
        c.wait_for_nodes()
    except BaseException:
        stop_cluster(c)
        raise
    # `ray start --head` writes this file; cluster_utils does not, and job drivers would find any cluster.
    write_ray_address(c.address, temp_dir)
    if before is None:
        shared.unlink(missing_ok=True)
    else:
        shared.write_text(before)
    return c


@contextlib.contextmanager
def own_address_for_cluster_processes(address: str):
    """``RAY_ADDRESS=address`` in this process's environment while the cluster's processes start, which they
    inherit, and with them every worker their raylets start.

    Without it, Ray code inside a worker that looks up "its" cluster (``ray.util.state``: Ray Train's
    PlacementGroupCleaner asks it every second whether the run's controller is alive) takes the address in the
    machine's default ``<TMPDIR>/ray/ray_current_cluster``. That file names whichever cluster wrote it last: with
    test modules running side by side, another test's cluster, which does not know the controller, so the cleaner
    removed the live run's placement group and killed its workers ("Destroying worker since its placement group
    was removed": test_workloads_ray failed so in CI)."""
    before = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = address
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before


def stop_cluster(c) -> None:
    """Disconnect this process, stop every node of ``c`` and remove its temp dir."""
    import ray

    ray.shutdown()
    c.shutdown()
    # What a half-started head leaves (its GCS and monitor run before the dashboard fails to bind) is found by the
    # session folder on its command line.
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if c.raylane_temp_dir.encode() in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            continue
    shutil.rmtree(c.raylane_temp_dir, ignore_errors=True)


_GIVEN_PORTS: set = set()


# Ports handed out for test clusters come from below Linux's ephemeral range (32768-60999 by default): a port the
# kernel hands to a bind(0) is one that Ray's own processes (gRPC servers, workers, their outgoing connections) can
# also be given between the moment it is picked and the moment the dashboard or an agent binds it.
_PORT_RANGE = (20000, 32000)
_PORTS_RNG = random.Random()  # seeded from the OS: a test that seeds ``random`` does not make two workers pick alike


def free_port() -> int:
    """A TCP port free now, outside the ephemeral range (``_PORT_RANGE``), and never one this process was given
    before: Ray refuses a node whose dashboard and agent ports were both given the same number."""
    import socket

    while True:
        port = _PORTS_RNG.randint(*_PORT_RANGE)
        if port in _GIVEN_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
