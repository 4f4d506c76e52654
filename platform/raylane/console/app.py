"""The web console's ASGI app: logins, pages, JSON reads and a stream of snapshots for live updates.

What it owns: the browser sessions of one console process (``Sessions``: an opaque id, the value of an HttpOnly,
SameSite=Strict cookie, mapped to the user's credential in this process's memory only; the token never travels back
to the browser, never appears in a URL and is never logged) and the HTTP surface.

A cookie alone does not make a session: cookies are not kept apart by port, so a program listening on another
loopback port of the browser's machine receives the console's cookie with any request the browser makes to it, and
could replay it. Each session therefore also has a *secret* (``Session.secret``), handed to the page once, at login,
in the fragment of the redirect (``/#s=...``: never sent to a server, never in a Referer); the page keeps it in the
tab's ``sessionStorage`` (per origin, so per port) and sends it with every API call (header ``X-Raylane-CSRF``) and
stream (query ``csrf``: an EventSource sends no headers). A call without it is answered 401 and changes nothing (the
session is not dropped: the cookie's thief cannot log its owner out either). A POST (``/login``, ``/logout``) whose
``Origin`` or ``Sec-Fetch-Site`` says it comes from another origin, another port of 127.0.0.1 included, is refused
with 403. It changes nothing in the control
plane: every route is a read, and every read is a control-plane call made with the browser user's own credential,
so the gate's authentication, authorization and redaction apply exactly as they do for ``raylane queue``. The
console holds no credential of its own. With authentication off on the control plane there is no login.

Routes: pages (``/``, ``/teams``, ``/nodes``, ``/cost``, ``/workload/ID``: one HTML shell, rendered by
``static/app.js``), ``/login`` and ``/logout``, ``/api/<view>`` (JSON), ``/api/stream?view=...`` (Server-Sent
Events: a snapshot of the view every ``refresh_s``), ``/healthz``.

Words: *view* is what one page shows (queue, teams, nodes, cost, workload); a *snapshot* is a view's JSON at one
moment, built by ``raylane.console.views`` from control-plane calls.
"""
from __future__ import annotations

import asyncio
import hmac
import html
import json
import re
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from raylane.console import views
from raylane.credentials import Credential
from raylane.errors import AuthenticationError, NotFoundError, PermissionDeniedError, ValidationError

STATIC = Path(__file__).parent / "static"
COOKIE = "raylane_console"
# The header (API calls) and the query parameter (the stream) that carry a session's secret.
SECRET_HEADER = "X-Raylane-CSRF"
SECRET_PARAM = "csrf"
# Host headers the console answers: a page of another site that rebinds its DNS name to 127.0.0.1 is refused.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SESSION_IDLE_S = 8 * 3600.0
MAX_SESSIONS = 1000
TOKEN_MAX = 200
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # not "no-referrer": Chromium then sends "Origin: null" with the login form
    "Cache-Control": "no-store",
}
PAGES = ("/", "/queue", "/teams", "/nodes", "/cost")


@dataclass(frozen=True)
class Settings:
    """How a console runs. ``mlflow_url``: the MLflow UI that workload pages link runs to (None: no links);
    ``refresh_s``: seconds between two snapshots of a live page."""

    mlflow_url: Optional[str] = None
    refresh_s: float = 1.0
    session_idle_s: float = SESSION_IDLE_S


@dataclass
class Session:
    credential: Credential
    user: str
    teams: Tuple[str, ...]
    role: str
    last_seen: float = field(default_factory=time.time)
    # What the page sends beside the cookie (module docstring): a cookie replayed without it reads nothing.
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)


