"""A local Ray cluster on this machine, from a cluster file: one raylet per node, logical GPUs, feature labels.

``up`` starts a head (with the dashboard, which Ray's job API and Train's cleanup need) and one ``ray start`` worker
per node of the cluster file, then the control actor; ``down`` stops them. State (address, dashboard URL) is kept in
``~/.raylane/local.json`` so later commands find the cluster. Every process of the cluster (raylets, GCS, dashboard,
agents, workers, job drivers) inherits ``RAYLANE_LOCAL_CLUSTER=<id>``; ``down`` stops exactly those, not other
Ray sessions on the machine (``ray stop`` would stop every one of them). Feature tags become node labels
``feature.raylane.io/<tag>=true``, which the control actor reads back from ``ray.nodes()``.

Hardening (``docs/security.md``): Ray's token authentication is on. ``up`` writes a fresh random token to
``TOKEN_FILE`` (mode 0600, in a 0700 folder) and starts every node with ``RAY_AUTH_MODE=token`` and
``RAY_AUTH_TOKEN_PATH`` naming that file, so the GCS, the raylets and the dashboard (jobs API included) refuse
callers without it; the token itself is on no command line and in no environment. The dashboard listens on
127.0.0.1 only. The GCS, the raylets and the workers listen on every interface whatever ``--node-ip-address`` says
(Ray 2.60 on Linux turns 127.0.0.1 into the machine's address, and its gRPC servers have no bind option) and refuse
calls without the token; each node's metrics export port (Prometheus text) answers anyone who reaches it.

The caller's Raylane credential (``RAYLANE_TOKEN``, ``RAYLANE_CREDENTIALS``) and any Ray token of another cluster
(``RAY_AUTH_TOKEN``) are withheld from the nodes' environment, which every job inherits. The nodes run with umask
077, so what the cluster's processes write (Ray's logs and sockets, job working dirs, checkpoints, MLflow artifacts)
is readable by this user only: Ray makes its folders 0777 so that several users' Ray sessions can share
``/tmp/ray``, but the files in them are 0600.

A process that talks to the cluster (``ray.init``, ``JobSubmissionClient``, ``ray job submit``) needs
``client_env()`` in its environment before it first imports Ray (``use_client_env()`` does that, also after the
import), or ``auth_headers()`` on its HTTP requests.
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
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from raylane.errors import RetryableError

if TYPE_CHECKING:  # the CLI's commands join a cluster through here: the policy's models and the state machine are
    from raylane.config.cluster import ClusterFile  # imported only by what starts one

STATE_FILE = Path(os.path.expanduser("~")) / ".raylane" / "local.json"
TOKEN_FILE = STATE_FILE.parent / "ray_auth_token"  # Ray's cluster token of the cluster `up` started
HEAD_PORT = 6390
# Each node's dashboard agent serves Ray's jobs API on a port the system picks. At Ray's fixed default (52365) only
# the first agent of the machine binds it: the nodes of one machine shared it, and another Ray session holding it
# (a second cluster, a test's) left this cluster with no agent at all ("No available agent to submit job"; Ray 2.60
# keeps such an agent alive with its HTTP service off).
AGENT_PORT = "--dashboard-agent-listen-port=0"
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
GiB = 1024 ** 3
MARKER = "RAYLANE_LOCAL_CLUSTER"
NODE_UMASK = 0o077  # what the cluster's processes create is this user's only
QUIET_S = 3.0  # down: seconds with no process of the cluster seen before it is done


# The caller's variables no process of the cluster may inherit: a Raylane credential (every team's jobs run there and
# can read their environment) and a Ray token meant for some other cluster (Ray prefers it to RAY_AUTH_TOKEN_PATH).
WITHHELD = ("RAYLANE_TOKEN", "RAYLANE_CREDENTIALS", "RAY_AUTH_TOKEN")


def ray_env(token_path: Optional[Path] = None) -> Dict[str, str]:
    """The environment ``ray start`` runs with, which every process of the cluster inherits: the caller's, less
    ``WITHHELD``, with the folder of this Python first on ``PATH``; Ray's token authentication on with the token in
    ``token_path``, or off without one."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD}
    # The Python that runs raylane first on PATH, whatever shell started it (`.venv/bin/raylane up` without the
    # venv active): a job's `python -m raylane.run` then runs this Python, which has raylane, not the system's.
    here = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([here] + [d for d in env.get("PATH", "").split(os.pathsep) if d and d != here])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    if token_path is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
    else:
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop("RAY_AUTH_TOKEN_PATH", None)
    return env


