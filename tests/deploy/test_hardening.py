"""Issue 11's hardening below the control plane (docs/security.md): the local cluster of ``raylane up`` runs with
Ray's token authentication, a loopback dashboard, no caller credential in its environment and umask 077; the
MLflow store the platform creates is readable by its user only; the deploy files turn Ray's token auth on.

Pure except the last test, which starts a small local cluster the way ``raylane up`` does (``ray``, ``slow``).
"""
from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from raylane import credentials, localcluster
from raylane.config.cluster import ClusterFile, load_cluster
from raylane.tracking import client_for, tracking_uri
from tests.raytest import free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CALLERS_SECRETS = {"RAYLANE_TOKEN": "rlt_aaaaaaaaaaaa_" + "s" * 43, "RAYLANE_CREDENTIALS": "/elsewhere/credentials",
                   "RAY_AUTH_TOKEN": "a-token-of-another-cluster"}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """``localcluster``'s state and token files under a temp folder instead of ``~/.raylane``."""
    monkeypatch.setattr(localcluster, "STATE_FILE", tmp_path / ".raylane" / "local.json")
    monkeypatch.setattr(localcluster, "TOKEN_FILE", tmp_path / ".raylane" / "ray_auth_token")
    return tmp_path / ".raylane"


# ---------------------------------------------------------------------------------------------- the MLflow store


def test_a_new_sqlite_store_is_readable_by_its_user_only(tmp_path):
    db = tmp_path / "state" / "mlflow.db"
    client_for(tracking_uri(str(db))).search_experiments()
    assert {p.name: oct(mode(p)) for p in (db.parent, db, db.parent / "mlartifacts", Path(f"{db}.lock"))} == {
        "state": "0o700", "mlflow.db": "0o600", "mlartifacts": "0o700", "mlflow.db.lock": "0o600"}


def test_a_store_left_readable_by_an_older_version_is_tightened_and_its_folder_kept(uri, tmp_path):
    db = Path(uri[len("sqlite:///"):])
    os.chmod(db.parent, 0o755)  # a project folder the user chose: not the platform's to change
    os.chmod(db, 0o644)
    (db.parent / "mlartifacts").mkdir(mode=0o755)
    client_for(uri).search_experiments()
    assert (oct(mode(db)), oct(mode(db.parent / "mlartifacts")), oct(mode(db.parent))) == ("0o600", "0o700", "0o755")


# ---------------------------------------------------------------------------------------- the local cluster's env


def test_the_nodes_env_withholds_the_callers_credentials_and_turns_on_token_auth(monkeypatch, tmp_path):
    for k, v in {**CALLERS_SECRETS, "RAY_AUTH_MODE": "disabled"}.items():
        monkeypatch.setenv(k, v)
    env = localcluster.ray_env(tmp_path / "tok")
    assert not set(CALLERS_SECRETS) & set(env)
    assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN_PATH"]) == ("token", str(tmp_path / "tok"))
    off = localcluster.ray_env(None)
    assert off["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in off and "RAYLANE_TOKEN" not in off


def test_up_starts_every_node_with_the_token_file_a_loopback_dashboard_and_umask_077(home, monkeypatch):
    for k, v in CALLERS_SECRETS.items():
        monkeypatch.setenv(k, v)
    started = []
    monkeypatch.setattr(localcluster, "_run", lambda cmd, env, check=True, umask=-1: started.append((cmd, env, umask)))
    st = localcluster.up(load_cluster(None))

    token_file = home / "ray_auth_token"
    token = token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token) and (oct(mode(token_file)), oct(mode(home))) == ("0o600", "0o700")
    assert st["auth_token_path"] == str(token_file) == json.loads(localcluster.STATE_FILE.read_text())[
        "auth_token_path"]
    assert len(started) == 3  # head + the embedded cluster's two worker nodes
    for cmd, env, umask in started:
        assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN_PATH"], umask) == ("token", str(token_file), 0o077)
        assert not set(CALLERS_SECRETS) & set(env)
        assert not any(token in part for part in [*cmd, *env.values()]), "the token itself travels only as a file"
    head = started[0][0]
    assert "--head" in head and "--dashboard-host=127.0.0.1" in head
    # Every node's agent on a port of its own, picked when it starts (none at Ray's default 52365).
    assert all("--dashboard-agent-listen-port=0" in cmd for cmd, _, _ in started)

    localcluster.up(load_cluster(None))  # a cluster is recorded (still running): it keeps its token
    assert token_file.read_text() == token
    localcluster.STATE_FILE.unlink()  # after `down`: a new cluster, a new token
    localcluster.up(load_cluster(None))
    assert token_file.read_text() != token