class Sessions:
    """Logins of this console: session id -> the user's credential, in memory only (a restart logs everyone out).
    A session unused for ``idle_s`` (no page open, no request) is gone; past ``limit`` sessions the least recently
    used one is dropped. Thread-safe: the app reads it from its event loop and from its worker threads."""

    def __init__(self, idle_s: float = SESSION_IDLE_S, limit: int = MAX_SESSIONS):
        self.idle_s, self.limit = idle_s, limit
        self._by_id: Dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, session: Session) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[sid] = session
            while len(self._by_id) > self.limit:
                oldest = min(self._by_id, key=lambda k: self._by_id[k].last_seen)
                del self._by_id[oldest]
        return sid

    def get(self, sid: Optional[str], now: Optional[float] = None) -> Optional[Session]:
        now = time.time() if now is None else now
        with self._lock:
            s = self._by_id.get(sid or "")
            if s is None:
                return None
            if now - s.last_seen > self.idle_s:
                del self._by_id[sid]
                return None
            s.last_seen = now
            return s

    def drop(self, sid: Optional[str]) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)

    def __len__(self) -> int:
        return len(self._by_id)


class NotLoggedIn(Exception):
    pass


class NoSecret(NotLoggedIn):
    """A session's cookie without the session's secret (a replayed cookie, or a tab the login did not give it)."""


class Console:
    """One console: its settings, its sessions, and the control plane it reads (``control(credential)`` returns a
    ``ControlClient`` calling with that credential; None: no credential, for a control plane without auth)."""

    def __init__(self, control: Callable[[Optional[Credential]], Any], settings: Settings = Settings()):
        self.control = control
        self.settings = settings
        self.sessions = Sessions(settings.session_idle_s)
        self._auth: Optional[bool] = None

    # --------------------------------------------------------------------------------------------- who
    def auth_enabled(self) -> bool:
        """Whether the control plane wants credentials, asked once (a call without one is refused, and audited, when
        it does; the answer is kept so the audit trail gets one such row per console start)."""
        if self._auth is None:
            try:
                self._auth = bool(self.control(None).whoami().get("auth", True))
            except AuthenticationError:
                self._auth = True
        return self._auth

    def client_for(self, request: Request, *, secret_in_query: bool = False):
        """The control-plane client of the request's session: its cookie and its secret (``SECRET_HEADER``; the
        stream's ``SECRET_PARAM`` with ``secret_in_query``). Raises ``NotLoggedIn`` (``NoSecret``)."""
        if not self.auth_enabled():
            return self.control(None)
        s = self.sessions.get(request.cookies.get(COOKIE))
        if s is None:
            raise NotLoggedIn()
        given = request.headers.get(SECRET_HEADER)
        if given is None and secret_in_query:
            given = request.query_params.get(SECRET_PARAM)
        if not given or not hmac.compare_digest(given.encode("utf-8", "replace"), s.secret.encode()):
            raise NoSecret()
        return self.control(s.credential)

    def login(self, token: str) -> Tuple[str, Session]:
        """A new session for ``token`` once the control plane accepts it (raises ``AuthenticationError``)."""
        cred = Credential(token)
        who = self.control(cred).whoami()
        s = Session(cred, who["user"], tuple(who.get("teams") or ()), who.get("role", ""))
        return self.sessions.create(s), s


# ------------------------------------------------------------------------------------------------ responses
def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data, default=str), status_code=status, media_type="application/json")


def _error(exc: BaseException) -> Response:
    """A control-plane refusal as the JSON a page shows: 401 (log in again), 403, 404, 400, 503."""
    if isinstance(exc, NoSecret):
        return _json({"error": f"this session's secret is missing or wrong ({SECRET_HEADER}: the console's page "
                               f"sends it; log in again in this tab)", "login": "/login"}, 401)
    if isinstance(exc, NotLoggedIn):
        return _json({"error": "not logged in", "login": "/login"}, 401)
    if isinstance(exc, AuthenticationError):
        return _json({"error": str(exc), "login": "/login"}, 401)
    if isinstance(exc, PermissionDeniedError):
        return _json({"error": str(exc)}, 403)
    if isinstance(exc, NotFoundError):
        return _json({"error": str(exc)}, 404)
    if isinstance(exc, ValidationError):
        return _json({"error": str(exc)}, 400)
    return _json({"error": f"the control plane cannot be reached: {type(exc).__name__}: {exc}"}, 503)


