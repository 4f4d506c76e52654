"""The web console in a real browser: Debian's Chromium driven by Playwright, on a live control plane (a two-node
Ray cluster with logical GPUs) with authentication on.

The console runs the way ``raylane up`` starts it (``raylane.console.server.start_background``: a process of its own
carrying the cluster's marker) and is stopped by ``raylane down``'s code. What is checked is what a user sees: a
forged or malformed token is refused at login; a member's pages load; the queue shows a submit and a cancel without
a page reload; another team's workload is redacted; the nodes page draws every GPU and marks a cordoned node; a
revoked token sends the browser back to the login page. Screenshots of each page are kept in ``.artifacts/console``
(``RAYLANE_TEST_ARTIFACTS`` moves the folder).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import urllib.request
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from raylane import localcluster  # noqa: E402
from raylane.console.app import COOKIE  # noqa: E402
from raylane.console.server import healthy, start_background  # noqa: E402
from raylane.control.client import State, start_control, stop_control  # noqa: E402
from tests.raytest import REPO, free_port, local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = pytest.mark.ray
MLFLOW_UI = "http://127.0.0.1:5000"
ARTIFACTS = Path(os.environ.get("RAYLANE_TEST_ARTIFACTS") or REPO / ".artifacts") / "console"
SCRIPT_ERRORS: list = []
UPDATE_S = 20_000  # ms a live page may take to show a change (updates come every 0.5 s; the machine may be busy)


def chromium() -> str:
    """Debian's Chromium (deploy/console/install_chromium.sh, run by `make test`), or ``$CHROMIUM``."""
    for c in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if c and os.access(c, os.X_OK):
            return c
    pytest.fail("no Chromium: run `bash deploy/console/install_chromium.sh` (as root), or set CHROMIUM=/path/to/it",
                pytrace=False)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    cluster = start_cluster(node_types={"gpu-a": "local", "gpu-b": "local"})  # priced in policies/local.yaml
    state = {"address": cluster.address, "marker": secrets.token_hex(8), "auth_token_path": None}
    state_file = tmp / "local.json"
    try:
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        ops = start_control(local_policy(), str(tmp / "journal.db"), tick_s=0.2)

        def user(name, team):
            return ops.as_user(ops.token_create(name, [team], note="console test")["token"])

        people = {"ops": ops, "alice": user("alice", "team-a"), "bob": user("bob", "team-b")}
        port = free_port()
        url = start_background(state, port, mlflow_url=MLFLOW_UI, log_path=tmp / "console.log")
        yield {"url": url, "port": port, "state": state, "state_file": state_file, "log": tmp / "console.log",
               **people}
    finally:
        stop_console(state_file, state)
        stop_control()
        stop_cluster(cluster)


def stop_console(state_file: Path, state: dict) -> None:
    """What ``raylane down`` does for the cluster ``state`` describes, with ``state_file`` as its state file: here it
    stops only the console, the one process with the cluster's marker (the test cluster's nodes have none)."""
    state_file.write_text(json.dumps({"marker": state["marker"]}))  # no address: Ray's own files are left alone
    before = localcluster.STATE_FILE
    localcluster.STATE_FILE = state_file
    try:
        localcluster.down(grace_s=5.0)
    finally:
        localcluster.STATE_FILE = before


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    exe = chromium()
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    ARTIFACTS.mkdir(parents=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True)
        yield b
        b.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def login(browser, env, who: str):
    """A browser context logged in as ``who``: its page shows the queue."""
    from playwright.sync_api import expect

    ctx = browser.new_context(viewport={"width": 1360, "height": 820})
    page = ctx.new_page()
    page.on("pageerror", lambda exc: SCRIPT_ERRORS.append(f"{page.url}: {exc}"))
    page.goto(env["url"] + "/")
    expect(page).to_have_url(env["url"] + "/login")
    page.fill("#token", env[who].credential.token)
    page.click("#login")
    expect(page.locator("#who")).to_contain_text(who)
    expect(page.locator("#live")).to_have_attribute("data-state", "live", timeout=UPDATE_S)
    return page


@pytest.fixture(scope="module")
def alice(browser, env):
    page = login(browser, env, "alice")
    yield page
    page.context.close()