def write_token(path: Path = TOKEN_FILE) -> Path:
    """A fresh random Ray token (256 bits, hex, as ``ray get-auth-token --generate`` makes) in ``path``, readable
    by its owner only. Written beside and renamed over, so a reader never sees a half-written token."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    os.chmod(tmp, 0o600)  # in case tmp already existed with a wider mode
    os.replace(tmp, path)
    return path


def client_env() -> Dict[str, str]:
    """The variables a process needs in its environment to reach the cluster ``up`` started: ``RAY_AUTH_MODE=token``
    and ``RAY_AUTH_TOKEN_PATH``. Empty when no local cluster is recorded, when it runs without authentication, or
    when ``RAY_ADDRESS`` names another cluster (the caller's own settings then apply).

    Ray reads ``RAY_AUTH_MODE`` once per process: set these before the process first uses Ray (``ray.init``, a
    ``JobSubmissionClient``), and unset ``RAY_AUTH_TOKEN``, which Ray prefers to the token file."""
    st = state() or {}
    token_path = st.get("auth_token_path")
    if not token_path or os.environ.get("RAY_ADDRESS", st.get("address")) != st.get("address"):
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}


def use_client_env() -> bool:
    """Put ``client_env()`` into this process's environment (and drop ``RAY_AUTH_TOKEN``), so that ``ray.init``
    and ``JobSubmissionClient`` here, and the subprocesses started from here, reach the local cluster. Returns
    whether there was anything to set.

    Ray reads ``RAY_AUTH_MODE`` when it is imported (measured with Ray 2.60: setting it afterwards changes nothing);
    when Ray is already imported, its configuration and token cache are read again, as Ray itself does when it turns
    token authentication on for a new local cluster."""
    env = client_env()
    if not env:
        return False
    os.environ.update(env)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    return True


def auth_headers() -> Dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for HTTP requests to the local cluster's dashboard (jobs API), or
    empty as ``client_env()`` is. For ``JobSubmissionClient(url, headers=auth_headers())``: it then works whatever
    this process's Ray read from ``RAY_AUTH_MODE``."""
    env = client_env()
    if not env:
        return {}
    return {"Authorization": f"Bearer {Path(env['RAY_AUTH_TOKEN_PATH']).read_text().strip()}"}


def _ray_bin() -> str:
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def node_labels(group) -> Dict[str, str]:
    from raylane.control.state_nodes import DATASETS_LABEL, FEATURE_LABEL_PREFIX, NODE_TYPE_LABEL
    from raylane.scheduling.types import SPOT_LABEL

    labels = dict(group.labels)
    labels.update({f"{FEATURE_LABEL_PREFIX}{f}": "true" for f in group.features})
    if group.node_type:
        labels[NODE_TYPE_LABEL] = group.node_type
    if group.datasets:
        labels[DATASETS_LABEL] = ".".join(group.datasets)
    if getattr(group, "spot", False):
        labels[SPOT_LABEL] = "true"
    return labels


def up(cluster: ClusterFile, *, port: int = HEAD_PORT, dashboard_port: int = DASHBOARD_PORT,
       client_port: int = CLIENT_PORT, auth: bool = True) -> Dict[str, str]:
    """Start the head and the worker nodes; returns the state written to ``STATE_FILE``. ``port``, ``dashboard_port``
    and ``client_port`` are the head's GCS, dashboard and Ray client server (``ray://``) ports. With ``auth`` (the
    default) Ray's token authentication is on with a new token in ``TOKEN_FILE``; a cluster already recorded keeps
    the token it runs with."""
    token_path = None
    if auth:
        token_path = TOKEN_FILE if STATE_FILE.is_file() and TOKEN_FILE.is_file() else write_token(TOKEN_FILE)
    env = ray_env(token_path)
    env[MARKER] = secrets.token_hex(8)
    ray = _ray_bin()
    head = [ray, "start", "--head", f"--port={port}", f"--num-cpus={cluster.head.cpus}",
            f"--num-gpus={cluster.head.gpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}", "--disable-usage-stats",
            AGENT_PORT]
    if cluster.head.memory:
        head.append(f"--memory={int(cluster.head.memory * GiB)}")
    _run(head, env, umask=NODE_UMASK)
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
                  f"--temp-dir={node_tmp}", "--disable-usage-stats", AGENT_PORT], env, umask=NODE_UMASK)
    state = {"address": address, "dashboard": f"http://127.0.0.1:{dashboard_port}", "cluster": cluster.name,
             "started": time.time(), "marker": env[MARKER], "temp_dirs": temp_dirs,
             "auth_token_path": str(token_path) if token_path else None}
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
        # Every process seen once is followed until it is gone, also after its raylet died and it lost its place
        # in the process tree (an agent whose marker setproctitle erased is found as a raylet's child only).
        seen: Dict[int, Tuple[str, Optional[bytes]]] = {}
        quiet_since = None
        while time.time() < give_up:
            for pid, cmd in marked_processes(MARKER, st["marker"]):
                if pid not in seen:
                    seen[pid] = (cmd, _started(pid))
            seen = {pid: v for pid, v in seen.items() if v[1] is not None and _started(pid) == v[1]}
            left = sorted((pid, v[0]) for pid, v in seen.items())
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
    _forget_address(st.get("address"))
    STATE_FILE.unlink(missing_ok=True)


