"""The console's forecast timeline (``static/app.js``: ``timeline``), without Ray or a browser: the page's script runs
in Node over a small stand-in for the DOM that records what it builds (and refuses ``innerHTML``), and the test reads
the SVG it drew: a running lease as a bar from now to its predicted end with a whisker for the 10-90% interval, a
pending workload as a marker at its predicted start with its interval, a legend, a time axis, and what the runtime
rests on as each row's tooltip. The last test feeds it the queue rows of a control plane (``tests/controltest.py``)
through ``raylane.console.views``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from raylane.console import views
from raylane.console.app import Settings
from raylane.render import visible
from tests.controltest import Harness
from tests.raytest import local_policy, spec

STATIC = Path(views.__file__).parent / "static"
NODE = shutil.which("node")
SVG_NS = "http://www.w3.org/2000/svg"
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node to run the console's script")

# The DOM as far as app.js's views use it, recording each element (tag, namespace, attributes, children).
DOM = r"""
const vm = require("vm"), fs = require("fs");
class FakeNode {}
class Text extends FakeNode {
  constructor(t) { super(); this.data = String(t); }
  toJSON() { return {text: this.data}; }
}
class Element extends FakeNode {
  constructor(tag, ns) {
    super(); this.tag = tag; this.ns = ns; this.attrs = {}; this.children = []; this.style = {}; this.dataset = {};
    this.classList = {toggle() {}};
  }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  set className(v) { this.attrs.class = String(v); }
  get className() { return this.attrs.class || ""; }
  set textContent(v) { this.children = [new Text(v)]; }
  get textContent() { return this.children.map((c) => c instanceof Text ? c.data : c.textContent).join(""); }
  set innerHTML(v) { throw new Error("innerHTML was set"); }
  set outerHTML(v) { throw new Error("outerHTML was set"); }
  append(...cs) {
    for (const c of cs) {
      if (!(c instanceof FakeNode)) throw new Error("append of a non-node: " + String(c));
      this.children.push(c);
    }
  }
  replaceChildren(...cs) { this.children = []; this.append(...cs); }
  addEventListener() {}
  toJSON() { return {tag: this.tag, ns: this.ns, attrs: this.attrs, children: this.children}; }
}
const document = {
  createElement: (t) => new Element(t, "http://www.w3.org/1999/xhtml"),
  createElementNS: (ns, t) => new Element(t, ns),
  createTextNode: (t) => new Text(t),
  addEventListener() {},
  getElementById() { return null; },
};
const ctx = vm.createContext({document, Node: FakeNode, console});
const src = fs.readFileSync(process.argv[1], "utf8");
vm.runInContext(src + `
;globalThis.__run = (ask) => (Date.now = () => (ask.snap ? ask.snap.at : ask.scale.now) * 1000) && ask.scale
  ? timelineScale(ask.scale.items, ask.scale.now)
  : VIEWS.queue(ask.snap).filter(Boolean);`, ctx);
let data = "";
process.stdin.on("data", (d) => data += d).on("end", () =>
  process.stdout.write(JSON.stringify(JSON.parse(data).map((ask) => ctx.__run(ask)))));