@pytest.fixture(autouse=True)
def no_script_errors():
    """Every page's script ran without an uncaught error during the test."""
    SCRIPT_ERRORS.clear()
    yield
    assert not SCRIPT_ERRORS, SCRIPT_ERRORS


def status_of(url: str, cookie: str = "") -> int:
    req = urllib.request.Request(url, headers={"Cookie": f"{COOKIE}={cookie}"} if cookie else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_forged_or_malformed_token_is_refused(browser, env):
    from playwright.sync_api import expect

    ctx = browser.new_context()
    page = ctx.new_page()
    real = env["alice"].credential.token
    for token, why in ((real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB"), "not valid"),
                       ("hunter2", "malformed")):
        page.goto(env["url"] + "/login")
        page.fill("#token", token)
        page.click("#login")
        expect(page.locator("#login-error")).to_contain_text(why)
        expect(page).to_have_url(env["url"] + "/login")
    shot(page, "login-refused")
    assert not [c for c in ctx.cookies() if c["name"] == COOKIE]
    assert page.request.get(env["url"] + "/api/view?view=queue").status == 401
    assert status_of(env["url"] + "/api/view?view=queue", cookie="made-up") == 401
    # The page of another site that rebinds its name to 127.0.0.1 is refused by the Host check, and a login form
    # posted from another origin is refused whatever its token.
    assert page.request.get(env["url"] + "/healthz", headers={"Host": "evil.example"}).status == 400
    forged = page.request.post(env["url"] + "/login", form={"token": real},
                               headers={"Origin": "http://evil.example"})
    assert forged.status == 403 and "another site" in forged.text()
    assert not [c for c in ctx.cookies() if c["name"] == COOKIE]
    ctx.close()


def test_a_members_pages_load(alice, env):
    from playwright.sync_api import expect

    cookie = next(c for c in alice.context.cookies() if c["name"] == COOKIE)
    # An opaque session id: the token stays in the console's memory, out of the browser's reach and out of URLs.
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert env["alice"].credential.token not in cookie["value"]
    assert alice.evaluate("document.cookie") == ""
    expect(alice.locator("#who")).to_contain_text("team-a")
    for path, ready in (("/", "#queue, #queue-empty"), ("/teams", "#teams"), ("/nodes", "#nodes"),
                        ("/cost", "#cost, #cost-unavailable")):
        alice.goto(env["url"] + path)
        expect(alice.locator(ready)).to_be_visible(timeout=UPDATE_S)
    alice.goto(env["url"] + "/teams")
    for team in ("team-a", "team-b"):
        expect(alice.locator(f'#teams tr[data-team="{team}"][data-resource="gpu"]')).to_be_visible()
    expect(alice.locator('#teams tr[data-team="team-a"] td').nth(4)).to_have_text("2")  # nominal GPUs
    # Spend this month against the budget (policies/local.yaml: 200): shown for one's own teams only.
    expect(alice.locator('#teams tr[data-team="team-a"] td.budget')).to_contain_text("of 200.00", timeout=UPDATE_S)
    expect(alice.locator('#teams tr[data-team="team-b"] td.budget')).to_have_text("n/a")
    alice.goto(env["url"] + "/cost")
    expect(alice.locator("#cost-totals")).to_contain_text("Idle GPUs", timeout=UPDATE_S)
    alice.select_option("#cost-window", "month")
    expect(alice.locator("#cost-window")).to_have_value("month", timeout=UPDATE_S)
    bad = alice.request.get(env["url"] + "/api/view?view=secrets")
    assert bad.status == 400 and "view" in bad.json()["error"] and "queue" in bad.json()["error"]


def test_the_queue_follows_a_submit_and_a_cancel_without_a_reload(alice, env):
    from playwright.sync_api import expect

    a = env["alice"]
    alice.goto(env["url"] + "/")
    expect(alice.locator("#live")).to_have_attribute("data-state", "live", timeout=UPDATE_S)
    alice.evaluate("window.stillTheSamePage = true")
    first = a.submit(spec("console-one", "team-a", "finetune", workers=1, gpu=1)).id
    row = alice.locator(f'#queue tr[data-id="{first}"]')
    expect(row).to_be_visible(timeout=UPDATE_S)
    expect(row.locator(".state")).to_have_text("ADMITTED", timeout=UPDATE_S)
    expect(row.locator(".owner")).to_have_text("alice")
    # Team A may hold 2 + 2 borrowed GPUs: a 4-GPU gang beside the first one waits, with its position and reason.
    big = a.submit(spec("console-big", "team-a", "pretrain", workers=2, gpu=2)).id
    waiting = alice.locator(f'#queue tr[data-id="{big}"]')
    expect(waiting.locator(".state")).to_have_text("PENDING", timeout=UPDATE_S)
    expect(waiting.locator(".pos")).to_have_text("1")
    expect(waiting.locator(".reason")).to_contain_text("team-a", timeout=UPDATE_S)
    # Its forecast start: when the first one is expected to end (the class default runtime, 10 minutes), within
    # the control plane's forecast cadence (10 s).
    expect(waiting.locator(".eta")).to_have_text(re.compile(r"^~(9|10)m$"), timeout=UPDATE_S + 10_000)
    theirs = env["bob"].submit(spec("bob-finetune", "team-b", "finetune", workers=1, gpu=1)).id
    expect(alice.locator(f'#queue tr[data-id="{theirs}"] .owner')).to_have_text("hidden", timeout=UPDATE_S)
    shot(alice, "queue")
    env["bob"].cancel(theirs)
    a.cancel(first)
    expect(row).to_have_count(0, timeout=UPDATE_S)
    expect(waiting.locator(".state")).to_have_text("ADMITTED", timeout=UPDATE_S)
    assert alice.evaluate("window.stillTheSamePage") is True  # updated in place, never reloaded
    alice.check("#show-done")
    expect(row.locator(".state")).to_have_text("CANCELLED", timeout=UPDATE_S)
    a.cancel(big)
    wait_for(lambda: all(r.terminal for r in env["ops"].queue(True)), what="both cancelled")


def test_another_teams_workload_is_redacted_and_ones_own_shows_its_journal(alice, env):
    from playwright.sync_api import expect

    theirs = env["bob"].submit(spec("bob-eval", "team-b", "finetune", workers=1, gpu=1)).id
    mine = env["alice"].submit(spec("alice-tune", "team-a", "finetune", workers=1, gpu=1)).id
    env["alice"].event(mine, "MLflow run 0123abcd", mlflow_run_id="0123abcd")
    alice.goto(env["url"] + "/")
    row = alice.locator(f'#queue tr[data-id="{theirs}"]')
    expect(row).to_have_class(re.compile(r"\bredacted\b"), timeout=UPDATE_S)
    expect(row.locator(".owner")).to_have_text("hidden")
    expect(alice.locator(f'#queue tr[data-id="{mine}"] .owner')).to_have_text("alice")

    alice.goto(f"{env['url']}/workload/{theirs}")
    expect(alice.locator("#redacted")).to_be_visible(timeout=UPDATE_S)
    expect(alice.locator("#facts")).to_contain_text("team-b")
    expect(alice.locator("#journal")).to_have_count(0)
    shot(alice, "workload-redacted")
    # The API wants the session's secret besides its cookie (the page sends it from this tab's sessionStorage).
    secret = alice.evaluate("() => sessionStorage.getItem('raylane-session-secret')")
    assert alice.request.get(f"{env['url']}/api/view?view=workload&id={theirs}").status == 401  # the cookie alone
    api = alice.request.get(f"{env['url']}/api/view?view=workload&id={theirs}",
                            headers={"X-Raylane-CSRF": secret}).json()
    assert api["workload"]["redacted"] and api["journal"] == [] and "spec" not in api["workload"]

    alice.goto(f"{env['url']}/workload/{mine}")
    expect(alice.locator('#journal tr[data-kind="submitted"]')).to_be_visible(timeout=UPDATE_S)
    expect(alice.locator('#journal tr[data-kind="admitted"]')).to_be_visible(timeout=UPDATE_S)
    link = alice.locator("#mlflow-0123abcd")
    expect(link).to_have_attribute("href", f"{MLFLOW_UI}/#/runs/0123abcd")
    shot(alice, "workload")
    for wid, who in ((theirs, "bob"), (mine, "alice")):
        env[who].cancel(wid)


def test_the_nodes_page_draws_every_gpu_and_marks_a_cordoned_node(alice, env):
    from playwright.sync_api import expect

    ops = env["ops"]
    held = env["alice"].submit(spec("alice-gang", "team-a", "pretrain", workers=2, gpu=1))
    theirs = env["bob"].submit(spec("bob-serve", "team-b", "finetune", workers=1, gpu=1))
    wait_for(lambda: all(ops.status(w.id).state is State.ADMITTED for w in (held, theirs)), what="both admitted")
    alice.goto(env["url"] + "/nodes")
    expect(alice.locator("#nodes .gpu")).to_have_count(4, timeout=UPDATE_S)  # two nodes of two logical GPUs
    expect(alice.locator('#nodes .gpu.held[data-team="team-a"]')).to_have_count(2, timeout=UPDATE_S)
    expect(alice.locator('#nodes .gpu.held[data-team="team-b"]')).to_have_count(1, timeout=UPDATE_S)
    expect(alice.locator("#gpu-summary")).to_have_text("3 of 4 GPUs leased")
    node = next(n["id"] for n in ops.nodes() if n["gpus_total"])
    ops.node_cordon(node, reason="console test: cordoned")  # no new leases there; what runs there goes on
    try:
        card = alice.locator(f'#nodes .node[data-node="{node}"]')
        expect(card).to_have_attribute("data-state", "cordoned", timeout=UPDATE_S)
        expect(card.locator(".badge")).to_have_text("cordoned")
        expect(card.locator(".node-reason")).to_contain_text("console test: cordoned")
        shot(alice, "nodes")
    finally:
        ops.node_uncordon(node)
    expect(card).to_have_attribute("data-state", "ready", timeout=UPDATE_S)
    alice.goto(env["url"] + "/teams")
    expect(alice.locator('#teams tr[data-team="team-a"] td.used')).to_have_text("2", timeout=UPDATE_S)
    expect(alice.locator('#teams tr[data-team="team-b"] td.used')).to_have_text("1")
    shot(alice, "teams")
    alice.goto(env["url"] + "/cost")
    expect(alice.locator('#cost-team tr[data-key="team-a"]')).to_be_visible(timeout=UPDATE_S)
    expect(alice.locator('#cost-team tr[data-key="team-b"]')).to_have_count(0)  # a member sees their teams' spend
    shot(alice, "cost")
    env["alice"].cancel(held.id)
    env["bob"].cancel(theirs.id)


def test_a_revoked_token_sends_the_browser_back_to_the_login_page(browser, env):
    from playwright.sync_api import expect

    ops = env["ops"]
    made = ops.token_create("carol", ["team-a"], note="console test: revoked while logged in")
    env["carol"] = ops.as_user(made["token"])
    page = login(browser, env, "carol")
    ops.token_revoke(made["id"])
    expect(page).to_have_url(env["url"] + "/login", timeout=UPDATE_S)
    # The session ended with its token: its cookie now opens nothing (not even a refusal naming the token).
    after = page.request.get(env["url"] + "/api/view?view=queue")
    assert after.status == 401 and after.json()["error"] == "not logged in"
    page.context.close()


def test_raylane_down_stops_the_console_and_after_a_restart_the_page_asks_for_a_login(alice, env):
    from playwright.sync_api import expect

    alice.goto(env["url"] + "/")
    expect(alice.locator("#live")).to_have_attribute("data-state", "live", timeout=UPDATE_S)
    marker = env["state"]["marker"]
    assert localcluster.marked_processes(localcluster.MARKER, marker)
    stop_console(env["state_file"], env["state"])
    assert not healthy(env["port"])
    assert localcluster.marked_processes(localcluster.MARKER, marker) == []
    expect(alice.locator("#live")).not_to_have_attribute("data-state", "live", timeout=UPDATE_S)
    # `raylane up` again: the page reconnects by itself; its session died with the old console, so it logs in again.
    start_background(env["state"], env["port"], mlflow_url=MLFLOW_UI, log_path=env["log"])
    expect(alice).to_have_url(env["url"] + "/login", timeout=UPDATE_S)