def _forget_address(address: Optional[str]) -> None:
    """Remove Ray's record of the current cluster (``<temp dir>/ray/ray_current_cluster``, written by ``ray start
    --head``) when it names the cluster just stopped, as ``ray stop`` does: a later plain ``ray.init()`` would
    otherwise try to join a cluster that is gone instead of starting its own."""
    if not address:
        return
    path = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        named = path.read_text().strip()
    except OSError:
        return
    # The port alone names it (the file may say 192.0.2.2 where we said 127.0.0.1), but another cluster may hold
    # that port by now (another user's or session's `raylane up`): its record stays while something answers there.
    if named.rsplit(":", 1)[-1] == address.rsplit(":", 1)[-1] and not _answers(named):
        path.unlink(missing_ok=True)


def _answers(address: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def marked_processes(key: str, value: str) -> List[Tuple[int, str]]:
    """(pid, command line) of the live processes, other than this one, started with ``key=value`` in their
    environment, and their descendants (Linux ``/proc``; an empty list elsewhere).

    Descendants count because a marker can vanish from ``/proc/PID/environ``: Ray's agents rename themselves
    (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) with setproctitle, which zeroes the start of the memory the
    kernel shows as their environment. Measured with Ray 2.60: one node's agent pair of three had lost the marker,
    and `raylane down` left such a pair alive after a clean-clone CI run's demo."""
    if not os.path.isdir("/proc"):
        return []
    marker = f"{key}={value}".encode()
    me = os.getpid()
    marked, parent, cmds = set(), {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().rsplit(b")", 1)[1].split()
            if stat[0] in (b"Z", b"X"):  # a zombie is dead, only not yet reaped
                continue
            parent[pid] = int(stat[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmds[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    marked.add(pid)
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            parent.pop(pid, None)
            cmds.pop(pid, None)
    found = []
    for pid in parent:
        p, seen = pid, set()
        while p not in marked and p in parent and p not in seen and p != me:
            seen.add(p)
            p = parent[p]
        if p in marked:
            found.append((pid, cmds.get(pid) or f"[pid {pid}]"))
    return sorted(found)


def _started(pid: int) -> Optional[bytes]:
    """When ``pid`` started (clock ticks since boot, from /proc), or None if it is gone or a zombie: with the pid
    it names one process, whatever later reuses the pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in (b"Z", b"X") else fields[19]


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


def connect_driver() -> None:
    """Join the cluster as a quiet Ray driver: the local cluster of ``raylane up`` (with its Ray token), or the one
    ``RAY_ADDRESS`` names. Raises ``RetryableError`` when there is none."""
    import ray

    if not use_client_env():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        try:
            ray.init(address=address(), namespace="raylane", logging_level="ERROR", log_to_driver=False,
                     configure_logging=False)
        except ConnectionError as exc:
            raise RetryableError(f"no Ray cluster to connect to ({exc}); start one with `raylane up`") from exc


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


def _run(cmd, env, check: bool = True, umask: int = -1) -> None:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, umask=umask)
    if check and p.returncode != 0:
        raise RetryableError(f"`{' '.join(cmd[:3])} ...` failed ({p.returncode}):\n{p.stderr[-2000:]}")