"""


def run_js(*asks: Dict[str, Any]) -> List[Any]:
    got = subprocess.run([NODE, "-e", DOM, str(STATIC / "app.js")], input=json.dumps(list(asks)),
                         capture_output=True, text=True, timeout=60, env={**os.environ, "TZ": "UTC"})
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def queue_page(snap: Dict[str, Any]) -> List[Dict[str, Any]]:
    return run_js({"snap": snap})[0]


# ------------------------------------------------------------------------------------------- reading the tree
def walk(nodes) -> Iterator[Dict[str, Any]]:
    for n in nodes if isinstance(nodes, list) else [nodes]:
        if "tag" in n:
            yield n
            yield from walk(n["children"])


def classes(n) -> List[str]:
    return n["attrs"].get("class", "").split()


def find(nodes, tag: Optional[str] = None, cls: Optional[str] = None, **attrs) -> List[Dict[str, Any]]:
    return [n for n in walk(nodes) if (tag is None or n["tag"] == tag) and (cls is None or cls in classes(n))
            and all(n["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())]


def text(n) -> str:
    return "".join(c["text"] if "text" in c else text(c) for c in n["children"])


def num(n, attr: str) -> float:
    return float(n["attrs"][attr])


def tooltip(g) -> str:
    first = g["children"][0]
    assert first["tag"] == "title" and first["ns"] == SVG_NS, "a row's tooltip is its first child, an SVG <title>"
    return text(first)


# ------------------------------------------------------------------------------------------------- the cases
NOW = 1_700_000_000.0
LEFT, RIGHT = 240.0, 1000.0 - 16.0  # app.js: TL.left, TL.width - TL.right
BASIS = "3 runs of alice/pretrain-x: median 20m"


def row(wid: str, state: str, team: str = "team-a", **kw) -> Dict[str, Any]:
    return {"id": wid, "team": team, "class": "pretrain", "kind": "train", "state": state, "resources": "1 x (1 GPU)",
            "waited_s": 0, "position": kw.pop("position", None), "reason": "", "detail": "", "owner": "alice",
            "redacted": False, **kw}


def snap(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    return {"view": "queue", "at": NOW, "rows": rows, "counts": counts, "include_done": False}


def x_of(t: float, span: float) -> float:
    return LEFT + (RIGHT - LEFT) * min(1.0, max(0.0, (t - NOW) / span))


def interval_ends(g) -> tuple:
    (whisker,) = find(g, "g", "tl-interval")
    stem = whisker["children"][0]
    return num(stem, "x1"), num(stem, "x2")


def test_running_leases_are_bars_to_their_end_and_pending_work_a_marker_at_its_start():
    rows = [
        row("wait-1", "PENDING", position=1, eta_start=NOW + 1140, eta_finish=NOW + 2340, eta_start_low=NOW + 540,
            eta_start_high=NOW + 2340, eta_basis=BASIS),
        row("wait-2", "PENDING", position=2),  # no forecast start
        row("run-1", "RUNNING", predicted_end=NOW + 1140, predicted_end_low=NOW + 540, predicted_end_high=NOW + 2340,
            predicted_basis=BASIS + "; 3 of them ran longer than its 60s"),
        row("run-0", "ADMITTED", team="team-b", predicted_end=NOW + 300),  # a declared estimate: no interval
        row("run-9", "RUNNING", team="team-b"),  # nothing known of its runtime
        row("pipe", "RUNNING", kind="pipeline"),
    ]
    page = queue_page(snap(rows))
    (svg,) = find(page, "svg", id="timeline")
    assert svg["ns"] == SVG_NS and all(n["ns"] == SVG_NS for n in walk(svg))
    span = float(svg["attrs"]["data-span"])
    assert span == pytest.approx(2340 * 1.05, abs=1)
    got = find(svg, "g", "tl-row")
    # Running leases first, soonest end first (one whose end is not known last); then pending work in queue order.
    assert [g["attrs"]["data-id"] for g in got] == ["run-0", "run-1", "run-9", "wait-1"]
    run0, run1, run9, wait1 = got

    (bar,) = find(run1, "rect", "tl-bar")
    assert num(bar, "x") == pytest.approx(LEFT)
    assert num(bar, "x") + num(bar, "width") == pytest.approx(x_of(NOW + 1140, span), abs=0.2)
    assert interval_ends(run1) == pytest.approx((x_of(NOW + 540, span), x_of(NOW + 2340, span)), abs=0.2)
    tip = tooltip(run1)
    assert tip.startswith("run-1 (team-a, RUNNING); ends about 22:32:20 (~19m)")
    assert "10-90%: 22:22:20 to 22:52:20" in tip and f"its runtime: {BASIS}; 3 of them ran longer" in tip
    assert bar["attrs"]["fill"].startswith("hsl(")  # the team's color, as on the other pages

    assert not find(run0, "g", "tl-interval") and "10-90%" not in tooltip(run0)
    (unknown,) = find(run9, "rect", "tl-bar")
    assert "unknown" in classes(unknown)
    assert num(unknown, "x") + num(unknown, "width") == pytest.approx(RIGHT)
    assert "its end is not known" in tooltip(run9)

    (marker,) = find(wait1, "path", "tl-start")
    cx = float(re.match(r"M([\d.]+) ", marker["attrs"]["d"]).group(1))
    assert cx == pytest.approx(x_of(NOW + 1140, span), abs=0.2)
    assert interval_ends(wait1) == pytest.approx((x_of(NOW + 540, span), x_of(NOW + 2340, span)), abs=0.2)
    assert tooltip(wait1) == ("wait-1 (team-a, PENDING); starts about 22:32:20 (~19m); 10-90%: 22:22:20 to 22:52:20; "
                              f"ends about 22:52:20; its runtime: {BASIS}")
    assert not find(wait1, "rect")

    (now_line,) = find(svg, "line", "tl-now")
    assert num(now_line, "x1") == pytest.approx(LEFT)
    (note,) = find(page, id="timeline-note")
    assert text(note) == "1 pending without a forecast start (none made, or not within 7 days)"


def test_the_timeline_has_a_legend_and_a_time_axis():
    page = queue_page(snap([row("run-1", "RUNNING", predicted_end=NOW + 5400, predicted_end_low=NOW + 3600,
                                predicted_end_high=NOW + 7200)]))
    (legend,) = find(page, id="timeline-legend")
    keys = [text(k) for k in find(legend, "span", "tl-key")]
    assert keys == ["running: now to its predicted end", "pending: its predicted start",
                    "10-90% interval (learned runtimes)", "past the forecast's horizon", "end not known"]
    assert all(find(k, "svg") for k in find(legend, "span", "tl-key"))  # each with the mark it explains
    (svg,) = find(page, "svg", id="timeline")
    ticks = find(svg, "g", "tl-tick")
    labels = [text(t) for t in ticks]
    assert labels == ["now", "+30m", "+1h", "+1.5h", "+2h"]
    # Each tick's line and label sit at its time.
    span = float(svg["attrs"]["data-span"])
    for i, t in enumerate(ticks):
        (line,) = find(t, "line")
        assert num(line, "x1") == pytest.approx(x_of(NOW + i * 1800, span), abs=0.2)
    (h2,) = find(page, "h2")
    assert text(h2) == "Forecast"


@pytest.mark.parametrize("latest_s, step_s, ticks", [
    (0, 120, 6),  # at least 10 minutes drawn
    (3 * 3600, 1800, 7),
    (30 * 3600, 21600, 6),
    (30 * 86400, 86400, 8),  # at most the forecast's horizon, 7 days
])
def test_the_time_axis_has_round_steps_and_at_most_eight_of_them(latest_s, step_s, ticks):
    items = [{"at": NOW + latest_s / 2, "low": None, "high": NOW + latest_s}]
    (got,) = run_js({"scale": {"items": items, "now": NOW}})
    assert got["step"] == step_s and len(got["ticks"]) == ticks
    assert got["span"] == pytest.approx(min(7 * 86400, max(600, latest_s) * 1.05))
    assert got["ticks"][0] == 0 and got["ticks"][-1] <= got["span"]


def test_a_start_past_the_horizon_at_the_90th_percentile_draws_an_open_interval():
    page = queue_page(snap([row("wait-1", "PENDING", position=1, eta_start=NOW + 3600, eta_start_low=NOW + 1800,
                                eta_start_high=None, eta_basis=BASIS)]))
    (g,) = find(page, "g", "tl-row")
    (whisker,) = find(g, "g", "tl-interval")
    assert "open" in classes(whisker) and len(find(whisker, "line")) == 2  # no cap at the open end
    assert interval_ends(g)[1] == pytest.approx(RIGHT)
    assert "to past the forecast's horizon" in tooltip(g)


def test_another_teams_row_says_its_basis_is_hidden():
    page = queue_page(snap([row("theirs", "RUNNING", team="team-b", redacted=True, owner=None,
                                predicted_end=NOW + 600, predicted_end_low=NOW + 300, predicted_end_high=NOW + 900)]))
    (g,) = find(page, "g", "tl-row")
    assert tooltip(g).endswith("what its runtime rests on is shown to its team only")


HOSTILE = "\x1b[31mred\u202eevil\u200b"


def test_hostile_ids_and_bases_are_drawn_as_escaped_text():
    page = queue_page(snap([
        row("ok-" + "x" * 40, "PENDING", position=1, eta_start=NOW + 60, eta_basis=HOSTILE, eta_start_low=NOW,
            eta_start_high=NOW + 120),
        row(HOSTILE, "RUNNING", predicted_end=NOW + 60, predicted_end_low=NOW, predicted_end_high=NOW + 90,
            predicted_basis=f"<b onmouseover=alert(1)>{HOSTILE}</b>"),
    ]))
    (svg,) = find(page, "svg", id="timeline")
    drawn = "".join(text(n) for n in find(svg, "text") + find(svg, "title"))
    assert "[31m" in drawn and not re.search("[\x1b\u202e\u200b]", drawn)
    running, pending = find(svg, "g", "tl-row")
    assert text(find(running, "text", "tl-label")[0]) == visible(HOSTILE)
    assert tooltip(running).endswith(f"its runtime: <b onmouseover=alert(1)>{visible(HOSTILE)}</b>")  # text, not markup
    assert not find(svg, "b")
    assert tooltip(pending).endswith(f"its runtime: {visible(HOSTILE)}")
    assert text(find(pending, "text", "tl-label")[0]) == "ok-" + "x" * 28 + "\u2026"  # a long id is cut
    assert running["attrs"]["data-id"] == HOSTILE  # an attribute value is data, never parsed


def test_no_timeline_without_running_or_forecast_work():
    page = queue_page(snap([row("wait-2", "PENDING", position=1), row("done", "SUCCEEDED")]))
    assert not find(page, id="forecast") and not find(page, "svg")
    assert queue_page(snap([]))[-1]["attrs"]["id"] == "queue-empty"


def test_the_timeline_draws_the_control_planes_rows(tmp_path):
    # Three runs of 10, 20 and 40 minutes learned; a fourth runs for a minute, a fifth waits behind it: the queue rows
    # as the console's queue view gives them, drawn.
    h = Harness(str(tmp_path / "journal.db"), local_policy(pretrain={"min_runtime": 0}))
    try:
        for s in (600, 1200, 2400, None):
            wid = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
            h.tick()
            h.call("report", workload_id=wid, kind="running")
            h.clock.advance(s or 60)
            if s:
                h.call("release", workload_id=wid, outcome="finished", state="SUCCEEDED")
                h.tick()
        running = wid
        waiting = h.call("submit", spec=spec("pretrain-x", "team-a", "pretrain", workers=2, gpu=2))["id"]
        h.tick()

        class Client:
            def queue(self, include_done):
                return h.call("queue", include_done=include_done)

        got = views.build(Client(), Settings(), "queue")
        got["at"] = h.clock()  # the console's clock is the control plane's
        rows = {r["id"]: r for r in got["rows"]}
        page = run_js({"snap": json.loads(json.dumps(got, default=str))})[0]
    finally:
        h.close()
    (svg,) = find(page, "svg", id="timeline")
    span = float(svg["attrs"]["data-span"])
    x = lambda t: LEFT + (RIGHT - LEFT) * min(1.0, max(0.0, (t - got["at"]) / span))  # noqa: E731
    run_g, wait_g = find(svg, "g", "tl-row")
    assert (run_g["attrs"]["data-id"], wait_g["attrs"]["data-id"]) == (running, waiting)
    (bar,) = find(run_g, "rect", "tl-bar")
    assert num(bar, "x") + num(bar, "width") == pytest.approx(x(rows[running]["predicted_end"]), abs=0.2)
    assert interval_ends(run_g) == pytest.approx(
        (x(rows[running]["predicted_end_low"]), x(rows[running]["predicted_end_high"])), abs=0.2)
    (marker,) = find(wait_g, "path", "tl-start")
    cx = float(re.match(r"M([\d.]+) ", marker["attrs"]["d"]).group(1))
    assert cx == pytest.approx(x(rows[waiting]["eta_start"]), abs=0.2)
    assert "its runtime: 3 runs of pytest/pretrain-x: median 20m" in tooltip(run_g)
    assert "its runtime: 3 runs of pytest/pretrain-x: median 20m" in tooltip(wait_g)
