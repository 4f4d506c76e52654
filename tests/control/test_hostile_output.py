"""No tenant's input drives another user's screen or breaks a call (issue 44, item 3; CONVENTIONS 19). No Ray.

Hostile strings (terminal control sequences, bidi overrides, rich markup) go through each front end that shows
what users sent (``raylane queue`` as a table and as plain columns, ``explain``, ``audit``, ``token list``, ``node
list``, a refusal's error line, the web console's ``shown``): the output holds no hidden character, shows the markup
as typed, and the command succeeds. JSON output is the data unchanged. Over-deep arguments are refused with a typed,
audited error, and ``wait_admission`` is for the workload's team only, for a bounded time.
"""
from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import time
from typing import Any, Dict, List

import pytest
from rich.console import Console
from typer.testing import CliRunner

from raylane import cli
from raylane.cli import auth, cluster, common, nodes
from raylane.console.app import STATIC
from raylane.control import api
from raylane.errors import NotFoundError, PermissionDeniedError, ValidationError
from raylane.render import visible
from tests.controltest import Harness
from tests.raytest import local_policy, spec

# name -> a string a user could send (a driver's detail, a journal note, a token note, a made-up workload id).
HOSTILE: Dict[str, str] = {
    "sgr colour": "\x1b[31mred\x1b[0m",
    "csi clear screen": "\x1b[2J\x1b[H",
    "osc 8 link": "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",
    "osc window title": "\x1b]0;pwned\x07",
    "8-bit csi": "\x9b2J",
    "bidi override": "abc\u202edcba",
    "bidi isolate": "\u2067x\u2069y",
    "zero width space": "a\u200bb",
    "forged row": "ok\nw-fake  team-a  RUNNING",
    "carriage return": "shown\rhidden",
    "backspace bell del": "a\x08b\x07c\x7f",
    "markup close tag": "[/x]",
    "markup link": "[link=http://evil.example]click[/link]",
    "markup style": "[bold red]loud[/]",
    "emoji code": "alarm :warning: here",
    "trailing backslash": "oops\\",
}
MARKUP = {k: HOSTILE[k] for k in ("markup close tag", "markup link", "markup style", "emoji code", "trailing backslash")}
CASES = pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))


def safe(out: str) -> bool:
    """Nothing in ``out`` but printable characters and line breaks: no ESC, C0/C1 control, bidi or zero-width
    character survived."""
    return all(c.isprintable() or c == "\n" for c in out)


def flat(out: str) -> str:
    """``out`` without the table's borders, padding and line breaks, so a cell folded over lines reads whole."""
    return "".join(c for c in out if c not in " \n│┃║|")


def shows(out: str, text: str, newlines: bool = False) -> bool:
    """Whether ``text`` appears in ``out`` as typed (each hidden character as its escape)."""
    return flat(visible(text, newlines=newlines)) in flat(out)


# ------------------------------------------------------------------------------------------ the CLI's tables
def queue_row(wid: str = "w-1", **kw) -> Dict[str, Any]:
    return {"id": wid, "team": "team-a", "class": "pretrain", "state": "PENDING", "resources": "1 x (1 GPU)",
            "waited_s": 3.0, "position": 1, "reason": "", "detail": None, **kw}


class FakeClient:
    """What a command reads from the control plane, carrying ``text`` wherever a user's string can be."""

    def __init__(self, text: str):
        self.text = text

    def queue(self, include_done=False):
        return [queue_row(detail=self.text), queue_row("w-2", reason=self.text, state="RUNNING", position=None)]

    def info(self):
        return {"stranded_gpus": {self.text: 1.0}, "free_gpus": {self.text: 2.0}}

    def cohorts(self):
        return []

    def explain(self, workload_id):
        return {"id": workload_id, "team": "team-a", "class": "pretrain", "state": "PENDING", "owner": self.text,
                "reason": self.text, "position": 1, "preemptions": 0, "restarts": 0, "step": None,
                "detail": self.text, "journal": [{"ts": time.time(), "kind": "event", "note": self.text}]}

    def audit(self, **kw):
        return [{"ts": time.time(), "user": None, "role": None, "token_id": "malformed", "action": "explain",
                 "target": self.text, "outcome": "refused", "reason": f"no workload {self.text!r}; {self.text}"}]

    def token_list(self, include_revoked=False):
        return [{"id": "abcdefghijkl", "user": "alice", "teams": ["team-a"], "role": "member", "status": "active",
                 "created": time.time(), "expires": None, "created_by": "olga", "note": self.text}]

    def nodes(self, include_lost=False):
        return [{"id": "f" * 56, "node_type": self.text, "address": "10.0.0.1", "state": "ready", "since": None,
                 "gpus_free": 1.0, "gpus_total": 2.0, "probe": {"ok": True, "consecutive_failures": 0},
                 "leases": [{"workload": "w-1", "team": "team-a", "gpus": 1.0}], "reason": self.text}]


