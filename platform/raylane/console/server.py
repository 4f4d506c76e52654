"""Running the web console: in the foreground (``raylane console``) or in the background beside the local cluster
(``raylane up`` starts it, ``raylane down`` stops it).

The console is one process: a Ray driver of the cluster (it finds the control actor by name) serving the ASGI app of
``raylane.console.app`` with uvicorn on 127.0.0.1 only. Started by ``raylane up`` it carries the local cluster's
marker (``raylane.localcluster.MARKER``) in its environment like every other process of the cluster, so ``raylane
down`` stops it with them; its output goes to ``~/.raylane/console.log``. Its options are checked here too
(``check_options``), for ``raylane console``, ``raylane up`` and ``python -m raylane.console`` (``main``) alike.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from raylane.errors import FatalError, RetryableError, ValidationError
from raylane.render import visible

DEFAULT_PORT = 8780
HOST = "127.0.0.1"
LOG_FILE = Path(os.path.expanduser("~")) / ".raylane" / "console.log"
START_TIMEOUT_S = 90.0

__all__ = ["DEFAULT_PORT", "serve", "start_background", "url", "bind", "check_options", "default_mlflow_url",
           "main"]


def check_options(port: int, mlflow_url: Optional[str], refresh: float, *, source: str = "raylane console",
                  port_flag: str = "--port") -> None:
    """Every problem with the console's options at once (``ValidationError`` naming option, value, allowed)."""
    errors = []
    if not 1 <= port <= 65535:
        errors.append((port_flag, port, "a TCP port from 1 to 65535"))
    if mlflow_url is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", mlflow_url):
        errors.append(("--mlflow-url", mlflow_url, "the MLflow UI's http(s) URL, like http://127.0.0.1:5000"))
    if not 0.2 <= refresh <= 60:
        errors.append(("--refresh", refresh, "seconds from 0.2 to 60"))
    if errors:
        raise ValidationError(source, errors)


def default_mlflow_url() -> Optional[str]:
    """The MLflow server runs are tracked on, when it is one (an http(s) tracking URI): its UI is on the same URL."""
    from raylane.locations import _env_uri

    uri = _env_uri() or ""
    return uri.rstrip("/") if re.match(r"https?://", uri) else None


def url(port: int) -> str:
    return f"http://{HOST}:{port}"


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port``; raises ``RetryableError`` naming the port when it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as exc:
        sock.close()
        raise RetryableError(f"--port {port}: {HOST}:{port} cannot be used ({exc.strerror}); another console or "
                             f"program listens there: pick a free port with --port") from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def _connect_ray() -> None:
    """Join the cluster as a driver: the local cluster of ``raylane up`` (with its Ray token), or ``RAY_ADDRESS``."""
    from raylane import localcluster

    localcluster.connect_driver()


def control_factory():
    """``credential -> ControlClient`` of the running control actor (found once; raises ``ControlPlaneUnavailable``
    when there is none)."""
    from raylane.control.client import ControlClient, get_control

    return ControlClient(get_control(), None, timeout=30.0).as_user


def serve(port: int = DEFAULT_PORT, mlflow_url: Optional[str] = None, refresh_s: float = 1.0) -> None:
    """Serve the console on 127.0.0.1:``port`` until interrupted (SIGINT or SIGTERM)."""
    import uvicorn

    from raylane.console.app import Console, Settings, create_app

    sock = bind(port)  # before connecting to Ray: a taken port is reported at once
    _connect_ray()
    console = Console(control_factory(), Settings(mlflow_url=mlflow_url, refresh_s=refresh_s))
    config = uvicorn.Config(create_app(console), log_level="warning", access_log=False, server_header=False,
                            lifespan="off", timeout_graceful_shutdown=2)
    print(f"raylane console on {url(port)} (authentication "
          f"{'on: log in with a token' if console.auth_enabled() else 'off'})", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


def start_background(state: Dict[str, Any], port: int = DEFAULT_PORT, mlflow_url: Optional[str] = None,
                     log_path: Path = LOG_FILE, timeout_s: float = START_TIMEOUT_S) -> str:
    """Start ``raylane console`` in the background for the local cluster described by ``state`` (``localcluster.up``'s
    result: address, marker, auth_token_path) and wait until it answers; returns its URL. Its environment is the
    cluster's (``localcluster.ray_env``: no caller credential) with the cluster's marker, so ``raylane down`` stops
    it. Raises ``RetryableError`` with the tail of its log if it exits or does not answer within ``timeout_s``."""
    from raylane import localcluster

    token_path = state.get("auth_token_path")
    env = localcluster.ray_env(Path(token_path) if token_path else None)
    env[localcluster.MARKER] = state["marker"]
    env["RAY_ADDRESS"] = state["address"]
    cmd = [sys.executable, "-m", "raylane.console", "--port", str(port)]
    if mlflow_url:
        cmd += ["--mlflow-url", mlflow_url]
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                start_new_session=True, umask=localcluster.NODE_UMASK)
    finally:
        os.close(fd)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RetryableError(f"the console exited ({proc.returncode}) before answering:\n{_tail(log_path)}")
        if healthy(port):
            return url(port)
        time.sleep(0.3)
    raise RetryableError(f"the console did not answer on {url(port)} within {timeout_s:g}s:\n{_tail(log_path)}")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"{url(port)}/healthz", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m raylane.console``: ``raylane console`` without the rest of the command line (how ``raylane up``
    starts it in the background). The same options; an error is printed as the command line prints it, with exit
    status 1 for bad options and 2 when the console cannot start (a taken port, no cluster)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m raylane.console", description="Serve the read-only web console.")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port on 127.0.0.1")
    p.add_argument("--mlflow-url", default=None, help="the MLflow UI that workload pages link runs to")
    p.add_argument("--refresh", type=float, default=1.0, help="seconds between two updates of a live page")
    args = p.parse_args(argv)
    try:
        check_options(args.port, args.mlflow_url, args.refresh)
        serve(args.port, args.mlflow_url or default_mlflow_url(), args.refresh)
    except FatalError as exc:
        print(f"error: {visible(exc, newlines=True)}", file=sys.stderr)
        return 1
    except (RetryableError, ConnectionError) as exc:
        print(f"error: {visible(exc, newlines=True)}", file=sys.stderr)
        return 2
    return 0