def _bad(field_name: str, value: Any, allowed: str) -> Response:
    return _json({"error": str(ValidationError("console request", [(field_name, value, allowed)]))}, 400)


def _page(name: str, status: int = 200, error: str = "") -> HTMLResponse:
    text = (STATIC / name).read_text()
    text = text.replace("<!--ERROR-->", f'<p class="error" id="login-error">{html.escape(error)}</p>' if error else "")
    return HTMLResponse(text, status_code=status)


def _params(request: Request) -> Tuple[Optional[Dict[str, Any]], Optional[Response]]:
    """The view and its arguments from the query string, or a 400 naming the bad field."""
    q = request.query_params
    view = q.get("view", "")
    if view not in views.VIEWS:
        return None, _bad("view", view, f"one of {', '.join(views.VIEWS)}")
    args: Dict[str, Any] = {}
    if view == "queue":
        done = q.get("all", "0")
        if done not in ("0", "1"):
            return None, _bad("all", done, "0 or 1")
        args["include_done"] = done == "1"
    if view == "cost":
        window = q.get("window", "all")
        if window not in views.COST_WINDOWS:
            return None, _bad("window", window[:100], f"one of {', '.join(views.COST_WINDOWS)}")
        args["window"] = window
    if view == "workload":
        wid = q.get("id", "")
        if not re.fullmatch(views.WORKLOAD_ID, wid):
            return None, _bad("id", wid[:200], "a workload id (letters, digits, '.', '_', '-'; at most 160)")
        args["workload_id"] = wid
    return {"view": view, **args}, None


def foreign_origin(request: Request) -> Optional[str]:
    """The other origin a state-changing request comes from, or None when it comes from the console's own pages
    (or from no browser: curl sends neither header; a browser sends ``Origin`` with every POST, and
    ``Sec-Fetch-Site``). Another port of 127.0.0.1 is another origin."""
    own = f"{request.url.scheme}://{request.url.netloc}"
    origin = request.headers.get("origin")
    if origin is not None and origin != own:
        return origin[:100]
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site[:20]} page"
    return None


