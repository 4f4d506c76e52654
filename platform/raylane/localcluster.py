"""A local Ray cluster on this machine, from a cluster file: one raylet per node, logical GPUs, feature labels.

``up`` starts a head (with the dashboard, which Ray's job API and Train's cleanup need) and one ``ray start`` worker
per node of the cluster file, then the control actor; ``down`` stops them. State (address, dashboard URL) is kept in
``~/.raylane/local.json`` so later commands find the cluster. Feature tags become node labels
``feature.raylane.io/<tag>=true``, which the control actor reads back from ``ray.nodes()``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

from raylane.config.cluster import ClusterFile
from raylane.control.actor import DATASETS_LABEL, FEATURE_LABEL_PREFIX, NODE_TYPE_LABEL
from raylane.errors import RetryableError

STATE_FILE = Path(os.path.expanduser("~")) / ".raylane" / "local.json"
HEAD_PORT = 6390
DASHBOARD_PORT = 8265
GiB = 1024 ** 3


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
    ray = _ray_bin()
    head = [ray, "start", "--head", f"--port={port}", f"--num-cpus={cluster.head.cpus}",
            f"--num-gpus={cluster.head.gpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}", "--disable-usage-stats"]
    if cluster.head.memory:
        head.append(f"--memory={int(cluster.head.memory * GiB)}")
    _run(head, env)
    address = f"127.0.0.1:{port}"
    for g in cluster.nodes:
        for _ in range(g.count):
            _run([ray, "start", f"--address={address}", f"--num-cpus={g.cpus}", f"--num-gpus={g.gpus}",
                  f"--memory={int(g.memory * GiB)}", f"--labels={json.dumps(node_labels(g))}",
                  "--disable-usage-stats"], env)
    state = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "cluster": cluster.name,
             "started": time.time()}
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state))
    return state


def down() -> None:
    _run([_ray_bin(), "stop", "--force"], ray_env(), check=False)
    STATE_FILE.unlink(missing_ok=True)


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
