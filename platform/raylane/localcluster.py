"""A local Ray cluster on this machine, from a cluster file: one raylet per node, logical GPUs, feature labels.

``up`` starts a head (with the dashboard, which Ray's job API and Train's cleanup need) and one ``ray start`` worker
per node of the cluster file, then the control actor; ``down`` stops them. State (address, dashboard URL) is kept in
``~/.raylane/local.json`` so later commands find the cluster. Every process of the cluster (raylets, GCS, dashboard,
agents, workers, job drivers) inherits ``RAYLANE_LOCAL_CLUSTER=<id>``; ``down`` stops exactly those, not other
Ray sessions on the machine (``ray stop`` would stop every one of them). Feature tags become node labels
``feature.raylane.io/<tag>=true``, which the control actor reads back from ``ray.nodes()``.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from raylane.config.cluster import ClusterFile
from raylane.control.actor import DATASETS_LABEL, FEATURE_LABEL_PREFIX, NODE_TYPE_LABEL
from raylane.errors import RetryableError

STATE_FILE = Path(os.path.expanduser("~")) / ".raylane" / "local.json"
HEAD_PORT = 6390
DASHBOARD_PORT = 8265
GiB = 1024 ** 3
MARKER = "RAYLANE_LOCAL_CLUSTER"
QUIET_S = 3.0  # down: seconds with no process of the cluster seen before it is done


def ray_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    return env


def _ray_bin() -> str:
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def node_labels(group) -> Dict[str, str]:
    labels = dict(group.labels)
    labels.update({f"{FEATURE_LABEL_PREFIX}{f}": "true" for f in group.features})
    if group.node_type:
        labels[NODE_TYPE_LABEL] = group.node_type
    if group.datasets:
        labels[DATASETS_LABEL] = ".".join(group.datasets)
    return labels


def up(cluster: ClusterFile, *, port: int = HEAD_PORT, dashboard_port: int = DASHBOARD_PORT) -> Dict[str, str]:
    """Start the head and the worker nodes; returns the state written to ``STATE_FILE``."""
    env = ray_env()
    env[MARKER] = secrets.token_hex(8)
    ray = _ray_bin()
    head = [ray, "start", "--head", f"--port={port}", f"--num-cpus={cluster.head.cpus}",
            f"--num-gpus={cluster.head.gpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}", "--disable-usage-stats"]
    if cluster.head.memory:
        head.append(f"--memory={int(cluster.head.memory * GiB)}")
    _run(head, env)
    address = f"127.0.0.1:{port}"
    # Each worker node gets a temp dir of its own. Nodes of one machine would otherwise share the head's session
    # folder and its runtime_resources, where every node's runtime-env agent unpacks a job's --working-dir with
    # overwrite=True, deleting the copy that the job's driver already runs in (measured with Ray 2.60; on a real
    # cluster each node has its own disk). Short paths: Ray's unix sockets live under them.
    temp_dirs = []
    for g in cluster.nodes:
        for _ in range(g.count):
            node_tmp = os.path.join(tempfile.gettempdir(), f"rl{len(temp_dirs)}-{env[MARKER][:6]}")
            temp_dirs.append(node_tmp)
            _run([ray, "start", f"--address={address}", f"--num-cpus={g.cpus}", f"--num-gpus={g.gpus}",
                  f"--memory={int(g.memory * GiB)}", f"--labels={json.dumps(node_labels(g))}",
                  f"--temp-dir={node_tmp}", "--disable-usage-stats"], env)
    state = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "cluster": cluster.name,
             "started": time.time(), "marker": env[MARKER], "temp_dirs": temp_dirs}
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state))
    return state


def down(grace_s: float = 10.0) -> None:
    """Stop the cluster ``up`` started: SIGTERM to its processes, SIGKILL to what is left after ``grace_s``.

    Without a recorded marker (a state file from an older version) or without ``/proc``, falls back to
    ``ray stop --force``, which stops every Ray process of this user on the machine."""
    st = state() or {}
    if st.get("marker") and os.path.isdir("/proc"):
        # Rounds until none is left: a process can appear while the others stop (a raylet restarting an agent that
        # exited on SIGTERM before the raylet did), and one that appears after the grace period is killed at once.
        # Done only after a quiet period with none seen: under load an agent a raylet spawned just before it was
        # killed can take seconds to show up (a clean-clone CI run on a loaded machine found a DashboardAgent and a
        # RuntimeEnvAgent alive after a version that stopped at the first empty scan).
        grace_end = time.time() + grace_s
        give_up = grace_end + 15.0
        asked = set()
        quiet_since = None
        while time.time() < give_up:
            left = marked_processes(MARKER, st["marker"])
            if not left:
                quiet_since = quiet_since or time.time()
                if time.time() - quiet_since >= QUIET_S:
                    break
                time.sleep(0.25)
                continue
            quiet_since = None
            late = time.time() >= grace_end
            for pid, _ in left:
                if late:
                    _signal(pid, signal.SIGKILL)
                elif pid not in asked:
                    _signal(pid, signal.SIGTERM)
                    asked.add(pid)
            time.sleep(0.25)
    elif st or not os.path.isdir("/proc"):
        _run([_ray_bin(), "stop", "--force"], ray_env(), check=False)
    for node_tmp in st.get("temp_dirs") or []:  # the worker nodes' own temp dirs (logs, sockets, working dirs)
        shutil.rmtree(node_tmp, ignore_errors=True)
    STATE_FILE.unlink(missing_ok=True)


def marked_processes(key: str, value: str) -> List[Tuple[int, str]]:
    """(pid, command line) of the live processes, other than this one, started with ``key=value`` in their
    environment (Linux ``/proc``; an empty list elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    marker = f"{key}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cmd or not _zombie(entry):  # a zombie is dead, only not yet reaped; an empty line may be mid-exec
            found.append((int(entry), cmd or f"[pid {entry}]"))
    return found


def _zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True  # gone


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # already gone
        pass


def state() -> Optional[Dict[str, str]]:
    try:
        return json.loads(STATE_FILE.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def address() -> str:
    """The Ray address to connect to: RAY_ADDRESS, else the local cluster's, else 'auto'."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    s = state()
    return s["address"] if s else "auto"


def dashboard() -> str:
    if os.environ.get("RAY_API_SERVER_ADDRESS"):
        return os.environ["RAY_API_SERVER_ADDRESS"]
    s = state()
    return s["dashboard"] if s else f"http://127.0.0.1:{DASHBOARD_PORT}"


def _run(cmd, env, check: bool = True) -> None:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RetryableError(f"`{' '.join(cmd[:3])} ...` failed ({p.returncode}):\n{p.stderr[-2000:]}")