async def _form_token(request: Request) -> str:
    """The ``token`` field of the login form (urlencoded, as a plain HTML form posts it; a body past 4 KiB is not a
    token). Parsed here: Starlette's own form parser needs python-multipart, which Ray does not install."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return ""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > 4096:
            return ""
    values = urllib.parse.parse_qs(body.decode("utf-8", errors="replace")).get("token") or [""]
    return values[0].strip()


def create_app(console: Console) -> Starlette:
    """The ASGI app of ``console``; it answers only requests whose Host is a loopback name."""

    async def call(fn, *args, **kw):
        return await run_in_threadpool(fn, *args, **kw)

    async def snapshot(request: Request, params: Dict[str, Any], stream: bool = False) -> Dict[str, Any]:
        client = await call(console.client_for, request, secret_in_query=stream)
        return await call(views.build, client, console.settings, **params)

    def failed(request: Request, exc: BaseException) -> Response:
        if isinstance(exc, AuthenticationError):  # revoked or expired since the login: the session ends with it
            console.sessions.drop(request.cookies.get(COOKIE))
        return _error(exc)

    # ----------------------------------------------------------------------------------------- pages
    async def page(request: Request) -> Response:
        try:
            auth = await call(console.auth_enabled)
        except Exception as exc:  # noqa: BLE001 - Ray's own errors too: the control plane is away
            return _error(exc)
        if auth and console.sessions.get(request.cookies.get(COOKIE)) is None:
            return RedirectResponse("/login", status_code=303)
        return _page("index.html")

    async def workload_page(request: Request) -> Response:
        if not re.fullmatch(views.WORKLOAD_ID, request.path_params["wid"]):
            return _bad("workload id", request.path_params["wid"][:200], "letters, digits, '.', '_', '-'")
        return await page(request)

    async def login_page(request: Request) -> Response:
        if not await call(console.auth_enabled):
            return RedirectResponse("/", status_code=303)
        return _page("login.html")

    async def login(request: Request) -> Response:
        origin = foreign_origin(request)
        if origin is not None:
            return _page("login.html", 403, f"refused: a login form of another site ({origin})")
        token = await _form_token(request)
        if not token:
            return _page("login.html", 401, "paste your token (rlt_...): `raylane token create` makes one")
        if len(token) > TOKEN_MAX:
            return _page("login.html", 401, f"that is not a token: {len(token)} characters (tokens are shorter)")
        try:
            sid, s = await call(console.login, token)
        except AuthenticationError as exc:
            return _page("login.html", 401, f"refused: {exc}")
        except Exception as exc:  # noqa: BLE001 - the control plane is away
            return _page("login.html", 503, f"the control plane cannot be reached: {type(exc).__name__}")
        # The secret in the fragment: the page reads it and takes it out of the address bar (static/app.js).
        out = RedirectResponse(f"/#s={s.secret}", status_code=303)
        # A browser-session cookie (no max-age): the console forgets an idle session itself (Sessions).
        out.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/")
        return out

    async def logout(request: Request) -> Response:
        origin = foreign_origin(request)
        if origin is not None:  # another site (another port) logging the user out
            return _json({"error": f"refused: a logout from another site ({origin})"}, 403)
        console.sessions.drop(request.cookies.get(COOKIE))
        out = RedirectResponse("/login", status_code=303)
        out.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return out

    # ------------------------------------------------------------------------------------------ data
    async def api_whoami(request: Request) -> Response:
        try:
            client = await call(console.client_for, request)
            who = await call(client.whoami)
        except Exception as exc:  # noqa: BLE001
            return failed(request, exc)
        who.pop("token_id", None)
        return _json({**who, "mlflow_url": console.settings.mlflow_url, "refresh_s": console.settings.refresh_s})

    async def api_view(request: Request) -> Response:
        params, bad = _params(request)
        if bad is not None:
            return bad
        try:
            return _json(await snapshot(request, params))
        except Exception as exc:  # noqa: BLE001
            return failed(request, exc)

    async def stream(request: Request) -> Response:
        params, bad = _params(request)
        if bad is not None:
            return bad
        try:
            await call(console.client_for, request, secret_in_query=True)
        except Exception as exc:  # noqa: BLE001
            return _error(exc)

        async def events():
            yield "retry: 2000\n\n"
            while not await request.is_disconnected():
                try:
                    snap = await snapshot(request, params, stream=True)
                    yield f"event: snapshot\ndata: {json.dumps(snap, default=str)}\n\n"
                except (NotLoggedIn, AuthenticationError) as exc:
                    failed(request, exc)
                    yield f"event: logout\ndata: {json.dumps({'error': str(exc) or 'not logged in'})}\n\n"
                    return
                except Exception as exc:  # noqa: BLE001 - shown on the page; the stream goes on
                    body = json.loads(_error(exc).body)
                    yield f"event: failure\ndata: {json.dumps(body)}\n\n"
                await asyncio.sleep(console.settings.refresh_s)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    async def healthz(request: Request) -> Response:
        try:
            await call(console.auth_enabled)
        except Exception as exc:  # noqa: BLE001
            return _json({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 503)
        return _json({"ok": True, "auth": console._auth, "sessions": len(console.sessions)})

    routes = [Route(p, page) for p in PAGES] + [
        Route("/workload/{wid:str}", workload_page),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/api/whoami", api_whoami),
        Route("/api/view", api_view),
        Route("/api/stream", stream),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS)),
                                                Middleware(SecurityHeaders)])


class SecurityHeaders:
    """``HEADERS`` on every response (pages, JSON, the stream, static files): no framing, no inline scripts, no
    caching, no referrer."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode(), v.encode()) for k, v in HEADERS.items() if k.lower().encode() not in have]
                message = {**message, "headers": list(message.get("headers", [])) + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)


__all__ = ["Console", "Settings", "Sessions", "Session", "create_app", "foreign_origin", "COOKIE", "SECRET_HEADER",
           "SECRET_PARAM"]