class Refusing(FakeClient):
    def explain(self, workload_id):
        raise NotFoundError(f"no workload {workload_id!r}; {self.text}")


# command line -> what it must show of the hostile text.
COMMANDS = {
    "queue": ["queue"],
    "explain": ["explain", "w-1"],
    "audit": ["audit"],
    "token list": ["token", "list"],
    "node list": ["node", "list"],
}


@pytest.fixture
def connected(monkeypatch):
    """``connected(client)``: every command's ``connect()`` returns ``client``."""

    def use(client):
        for mod in (cluster, auth, nodes):
            monkeypatch.setattr(mod, "connect", lambda client=client: client)
        monkeypatch.setattr(common.console, "width", 1000)  # no cell folded into another's lines

    return use


@CASES
@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_each_command_prints_a_hostile_string_escaped_and_literally(connected, command, text):
    connected(FakeClient(text))
    got = CliRunner().invoke(cli.app, COMMANDS[command])
    assert got.exit_code == 0, (got.output, got.exception)  # "[/x]" used to end `raylane queue` in a MarkupError
    assert safe(got.stdout), repr(got.stdout)
    assert shows(got.stdout, text), got.stdout


@CASES
def test_a_refusal_naming_a_hostile_string_is_printed_escaped(connected, text):
    connected(Refusing(text))
    got = CliRunner().invoke(cli.app, ["explain", "w-1"])
    assert got.exit_code == 1, (got.output, got.exception)
    # An error keeps its own line breaks (a ValidationError is one line per problem); nothing else hidden survives.
    assert safe(got.stderr) and shows(got.stderr, text, newlines=True), repr(got.stderr)


@CASES
def test_the_long_queues_plain_columns_are_escaped_and_keep_one_line_per_row(text):
    rows = [queue_row(f"w-{i}", detail=text) for i in range(3)]
    out = cluster.queue_text(rows)
    assert safe(out) and len(out.splitlines()) == 1 + len(rows)
    assert all(line.endswith(visible(text)) for line in out.splitlines()[1:])


@CASES
def test_json_output_is_the_data_unchanged_and_still_safe_on_a_terminal(connected, text):
    connected(FakeClient(text))
    got = CliRunner().invoke(cli.app, ["queue", "--json"])
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == FakeClient(text).queue()  # data, not a display: nothing changed in it
    assert safe(got.stdout)


@pytest.mark.parametrize("text", list(MARKUP.values()), ids=list(MARKUP))
def test_markup_in_a_value_is_never_interpreted(connected, text):
    connected(FakeClient(text))
    got = CliRunner().invoke(cli.app, ["explain", "w-1"])
    assert got.exit_code == 0, got.output
    assert f"now: {text}" in got.stdout  # shown as typed: no style, link or emoji made of it
    assert "\u26a0" not in got.stdout


# -------------------------------------------------------------------------------------------- the web console
NODE = shutil.which("node")
SHOWN = r"""
const src = require("fs").readFileSync(process.argv[1], "utf8");
const shown = new Function(src.slice(src.indexOf("const HIDDEN"), src.indexOf("// end shown")) + "; return shown;")();
let data = ""; process.stdin.on("data", (d) => data += d).on("end", () =>
  process.stdout.write(JSON.stringify(JSON.parse(data).map(shown))));
"""


