"""A Ray head with Ray's own autoscaler on its fake multi-node provider, for tests of scale-up and scale-down.

What this module owns: one Ray session per ``FakeAutoscalingCluster`` — its temp dir, the head started with
``ray start --head --autoscaling-config=...``, the autoscaler monitor that runs beside the head, and the raylets
that monitor launches as "nodes" on this machine. It stops only those processes and checks none is left.

Words:
  node type   an entry of the autoscaling config's ``available_node_types``: resources (logical GPUs included),
              labels (e.g. ``raylane.io/node-type``), min and max worker counts.
  fake node   a raylet the monitor starts in its own process tree (``FakeMultiNodeProvider``); it joins the head's
              GCS and shares the head's temp dir, as a node of that type would.
  marker      ``RAYLANE_FAKE_AUTOSCALER=<uuid>`` in the environment of ``ray start``; every process of this session
              (GCS, raylets, monitor, fake nodes, workers) inherits it, which is how ``stop`` finds them.

Autoscaler v2 is used: Ray 2.60's ``ray.cluster_utils.AutoscalingCluster(autoscaler_v2=True)`` runs the fake
provider under v2 with the settings copied below (``RAY_enable_autoscaler_v2=1``, the head's cloud instance id and
node id fixed to ``FAKE_HEAD_NODE_ID``, ``launch_multiple``), and only v2 honours ``bundle_label_selectors`` in
``request_resources`` (v1 drops them: ``autoscaler/_private/commands.py::request_resources``).

Why not ``AutoscalingCluster`` itself:
- its ``start()`` and ``shutdown()`` run ``ray stop --force``, which kills every Ray process on the machine;
- it and the provider type ``fake_multinode`` read ``autoscaler/_private/fake_multi_node/example.yaml``, which the
  wheel does not ship: ``prepare_config`` -> ``fillout_defaults`` -> ``providers._get_default_config`` opens it for
  that provider type, in the v1 and the v2 monitor alike. The config written here names the same provider class
  through the ``external`` provider type (``module: ...FakeMultiNodeProvider``), whose defaults are built in
  (``MINIMAL_EXTERNAL_CONFIG``), and spells out every field the example file would have filled in;
- the provider starts its raylets against ``<machine ip>:6379`` unless ``provider.gcs_address`` is set; here the
  head listens on a free port, so it is set.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from raylane.localcluster import _signal, _started
from tests.raytest import free_port, wait_for

MARKER_KEY = "RAYLANE_FAKE_AUTOSCALER"
HEAD_NODE_TYPE = "ray.head.default"
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
# How long a stopped process may take to exit after SIGTERM before it gets SIGKILL.
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class NodeType:
    """One worker node type: ``resources`` as Ray counts them (``{"CPU": 1, "GPU": 2}``, logical GPUs) and the
    ``labels`` its nodes carry."""

    name: str
    resources: Dict[str, float]
    labels: Dict[str, str] = field(default_factory=dict)
    min_workers: int = 0
    max_workers: int = 1


def autoscaling_config(node_types: Sequence[NodeType], *, head_cpus: int, gcs_address: str,
                       idle_timeout_s: float) -> dict:
    """The autoscaling config for ``ray start --autoscaling-config``: the fake provider, the head and
    ``node_types``, with every field the missing example.yaml would have supplied."""
    if HEAD_NODE_TYPE in {t.name for t in node_types}:
        raise ValueError(f"node type name {HEAD_NODE_TYPE!r} is the head's; pick another")
    types = {t.name: {"resources": dict(t.resources), "labels": dict(t.labels), "node_config": {},
                      "min_workers": t.min_workers, "max_workers": t.max_workers} for t in node_types}
    types[HEAD_NODE_TYPE] = {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0}
    return {
        "cluster_name": "raylane-fake",
        "max_workers": sum(t.max_workers for t in node_types),
        "provider": {
            "type": "external",
            "module": FAKE_PROVIDER,
            # Where the fake nodes find the GCS (the provider's default is <machine ip>:6379).
            "gcs_address": gcs_address,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            # Autoscaler v2 (as cluster_utils.AutoscalingCluster sets it up).
            "launch_multiple": True,
            "head_node_id": _fake_head_node_id(),
        },
        "available_node_types": types,
        "head_node_type": HEAD_NODE_TYPE,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def _fake_head_node_id() -> str:
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    return FAKE_HEAD_NODE_ID


class FakeAutoscalingCluster:
    """A head (``head_cpus`` CPUs, no GPUs) and Ray's v2 autoscaler, which adds and removes nodes of
    ``node_types`` on this machine. Use as a context manager; ``connect()`` points this process's Ray at it.

    ``idle_timeout_s``: how long a worker node may stay idle before the autoscaler removes it.
    ``update_interval_s``: the autoscaler's loop period (``AUTOSCALER_UPDATE_INTERVAL_S``, whole seconds).
    Ray's other settings (``RAY_AUTH_MODE`` among them) come from this process's environment, as tests/conftest.py
    sets it, so the head and this process's driver agree.
    """

    def __init__(self, node_types: Sequence[NodeType], *, head_cpus: int = 1, idle_timeout_s: float = 5.0,
                 update_interval_s: int = 1):
        self.node_types = list(node_types)
        self.head_cpus = head_cpus
        self.idle_timeout_s = idle_timeout_s
        self.update_interval_s = update_interval_s
        self.marker = uuid.uuid4().hex
        self.temp_dir: Optional[str] = None
        self.gcs_address: Optional[str] = None
        self.config: Optional[dict] = None

    # -- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> "FakeAutoscalingCluster":
        """Start the head and its monitor; return once the head is up. On failure, stop what started, then raise."""
        import ray._private.services as services

        self.temp_dir = tempfile.mkdtemp(prefix="rl-as-")
        port = free_port()
        self.gcs_address = f"{services.get_node_ip_address()}:{port}"
        self.config = autoscaling_config(self.node_types, head_cpus=self.head_cpus, gcs_address=self.gcs_address,
                                         idle_timeout_s=self.idle_timeout_s)
        config_path = Path(self.temp_dir) / "autoscaling.yaml"
        config_path.write_text(yaml.safe_dump(self.config))
        env = dict(os.environ)
        env.update({
            MARKER_KEY: self.marker,
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": str(self.update_interval_s),
            "RAY_enable_autoscaler_v2": "1",
            "RAY_CLOUD_INSTANCE_ID": _fake_head_node_id(),
            "RAY_OVERRIDE_NODE_ID_FOR_TESTING": _fake_head_node_id(),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Its own address for every process of it (see raytest.own_address_for_cluster_processes).
            "RAY_ADDRESS": self.gcs_address,
        })
        # Every port a second Ray session on this machine may also want is a free one (Ray's defaults: client
        # server 10001, dashboard 8265 (its process starts even with --include-dashboard=false), agent 52365).
        cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
               f"--temp-dir={self.temp_dir}", f"--autoscaling-config={config_path}",
               f"--num-cpus={self.head_cpus}", "--num-gpus=0", "--include-dashboard=false",
               f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}",
               f"--dashboard-agent-listen-port={free_port()}",
               "--disable-usage-stats"]
        try:
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise RuntimeError(f"ray start failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        except BaseException:
            self.stop()
            raise
        return self

    def connect(self) -> None:
        """``ray.init`` this process on the cluster, and make sure Ray's client takes it for autoscaler v2 (the
        answer is cached per process, and an earlier cluster in this process may have been v1)."""
        import ray
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        ray.init(address=self.gcs_address, log_to_driver=False)
        if not is_autoscaler_v2(fetch_from_server=True):
            raise RuntimeError(f"the cluster at {self.gcs_address} does not run autoscaler v2")

    def stop(self) -> None:
        """Disconnect this process if it is on this cluster, stop every process of this cluster, remove the temp
        dir, and raise if a process of it is still alive.

        The monitor goes first (SIGKILL), so it launches nothing more; the raylets and agents get SIGTERM and stop
        their workers; the GCS, which takes many seconds over SIGTERM, and whatever is left after
        ``STOP_GRACE_S`` get SIGKILL. The list is taken before the first signal: an agent that renamed itself is
        found only through its raylet (see ``raylane.localcluster.marked_processes``)."""
        import ray

        if ray.is_initialized() and self.gcs_address and _connected_to(self.gcs_address):
            ray.shutdown()
        procs = self.processes()
        _signal_all([pid for pid, cmd in procs if "/autoscaler/" in cmd and "monitor.py" in cmd], signal.SIGKILL)
        gcs = [pid for pid, cmd in procs if "gcs_server" in cmd]
        _signal_all([pid for pid, _ in procs if pid not in gcs], signal.SIGTERM)
        stamps = {pid: _started(pid) for pid, _ in procs}
        alive = lambda: [pid for pid, t in stamps.items() if t is not None and _started(pid) == t]  # noqa: E731
        deadline = time.time() + STOP_GRACE_S
        while [p for p in alive() if p not in gcs] and time.time() < deadline:
            time.sleep(0.05)
        _signal_all(alive() + [pid for pid, _ in self.processes()], signal.SIGKILL)
        try:
            wait_for(lambda: not alive() and not self.processes(), timeout=STOP_GRACE_S, every=0.05,
                     what="every process of the fake autoscaling cluster to exit",
                     explain=lambda: "\n".join(cmd for _, cmd in self.processes()))
        finally:
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)

    def processes(self) -> List[Tuple[int, str]]:
        """(pid, command line) of every live process of this cluster: those that carry its marker, their
        descendants, and any whose command line names its temp dir."""
        from raylane.localcluster import marked_processes

        found = dict(marked_processes(MARKER_KEY, self.marker))
        if self.temp_dir:
            needle = self.temp_dir.encode()
            for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
                if not entry.isdigit() or int(entry) == os.getpid() or int(entry) in found:
                    continue
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if needle in cmd and _started(int(entry)) is not None:
                    found[int(entry)] = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
        return sorted(found.items())

    def __enter__(self) -> "FakeAutoscalingCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what a test reads ------------------------------------------------------------------------------------

    def status(self):
        """The autoscaler's view (``ray.autoscaler.v2.schema.ClusterStatus``): nodes, pending launches, demands."""
        from ray.autoscaler.v2.sdk import get_cluster_status

        return get_cluster_status(self.gcs_address)

    def _status_reply(self):
        from ray._raylet import GcsClient
        from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

        reply = GetClusterStatusReply()
        reply.ParseFromString(GcsClient(self.gcs_address).get_cluster_status(timeout_s=10))
        return reply

    def wait_for_iterations(self, n: int = 2, timeout: float = 30.0) -> None:
        """Return once the autoscaler has finished ``n`` iterations on cluster states the GCS built after this call
        began, and reported what each decided. The GCS numbers each cluster state it builds; each autoscaler
        iteration reports the number of the state it read (``last_seen_cluster_resource_state_version``)."""
        now = self._status_reply().cluster_resource_state.cluster_resource_state_version
        seen = []

        def done():
            v = self._status_reply().autoscaling_state.last_seen_cluster_resource_state_version
            if v > now and (not seen or v != seen[-1]):
                seen.append(v)
            return len(seen) >= n

        wait_for(done, timeout=timeout, every=0.1, what=f"{n} autoscaler iterations after state {now}")

    @staticmethod
    def alive_nodes(labels: Optional[Dict[str, str]] = None) -> List[dict]:
        """``ray.nodes()`` entries that are alive and carry every label in ``labels``."""
        import ray

        want = labels or {}
        return [n for n in ray.nodes() if n["Alive"]
                and all(n.get("Labels", {}).get(k) == v for k, v in want.items())]


def _connected_to(gcs_address: str) -> bool:
    import ray

    try:
        return ray.get_runtime_context().gcs_address == gcs_address
    except Exception:  # not connected, or a Ray without the attribute
        return False


def _signal_all(pids, sig) -> None:
    for pid in pids:
        _signal(pid, sig)


def request(bundles: List[dict], selectors: Optional[List[dict]] = None) -> None:
    """``ray.autoscaler.sdk.request_resources(bundles=..., bundle_label_selectors=...)``: replaces the cluster's
    one resource constraint. ``request([])`` clears it."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles, bundle_label_selectors=selectors)


__all__ = ["FakeAutoscalingCluster", "NodeType", "autoscaling_config", "request"]