def test_up_without_auth_starts_nodes_with_auth_disabled(home, monkeypatch):
    started = []
    monkeypatch.setattr(localcluster, "_run", lambda cmd, env, check=True, umask=-1: started.append(env))
    st = localcluster.up(load_cluster(None), auth=False)
    assert st["auth_token_path"] is None and {e["RAY_AUTH_MODE"] for e in started} == {"disabled"}
    assert localcluster.client_env() == {} and localcluster.auth_headers() == {}


def test_client_env_and_headers_name_the_local_clusters_token(home, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert localcluster.client_env() == {}  # no cluster recorded
    token_file = localcluster.write_token(localcluster.TOKEN_FILE)
    home.joinpath("local.json").write_text(json.dumps({"address": "127.0.0.1:6390",
                                                        "auth_token_path": str(token_file)}))
    assert localcluster.client_env() == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    assert localcluster.auth_headers() == {"Authorization": f"Bearer {token_file.read_text()}"}
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")  # another cluster: its own settings apply
    assert localcluster.client_env() == {} and localcluster.auth_headers() == {}


def test_use_client_env_turns_token_auth_on_in_a_process_that_already_imported_ray(home, tmp_path):
    # Ray reads RAY_AUTH_MODE when it is imported: checked in a fresh process, whose Ray config it may change.
    token_file = localcluster.write_token(localcluster.TOKEN_FILE)
    home.joinpath("local.json").write_text(json.dumps({"address": "127.0.0.1:6390",
                                                        "auth_token_path": str(token_file)}))
    script = (
        "import os, ray\n"
        "from raylane import localcluster\n"
        "from ray._private.authentication.authentication_utils import is_token_auth_enabled\n"
        "from ray._private.authentication.http_token_authentication import get_auth_headers_if_auth_enabled\n"
        "before = is_token_auth_enabled()\n"
        "localcluster.use_client_env()\n"
        "print(before, is_token_auth_enabled(), 'RAY_AUTH_TOKEN' in os.environ,\n"
        "      get_auth_headers_if_auth_enabled({}).get('authorization') == 'Bearer ' + open(%r).read())\n"
        % str(token_file))
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "other"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True", "False", "True"], out.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- the deploy files


def test_the_launcher_cluster_starts_every_ray_process_with_token_auth():
    cfg = yaml.safe_load((DEPLOY / "ray-cluster-launcher" / "cluster.yaml").read_text())
    token_path = "RAY_AUTH_TOKEN_PATH=/home/ray/.raylane/ray_auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for cmd in cfg[key]:
            if "ray start" in cmd or "start_control.py" in cmd:
                assert "RAY_AUTH_MODE=token" in cmd and token_path in cmd, (key, cmd)
    setup = " ".join(cfg["setup_commands"])
    assert "test -s .raylane/ray_auth_token" in setup and "install -m 600" in setup  # no token, no node
    assert ".raylane/credentials" in cfg["rsync_exclude"]  # a Raylane token of the operator stays on their machine


def test_the_kuberay_cluster_and_its_rayjob_use_ray_token_auth_and_a_mounted_raylane_credential():
    cluster = next(d for d in yaml.safe_load_all((DEPLOY / "kuberay" / "raycluster.yaml").read_text())
                   if d and d["kind"] == "RayCluster")
    assert cluster["spec"]["authOptions"] == {"mode": "token"}
    job = yaml.safe_load((DEPLOY / "kuberay" / "rayjob-pretrain.yaml").read_text())["spec"]
    pod = job["submitterPodTemplate"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "credential")
    # The folder is uploaded as a py_modules package named as raylane.credentials looks for it.
    assert Path(mount["mountPath"]).name == credentials.JOB_MODULE
    assert yaml.safe_load(job["runtimeEnvYAML"])["py_modules"] == [mount["mountPath"]]
    secret = next(v for v in pod["volumes"] if v["name"] == "credential")["secret"]
    assert secret["items"] == [{"key": "token", "path": "token"}] and not secret["defaultMode"] & 0o007


def test_no_deploy_file_holds_a_token_and_the_mlflow_server_keeps_its_files_private():
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not re.search(r"rlt_[a-z0-9]{12}_[A-Za-z0-9_-]{43}", text), path
            assert not re.search(r"RAY_AUTH_TOKEN=[0-9a-f]{16}", text), path
    assert "\numask 077\n" in (DEPLOY / "mlflow" / "run_server.sh").read_text()


# ------------------------------------------------------------------------------------- a live cluster (ray, slow)


def _listening(port: int) -> set:
    """Local addresses listening on TCP ``port`` (Linux /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]) if len(addr) == 8 else addr)
    return found


def _get(url: str, headers=None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads listening sockets and environments from /proc")
def test_a_local_cluster_refuses_callers_without_the_token_and_serves_its_dashboard_on_loopback_only(
        home, monkeypatch):
    monkeypatch.setenv("RAYLANE_TOKEN", CALLERS_SECRETS["RAYLANE_TOKEN"])
    small = ClusterFile.model_validate({"name": "hardening", "head": {"cpus": 1},
                                        "nodes": [{"name": "w", "cpus": 1, "memory": "1Gi"}]})
    t0 = time.time()
    st = localcluster.up(small, port=free_port(), dashboard_port=free_port(), client_port=free_port())
    try:
        dash = st["dashboard"]
        port = int(dash.rsplit(":", 1)[1])
        headers = localcluster.auth_headers()
        deadline = time.time() + 60
        while _get(f"{dash}/api/jobs/", headers) != 200 and time.time() < deadline:
            time.sleep(0.5)
        up_s = time.time() - t0
        assert _get(f"{dash}/api/jobs/", headers) == 200
        assert _get(f"{dash}/api/jobs/") == 401
        assert _get(f"{dash}/api/jobs/", {"Authorization": "Bearer " + "0" * 64}) == 403
        assert _listening(port) == {"127.0.0.1"}
        procs = localcluster.marked_processes(localcluster.MARKER, st["marker"])
        assert len(procs) >= 4  # GCS, dashboard, two raylets and their agents
        # Ray's agents retitle themselves, which can erase the marker from their /proc environ: they are found as
        # their raylet's children, and `down` must stop every one of them (a CI run's demo once left a pair alive).
        agents = {pid: localcluster._started(pid) for pid, cmd in procs if cmd.startswith("ray::") and "Agent" in cmd}
        assert len(agents) >= 4, procs  # a DashboardAgent and a RuntimeEnvAgent per node
        secret = CALLERS_SECRETS["RAYLANE_TOKEN"].encode()
        intact = 0
        for pid, cmd in procs:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            assert secret not in raw and b"RAYLANE_TOKEN=" not in raw, cmd
            # A process that sets its title (Ray's dashboard modules) overwrites the start of this area.
            if raw.startswith(b"RAY") or b"\0RAY_AUTH_MODE=" in raw:
                intact += 1
                assert b"\0RAY_AUTH_MODE=token\0" in b"\0" + raw, cmd
        assert intact >= 3, "the GCS and the two raylets, at least, keep their environment readable"
        logs = [p for p in Path(st["temp_dirs"][0]).rglob("*.log") if p.is_file()]
        assert logs and all(mode(p) & 0o077 == 0 for p in logs)  # umask 077: Ray's logs are this user's only
        print(f"local cluster (head + 1 node) up and answering in {up_s:.1f}s")
    finally:
        localcluster.down(grace_s=5.0)
    assert localcluster.marked_processes(localcluster.MARKER, st["marker"]) == []
    alive = [pid for pid, started in agents.items() if localcluster._started(pid) == started]
    assert alive == [], f"agents of the stopped cluster still running: {alive}"
