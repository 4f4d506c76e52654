"""The web console's pure parts (no Ray, no browser): logins kept server-side and forgotten when idle, the options'
errors, MLflow links, and a taken port refused before anything connects. The browser tests on a live control plane
are in tests/console/test_console_browser.py."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from raylane.cli.console import check_options
from raylane.console.app import Session, Sessions
from raylane.console.views import _summary, mlflow_run_url
from raylane.credentials import Credential
from raylane.errors import AuthenticationError, ValidationError


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


# ------------------------------------------------------------------ a session is a cookie and a secret (issue 44)
# The console's ASGI app driven in process (no Ray, no browser, no HTTP client library): a fake control plane that
# knows one token, alice's.
ALICE = "rlt_" + "a" * 12 + "_" + "s" * 43
OWN = "http://127.0.0.1:8780"


REVOKED = set()


class FakeControl:
    def __init__(self, credential):
        self.credential = credential

    def whoami(self):
        if self.credential is None or self.credential.token != ALICE or ALICE in REVOKED:
            raise AuthenticationError("no such token")
        return {"user": "alice", "teams": ["team-a"], "role": "member", "auth": True, "token_id": "a" * 12}


def asgi(app, method: str, path: str, headers=(), body: bytes = b""):
    """(status, headers, body) of one request to ``app``, Host 127.0.0.1:8780."""
    import asyncio
    import urllib.parse

    url = urllib.parse.urlsplit(path)
    scope = {"type": "http", "method": method, "path": url.path, "raw_path": url.path.encode(),
             "query_string": url.query.encode(), "scheme": "http", "server": ("127.0.0.1", 8780),
             "client": ("127.0.0.1", 50000), "http_version": "1.1", "root_path": "",
             "headers": [(b"host", b"127.0.0.1:8780")] + [(k.lower().encode(), v.encode()) for k, v in headers]}
    got = {"status": None, "headers": {}, "body": b""}
    sent = [False]

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            got["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            got["body"] += message.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return got["status"], got["headers"], got["body"]


@pytest.fixture
def app():
    from raylane.console.app import Console, create_app

    console = Console(FakeControl)
    return console, create_app(console)


def log_in(app_, origin=OWN):
    form = ("token=" + ALICE).encode()
    headers = [("content-type", "application/x-www-form-urlencoded")] + ([("origin", origin)] if origin else [])
    return asgi(app_, "POST", "/login", headers, form)


def session_of(login_headers):
    from raylane.console.app import COOKIE

    cookie = login_headers["set-cookie"].split(";")[0]
    assert cookie.startswith(COOKIE + "=")
    secret = login_headers["location"].split("#s=", 1)[1]
    return cookie, secret


def test_login_hands_the_page_a_secret_in_the_fragment_only(app):
    console, a = app
    status, headers, _ = log_in(a)
    assert status == 303 and headers["location"].startswith("/#s=")
    cookie, secret = session_of(headers)
    assert secret not in cookie and len(secret) >= 40 and ALICE not in headers["location"]
    (s,) = console.sessions._by_id.values()
    assert s.secret == secret and secret not in repr(s)


# name -> (the headers beside the cookie, the stream's query, the status of /api/whoami, of /api/stream)
REPLAYS = {
    "the page: cookie and secret": (lambda sec: [("x-raylane-csrf", sec)], lambda sec: f"&csrf={sec}", 200, None),
    "a replayed cookie alone": (lambda sec: [], lambda sec: "", 401, 401),
    "a wrong secret": (lambda sec: [("x-raylane-csrf", sec[:-1] + "x")], lambda sec: "&csrf=" + sec[:-1] + "x",
                       401, 401),
    "an empty secret": (lambda sec: [("x-raylane-csrf", "")], lambda sec: "&csrf=", 401, 401),
    "another session's secret": (lambda sec: [("x-raylane-csrf", "other")], lambda sec: "&csrf=other", 401, 401),
}


@pytest.mark.parametrize("name", list(REPLAYS))
def test_a_cookie_without_its_sessions_secret_reads_nothing(app, name):
    console, a = app
    cookie, secret = session_of(log_in(a)[1])
    headers, query, whoami_status, stream_status = REPLAYS[name]
    status, _, body = asgi(a, "GET", "/api/whoami", [("cookie", cookie)] + headers(secret))
    assert status == whoami_status, body
    if status == 200:
        assert json.loads(body)["user"] == "alice"
    else:
        assert b"alice" not in body and b"secret is missing or wrong" in body and b'"login"' in body
        assert len(console.sessions) == 1  # the cookie's thief cannot log its owner out either
    if stream_status is not None:  # the stream (an EventSource sends no headers): the secret in its query
        status, _, body = asgi(a, "GET", "/api/stream?view=queue" + query(secret), [("cookie", cookie)])
        assert status == stream_status and b"alice" not in body


def test_the_streams_secret_may_come_in_its_query_the_apis_only_in_the_header(app):
    from raylane.console.app import NoSecret
    from starlette.requests import Request

    console, a = app
    cookie, secret = session_of(log_in(a)[1])

    def request(query: str, headers=()):
        return Request({"type": "http", "method": "GET", "path": "/api/stream", "query_string": query.encode(),
                        "headers": [(b"cookie", cookie.encode())] + list(headers)})

    assert console.client_for(request(f"view=queue&csrf={secret}"), secret_in_query=True).whoami()["user"] == "alice"
    with pytest.raises(NoSecret):
        console.client_for(request(f"view=queue&csrf={secret}"))


# name -> (Origin, Sec-Fetch-Site, refused)
ORIGINS = {
    "the console's own page": (OWN, "same-origin", False),
    "no browser (curl)": (None, None, False),
    "typed in the address bar": (None, "none", False),
    "another port of 127.0.0.1": ("http://127.0.0.1:9999", "same-site", True),
    "localhost for 127.0.0.1": ("http://localhost:8780", "same-site", True),
    "another site": ("http://evil.example", "cross-site", True),
    "an opaque origin": ("null", "cross-site", True),
    "Sec-Fetch-Site only, same-site": (None, "same-site", True),
}


@pytest.mark.parametrize("name", list(ORIGINS))
def test_a_logout_from_another_origin_is_refused(app, name):
    console, a = app
    cookie, secret = session_of(log_in(a)[1])
    origin, site, refused = ORIGINS[name]
    headers = [("cookie", cookie)] + ([("origin", origin)] if origin else []) + (
        [("sec-fetch-site", site)] if site else [])
    status, out, body = asgi(a, "POST", "/logout", headers)
    if refused:
        assert status == 403 and b"another site" in body
        assert len(console.sessions) == 1
        assert asgi(a, "GET", "/api/whoami", [("cookie", cookie), ("x-raylane-csrf", secret)])[0] == 200
    else:
        assert status == 303 and out["location"] == "/login" and len(console.sessions) == 0


@pytest.mark.parametrize("name", [n for n, (_, _, refused) in ORIGINS.items() if refused])
def test_a_login_from_another_origin_is_refused(app, name):
    console, a = app
    origin, site, _ = ORIGINS[name]
    headers = [("content-type", "application/x-www-form-urlencoded")] + (
        [("origin", origin)] if origin else []) + ([("sec-fetch-site", site)] if site else [])
    status, out, body = asgi(a, "POST", "/login", headers, ("token=" + ALICE).encode())
    assert status == 403 and b"another site" in body and "set-cookie" not in out and len(console.sessions) == 0


def test_the_page_sends_the_secret_with_every_call_and_stream():
    from raylane.console.app import STATIC

    js = (STATIC / "app.js").read_text()
    assert "sessionStorage" in js and '"X-Raylane-CSRF": secret()' in js and "csrf: secret()" in js
    calls = [line for line in js.splitlines() if "fetch(" in line]
    assert calls == ['  return fetch(path, {credentials: "same-origin", headers: {"X-Raylane-CSRF": secret()}});']
    assert "history.replaceState" in js  # the fragment leaves the address bar


def test_a_revoked_token_still_ends_its_session(app):
    console, a = app
    cookie, secret = session_of(log_in(a)[1])
    REVOKED.add(ALICE)
    try:
        status, _, body = asgi(a, "GET", "/api/whoami", [("cookie", cookie), ("x-raylane-csrf", secret)])
        assert status == 401 and b"no such token" in body and len(console.sessions) == 0
    finally:
        REVOKED.discard(ALICE)
