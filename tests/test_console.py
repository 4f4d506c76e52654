"""The web console's pure parts (no Ray, no browser): logins kept server-side and forgotten when idle, the options'
errors, MLflow links, and a taken port refused before anything connects. The browser tests on a live control plane
are in tests/test_console_browser.py."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from raylane.cli_console import check_options
from raylane.console.app import Session, Sessions
from raylane.console.views import _summary, mlflow_run_url
from raylane.credentials import Credential
from raylane.errors import ValidationError


def session(user: str, t: float) -> Session:
    return Session(Credential(f"rlt_{user:0<12}_secret"), user, ("team-a",), "member", last_seen=t)


def test_a_session_is_an_opaque_id_forgotten_when_idle_or_dropped():
    s = Sessions(idle_s=60, limit=10)
    sid = s.create(session("alice", 0.0))
    assert "secret" not in sid and len(sid) >= 40  # a random id, not the token
    assert s.get(sid, now=59.0).user == "alice"
    assert s.get(sid, now=118.0).user == "alice"  # each use restarts the idle clock
    assert s.get(sid, now=179.0) is None  # idle past 60 s: gone for good
    assert s.get(sid, now=120.0) is None
    other = s.create(session("bob", 0.0))
    s.drop(other)
    assert s.get(other, now=1.0) is None and s.get(None) is None and s.get("made-up") is None


def test_past_the_limit_the_least_recently_used_session_goes():
    s = Sessions(idle_s=1e9, limit=2)
    a = s.create(session("a", 0.0))
    b = s.create(session("b", 1.0))
    s.get(a, now=2.0)  # a used after b
    c = s.create(session("c", 3.0))
    assert len(s) == 2 and s.get(b, now=4.0) is None and s.get(a, now=4.0) and s.get(c, now=4.0)


def test_every_bad_option_is_named_at_once():
    with pytest.raises(ValidationError) as err:
        check_options(70000, "mlflow.local:5000", 0.0)
    assert [e[0] for e in err.value.errors] == ["--port", "--mlflow-url", "--refresh"]
    assert "http(s) URL" in str(err.value) and "65535" in str(err.value)
    with pytest.raises(ValidationError, match="--console-port: got 0"):
        check_options(0, None, 1.0, source="raylane up", port_flag="--console-port")
    check_options(8780, "https://mlflow.example.org/ui", 0.5)


def test_mlflow_links_and_journal_lines():
    assert mlflow_run_url("http://127.0.0.1:5000/", "abc") == "http://127.0.0.1:5000/#/runs/abc"
    assert mlflow_run_url(None, "abc") is None
    assert _summary({"kind": "admitted", "placement": ["0123456789abcdef", "fedcba9876543210"], "spec": {"x": 1}}) == \
        "placement=0123456789ab, fedcba987654"


def test_a_taken_port_is_refused_before_connecting_to_ray():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "raylane.console", "--port", str(port)], capture_output=True,
                           text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"--port {port}" in p.stderr and "pick a free port" in p.stderr