@pytest.mark.skipif(NODE is None, reason="needs node to run the console's script")
def test_the_console_shows_text_as_the_command_line_does():
    texts = list(HOSTILE.values()) + ["é ü 日本 😀", "\u00a0nbsp", "\U000e0001 tag", "\x00nul"]
    got = subprocess.run([NODE, "-e", SHOWN, str(STATIC / "app.js")], input=json.dumps(texts), capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == [visible(t) for t in texts]


def test_the_console_puts_every_text_through_shown_and_never_html():
    src = (STATIC / "app.js").read_text()
    assert not re.search(r"\.(inner|outer)HTML\b|insertAdjacentHTML|document\.write", src)
    assert 'e.textContent = shown(v)' in src and "document.createTextNode(shown(c))" in src
    # Every other textContent is a fixed word or goes through shown.
    others = [line.strip() for line in src.splitlines() if "textContent =" in line and "shown(" not in line]
    assert all('"' in line.split("textContent =", 1)[1] for line in others), others


# ------------------------------------------------------------------------------------ what a request may hold
def nested(depth: int, leaf: Any = 1) -> Any:
    out = leaf
    for _ in range(depth):
        out = {"a": out}
    return out


@pytest.fixture
def harness(tmp_path):
    h = Harness(str(tmp_path / "journal.db"), local_policy(), auth={"enabled": True})
    h.ops = h.cs.gate.add_token(user="olga", teams=[], role="operator", created_by="test")
    h.alice = h.cs.gate.add_token(user="alice", teams=["team-a"], role="member", created_by="test")
    h.erin = h.cs.gate.add_token(user="erin", teams=["team-a"], role="member", created_by="test")
    h.bob = h.cs.gate.add_token(user="bob", teams=["team-b"], role="member", created_by="test")
    yield h
    h.close()


def refusals(h, action: str) -> List[Dict[str, Any]]:
    return [r for r in h.call("audit", h.ops) if r["action"] == action and r["outcome"] == "refused"]


@pytest.mark.parametrize("call,args,field", [
    ("submit", {"spec": {**spec("deep", "team-a", "pretrain"), "config": nested(500)}}, "spec.config.a.a"),
    ("submit", {"spec": {"name": "x", "team": "team-a", "list": nested(40, [])}}, "spec.list.a"),
    ("checkpoint_saved", {"workload_id": "w-1", "path": "p", "metrics": {"m": [[[[nested(40)]]]]}}, "metrics.m.0"),
    ("reload_policy", {"policy": nested(5000)}, "policy.a"),
], ids=["spec 500 deep", "list in a spec", "metrics", "policy 5000 deep"])
def test_an_argument_nested_past_the_limit_is_refused_naming_field_value_and_limit(call, args, field):
    with pytest.raises(ValidationError) as refused:
        api.parse(call, args)
    ((path, value, allowed),) = refused.value.errors
    assert path.startswith(field) and path.count(".") == api.MAX_DEPTH
    assert f"at most {api.MAX_DEPTH} levels" in allowed and value is not None


def test_a_self_containing_argument_is_refused_too():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValidationError, match=f"at most {api.MAX_DEPTH} levels"):
        api.parse("submit", {"spec": {"name": "x", "loop": loop}})


def test_a_spec_as_deep_as_the_limit_still_passes():
    spec_ok = {**spec("deep-ok", "team-a", "pretrain"), "config": nested(api.MAX_DEPTH - 2)}  # spec and config: 2
    assert api.parse("submit", {"spec": spec_ok}).spec == spec_ok


def test_a_deep_submit_is_refused_and_audited_and_changes_nothing(harness):
    h = harness
    before = len(h.call("queue", h.alice, include_done=True))
    with pytest.raises(ValidationError, match=f"at most {api.MAX_DEPTH} levels"):
        h.call("submit", h.alice, spec={**spec("deep", "team-a", "pretrain"), "config": nested(500)})
    assert len(h.call("queue", h.alice, include_done=True)) == before
    (row,) = refusals(h, "submit")
    assert row["user"] == "alice" and "levels of nested" in row["reason"]


def test_a_hostile_id_from_an_unauthenticated_explain_is_audited_and_printed_safely(harness):
    h = harness
    wid = "\x1b]8;;http://evil.example/\x1b\\[/x]\u202e\x1b]8;;\x1b\\"
    with pytest.raises(ValidationError):  # not a workload id: refused before the missing credential
        h.call("explain", None, workload_id=wid)
    (row,) = refusals(h, "explain")
    assert row["target"] == wid  # kept as the data it was
    out = render(auth.audit_table([row]))
    assert safe(out) and shows(out, wid)


def render(renderable) -> str:
    c = Console(file=io.StringIO(), width=400)
    c.print(renderable)
    return c.file.getvalue()


def test_only_the_workloads_team_may_wait_on_it_and_only_for_a_bounded_time(harness):
    h = harness
    wid = h.call("submit", h.alice, spec=spec("mine", "team-a", "pretrain"))["id"]
    assert h.call("wait_admission", h.alice, workload_id=wid, timeout_s=0.0)["id"] == wid
    assert h.call("wait_admission", h.erin, workload_id=wid, timeout_s=0.0)["id"] == wid  # a teammate
    assert h.call("wait_admission", h.ops, workload_id=wid, timeout_s=0.0)["id"] == wid
    with pytest.raises(PermissionDeniedError, match="team-a"):
        h.call("wait_admission", h.bob, workload_id=wid, timeout_s=0.0)
    (row,) = refusals(h, "wait_admission")
    assert row["user"] == "bob" and row["target"] == wid
    with pytest.raises(ValidationError, match="timeout_s"):
        h.call("wait_admission", h.alice, workload_id=wid, timeout_s=api.MAX_WAIT_S + 1)
