// The Raylane console's pages. One shell (index.html) for every page; the path picks the view, a Server-Sent
// Events stream (/api/stream) brings a new snapshot of it every few seconds, and the view is drawn again from it.
// Everything shown comes from the control plane as the logged-in user sees it. Text goes in with textContent only
// (workload ids, reasons and notes are other users' input): no innerHTML anywhere, and through shown() first.
"use strict";

// shown: text as it may be put on the page. Each character that a browser does not draw as itself (C0 and C1
// controls, Unicode format characters such as bidi overrides and zero-width ones, line and paragraph separators,
// spaces other than the plain one, unassigned and private code points) becomes its escape, as
// raylane.render.visible does for the command line (Python's str.isprintable rule): another user's text cannot
// reorder or hide what is drawn around it. tests/control/test_hostile_output.py holds the two to the same output.
const HIDDEN = /(?! )[\p{Cc}\p{Cf}\p{Zs}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}]/gu;
const SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"};
function shown(v) {
  return String(v).replace(HIDDEN, (c) => {
    if (c in SHORT) return SHORT[c];
    const n = c.codePointAt(0), h = n.toString(16);
    return n < 0x100 ? "\\x" + h.padStart(2, "0") : n < 0x10000 ? "\\u" + h.padStart(4, "0") : "\\U" + h.padStart(8, "0");
  });
}
// end shown

// The session's secret (raylane.console.app): handed over once, at login, in the fragment of the redirect
// ("/#s=..."), kept in this tab's sessionStorage (this origin's only: another port of 127.0.0.1 cannot read it) and
// sent with every call (header X-Raylane-CSRF; the stream, which sends no headers, as its csrf parameter). The
// console refuses a call that carries its cookie only.
const SECRET_KEY = "raylane-session-secret";
function takeSecret() {
  const m = location.hash.match(/^#s=([A-Za-z0-9_-]{20,100})$/);
  if (!m) return;
  sessionStorage.setItem(SECRET_KEY, m[1]);
  history.replaceState(null, "", location.pathname + location.search);  // out of the address bar and history
}
function secret() { return sessionStorage.getItem(SECRET_KEY) || ""; }
function api(path) {
  return fetch(path, {credentials: "same-origin", headers: {"X-Raylane-CSRF": secret()}});
}

const ROUTES = [
  [/^\/(queue)?$/, "queue", "Queue"],
  [/^\/teams$/, "teams", "Teams"],
  [/^\/nodes$/, "nodes", "Nodes"],
  [/^\/cost$/, "cost", "Cost"],
  [/^\/workload\/([A-Za-z0-9][A-Za-z0-9._-]{0,159})$/, "workload", "Workload"],
];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = shown(v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "style") Object.assign(e.style, v);
    else if (k === "title") e.setAttribute(k, shown(v));
    else e.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  }
  return e;
}

function fmtNum(x) {
  if (x === null || x === undefined) return "unlimited";
  return Number.isInteger(x) ? String(x) : x.toFixed(2).replace(/\.?0+$/, "");
}

function fmtWait(s) {
  s = Math.max(0, Math.round(s || 0));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m ${String(sec).padStart(2, "0")}s`;
  return `${sec}s`;
}

function fmtTime(ts) {
  if (!ts) return "-";
  const d = new Date(ts * 1000);
  return d.toLocaleTimeString([], {hour12: false}) + (Date.now() - d > 86400000 ? " " + d.toLocaleDateString() : "");
}

// One color per team, the same on every page: an FNV-1a hash of the name, spread round the hue circle by the golden
// angle, so names that differ in one letter (team-a, team-b) get far-apart hues.
function teamColor(team) {
  let h = 2166136261;
  for (const ch of String(team)) h = Math.imul(h ^ ch.charCodeAt(0), 16777619) >>> 0;
  return `hsl(${Math.round((h % 997) * 137.508) % 360}, 62%, 50%)`;
}

function teamTag(team) {
  return el("span", {class: "team", "data-team": team}, el("i", {class: "swatch", style: {background: teamColor(team)}}), team);
}

function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {text: h})))),
    el("tbody", {}, rows));
}

function banner(text, kind) {
  const b = document.getElementById("banner");
  b.hidden = !text;
  b.textContent = shown(text || "");
  b.className = "banner " + (kind || "");
}

function setLive(state, at) {
  const l = document.getElementById("live");
  l.dataset.state = state;
  l.textContent = state === "live" ? `live · ${fmtTime(at)}` : state;
}

// A pending workload's forecast start (raylane.forecast), as `raylane queue` shows it: in how long (from now, or
// from the time given).
function fmtEta(start, now) {
  if (start === null || start === undefined) return "-";
  const s = start - (now ?? Date.now() / 1000);
  if (s < 60) return "now";
  if (s < 3600) return `~${Math.round(s / 60)}m`;
  if (s < 86400) return `~${(s / 3600).toFixed(1)}h`;
  return `~${(s / 86400).toFixed(1)}d`;
}

// ------------------------------------------------------------------------------------------ the forecast timeline
// The queue's forecast drawn (raylane.forecast, docs/eta.md), one row per workload: a running lease as a bar from now
// to its predicted end with a whisker for the 10-90% interval of that end; a pending one as a marker at its predicted
// start with the interval of that start (open-ended past the forecast's horizon). What a runtime rests on is the
// row's tooltip. An SVG made with DOM calls only, every text through shown(), like the rest of the page.
const SVG_NS = "http://www.w3.org/2000/svg";
const TL = {width: 1000, left: 240, right: 16, top: 26, rowH: 22, maxRows: 40, maxSpanS: 7 * 86400};
const TICK_STEPS_S = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800];
const HOLDS_LEASE = new Set(["RUNNING", "ADMITTED"]);

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = shown(v);
    else if (k === "title") e.append(svg("title", {text: v}));  // an SVG tooltip is a <title> child
    else e.setAttribute(k, typeof v === "number" ? String(Math.round(v * 10) / 10) : String(v));
  }
  for (const c of children.flat(Infinity)) if (c) e.append(c);
  return e;
}

const known = (x) => x !== null && x !== undefined;

// The rows the timeline draws, running leases first (soonest end first), then pending work in queue order; and how
// many pending workloads have no forecast start (none made, or not within the horizon).
function timelineItems(rows) {
  const running = [], pending = [];
  let unforecast = 0;
  for (const r of rows) {
    if (r.kind === "pipeline") continue;  // its stages have rows of their own
    const base = {id: r.id, team: r.team, state: r.state, redacted: !!r.redacted};
    if (HOLDS_LEASE.has(r.state)) {
      running.push({...base, kind: "running", at: r.predicted_end ?? null, low: r.predicted_end_low ?? null,
                    high: r.predicted_end_high ?? null, basis: r.predicted_basis || ""});
    } else if (r.state === "PENDING") {
      if (!known(r.eta_start)) { unforecast++; continue; }
      pending.push({...base, kind: "pending", at: r.eta_start, low: r.eta_start_low ?? null,
                    high: r.eta_start_high ?? null, finish: r.eta_finish ?? null, basis: r.eta_basis || ""});
    }
  }
  running.sort((a, b) => (a.at ?? Infinity) - (b.at ?? Infinity));
  return {items: running.concat(pending), unforecast};
}

// The time axis: from now to a little past the latest time drawn (at least 10 minutes, at most the forecast's
// horizon), with ticks every "round" step (a minute to two days) so that there are at most 8 steps.
function timelineScale(items, now) {
  let last = now + 600;
  for (const it of items) for (const t of [it.at, it.low, it.high]) if (known(t)) last = Math.max(last, t);
  const span = Math.min(TL.maxSpanS, (last - now) * 1.05);
  const step = TICK_STEPS_S.find((s) => span / s <= 8) || 86400 * Math.ceil(span / 86400 / 8);
  const ticks = [];
  for (let t = 0; t <= span + 1e-6; t += step) ticks.push(t);
  return {now, span, step, ticks};
}

function fmtSpan(s) {
  if (s < 1) return "now";
  if (s < 3600) return `+${Math.round(s / 60)}m`;
  if (s < 86400) return `+${fmtNum(Math.round(s / 360) / 10)}h`;
  return `+${fmtNum(Math.round(s / 8640) / 10)}d`;
}

function timelineTip(it, now) {
  const when = (t) => `${fmtTime(t)} (${fmtEta(t, now)})`;
  const parts = [`${it.id} (${it.team}, ${it.state})`];
  if (it.kind === "running") {
    if (!known(it.at)) parts.push("its end is not known: no runtime estimate and no similar finished run");
    else {
      parts.push(`ends about ${when(it.at)}`);
      if (known(it.low) && known(it.high)) parts.push(`10-90%: ${fmtTime(it.low)} to ${fmtTime(it.high)}`);
    }
  } else {
    parts.push(`starts about ${when(it.at)}`);
    if (known(it.low)) parts.push(`10-90%: ${fmtTime(it.low)} to ${known(it.high) ? fmtTime(it.high) : "past the forecast's horizon"}`);
    if (known(it.finish)) parts.push(`ends about ${fmtTime(it.finish)}`);
  }
  if (it.basis) parts.push(`its runtime: ${it.basis}`);
  else if (it.redacted && known(it.low)) parts.push("what its runtime rests on is shown to its team only");
  return parts.join("; ");
}

function whisker(x1, x2, y, cls) {
  return svg("g", {class: cls},
    svg("line", {x1, x2, y1: y, y2: y}),
    svg("line", {x1, x2: x1, y1: y - 5, y2: y + 5}),
    cls.includes("open") ? null : svg("line", {x1: x2, x2, y1: y - 5, y2: y + 5}));
}

function diamond(cx, cy, r, fill) {
  return svg("path", {class: "tl-start", d: `M${cx} ${cy - r}L${cx + r} ${cy}L${cx} ${cy + r}L${cx - r} ${cy}Z`, fill});
}

function timelineRow(it, i, sc, x) {
  const mid = TL.top + i * TL.rowH + TL.rowH / 2;
  const right = TL.width - TL.right, color = teamColor(it.team);
  const label = it.id.length > 32 ? it.id.slice(0, 31) + "\u2026" : it.id;
  const parts = [svg("text", {class: "tl-label", x: TL.left - 8, y: mid + 4, "text-anchor": "end", text: label})];
  if (it.kind === "running") {
    const end = known(it.at) ? x(it.at) : right;
    parts.push(svg("rect", {class: "tl-bar" + (known(it.at) ? "" : " unknown"), x: x(sc.now), y: mid - 6,
                            width: Math.max(2, end - x(sc.now)), height: 12, rx: 3, fill: color}));
    if (known(it.low) && known(it.high)) parts.push(whisker(x(it.low), x(it.high), mid, "tl-interval"));
  } else {
    if (known(it.low)) parts.push(whisker(x(it.low), known(it.high) ? x(it.high) : right, mid,
                                          "tl-interval" + (known(it.high) ? "" : " open")));
    parts.push(diamond(x(it.at), mid, 6, color));
  }
  return svg("g", {class: `tl-row ${it.kind}`, "data-id": it.id, "data-kind": it.kind, title: timelineTip(it, sc.now)}, parts);
}

function timelineLegend() {
  const key = (shape, text) => el("span", {class: "tl-key"},
    svg("svg", {width: 28, height: 14, viewBox: "0 0 28 14", "aria-hidden": "true"}, shape), text);
  return el("div", {class: "legend tl-legend", id: "timeline-legend"},
    key(svg("rect", {class: "tl-bar", x: 1, y: 3, width: 26, height: 8, rx: 2}), "running: now to its predicted end"),
    key(diamond(14, 7, 6), "pending: its predicted start"),
    key(whisker(3, 25, 7, "tl-interval"), "10-90% interval (learned runtimes)"),
    key(whisker(3, 27, 7, "tl-interval open"), "past the forecast's horizon"),
    key(svg("rect", {class: "tl-bar unknown", x: 1, y: 3, width: 26, height: 8, rx: 2}), "end not known"));
}

function timeline(snap) {
  const {items, unforecast} = timelineItems(snap.rows);
  if (!items.length) return null;
  const now = snap.at, shownItems = items.slice(0, TL.maxRows);
  const sc = timelineScale(shownItems, now);
  const plot = TL.width - TL.left - TL.right;
  const x = (t) => TL.left + plot * Math.min(1, Math.max(0, (t - now) / sc.span));
  const height = TL.top + shownItems.length * TL.rowH + 6;
  const axis = sc.ticks.map((t) => svg("g", {class: "tl-tick"},
    svg("line", {x1: x(now + t), x2: x(now + t), y1: TL.top - 4, y2: height}),
    svg("text", {x: x(now + t), y: TL.top - 9, "text-anchor": "middle", text: fmtSpan(t)})));
  const notes = [];
  if (items.length > shownItems.length) notes.push(`the first ${shownItems.length} of ${items.length} workloads are drawn`);
  if (unforecast) notes.push(`${unforecast} pending without a forecast start (none made, or not within 7 days)`);
  return el("section", {id: "forecast", class: "forecast"},
    el("h2", {text: "Forecast"}),
    timelineLegend(),
    svg("svg", {id: "timeline", class: "timeline", viewBox: `0 0 ${TL.width} ${height}`, width: "100%",
                role: "img", "aria-label": "forecast timeline", "data-span": Math.round(sc.span)},
      axis,
      shownItems.map((it, i) => timelineRow(it, i, sc, x)),
      svg("line", {class: "tl-now", x1: x(now), x2: x(now), y1: TL.top - 4, y2: height})),
    notes.length ? el("p", {class: "hint", id: "timeline-note", text: notes.join("; ")}) : null);
}

// ---------------------------------------------------------------------------------------------------- views
const VIEWS = {};

VIEWS.queue = function (snap) {
  const counts = Object.entries(snap.counts).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(", ") || "empty";
  const rows = snap.rows.map((r) => el("tr", {class: `state-${r.state.toLowerCase()}` + (r.redacted ? " redacted" : ""),
                                              "data-id": r.id},
    el("td", {class: "pos", text: r.position ?? "-"}),
    el("td", {}, el("a", {href: `/workload/${encodeURIComponent(r.id)}`, text: r.id})),
    el("td", {}, teamTag(r.team)),
    el("td", {text: r.class}),
    el("td", {}, el("span", {class: "state", "data-state": r.state, text: r.state})),
    el("td", {text: r.resources}),
    el("td", {class: "num", text: fmtWait(r.waited_s)}),
    el("td", {class: "num eta", title: r.eta_start ? `forecast start ${fmtTime(r.eta_start)}` + (r.eta_basis ? `; its runtime: ${r.eta_basis}` : "") : null,
              text: fmtEta(r.eta_start)}),
    el("td", {class: "owner", title: r.redacted ? "another team's workload: its owner, spec and journal are shown to its team only" : null,
              text: r.redacted ? "hidden" : (r.owner || "-")}),
    el("td", {class: "reason", text: [r.reason, r.detail].filter(Boolean).join("; ")})));
  return [
    el("div", {class: "toolbar"},
      el("span", {id: "counts", text: counts}),
      el("label", {}, el("input", {type: "checkbox", id: "show-done", checked: snap.include_done ? "" : null}),
         " show finished, cancelled and rejected")),
    rows.length ? table(["Pos", "Workload", "Team", "Class", "State", "Resources", "Waited", "ETA", "Owner", "Reason"], rows,
                        {id: "queue", class: "grid"})
                : el("p", {class: "empty", id: "queue-empty", text: "The queue is empty."}),
    timeline(snap),
  ];
};

function quotaBar(q, title) {
  const ceiling = q.borrowing_limit === null ? Math.max(q.nominal, q.used) * 1.5 || 1 : q.nominal + q.borrowing_limit || 1;
  const pct = (x) => `${Math.min(100, (100 * x) / ceiling)}%`;
  return el("div", {class: "bar" + (q.used > q.nominal ? " borrowing" : ""),
                    title: title || `uses ${fmtNum(q.used)} of ${fmtNum(q.nominal)} nominal; may borrow ${fmtNum(q.borrowing_limit)}`},
    el("div", {class: "fill", style: {width: pct(q.used)}}),
    el("div", {class: "nominal", style: {left: pct(q.nominal)}}));
}

VIEWS.teams = function (snap) {
  if (!snap.available) return [el("p", {class: "unavailable", text: `Team usage is not available: ${snap.why}`})];
  const rows = [];
  for (const t of snap.teams) {
    const spend = snap.spend[t.team];
    const resources = Object.entries(t.quotas);
    if (!resources.length) resources.push(["gpu", {used: t.used.gpu, nominal: 0, borrowing_limit: null, lending_limit: null, unlimited: true}]);
    const path = (t.cohorts || []).join(" › ");
    resources.forEach(([res, q], i) => rows.push(el("tr", {"data-team": t.team, "data-resource": res},
      el("td", {}, i === 0 ? teamTag(t.team) : ""),
      el("td", {class: "cohort", text: i === 0 ? (path || "-") : ""}),
      el("td", {text: res.toUpperCase()}),
      el("td", {class: "num used", text: fmtNum(q.used)}),
      el("td", {class: "num", text: q.unlimited ? "no quota" : fmtNum(q.nominal)}),
      el("td", {class: "num", text: fmtNum(q.borrowing_limit)}),
      el("td", {class: "num", text: q.lending_limit === null ? "all unused" : fmtNum(q.lending_limit)}),
      el("td", {class: "barcell"}, q.unlimited ? "" : quotaBar(q)),
      el("td", {class: "num", text: i === 0 ? `${t.running} / ${t.pending}` : ""}),
      el("td", {class: "num budget", title: spend ? null : "cost accounting shows a member the spend of their own teams only",
                text: i === 0 ? budgetCell(spend) : ""}))));
  }
  return [
    el("p", {class: "hint", text: "Use against quota: the bar is the team's ceiling (nominal + borrowing limit), the mark its nominal quota; past the mark the team borrows."}),
    table(["Team", "Cohorts", "Resource", "Used", "Nominal", "Borrowing limit", "Lending limit", "", "Running / pending", "Spent this month"],
          rows, {id: "teams", class: "grid"}),
  ].concat(cohortTable(snap.cohorts || []));
};

function cohortTable(cohorts) {
  // The quota tree (policies with cohorts): each cohort's GPUs, top-down, indented by depth.
  if (!cohorts.length) return [];
  const depth = {};
  const rows = cohorts.map(c => {
    depth[c.cohort] = c.parent ? (depth[c.parent] || 0) + 1 : 0;
    return el("tr", {"data-cohort": c.cohort},
      el("td", {text: "\u00a0\u00a0".repeat(depth[c.cohort]) + c.cohort}),
      el("td", {text: c.teams.join(", ")}),
      el("td", {class: "num", text: fmtNum(c.nominal.gpu)}), el("td", {class: "num used", text: fmtNum(c.used.gpu)}),
      el("td", {class: "num", text: fmtNum(c.borrowed.gpu)}), el("td", {class: "num", text: fmtNum(c.lendable.gpu)}));
  });
  return [
    el("h2", {text: "Cohorts"}),
    el("p", {class: "hint", text: "Unused quota is lent inside the nearest cohort first; a team borrows through the cohorts above it."}),
    table(["Cohort", "Teams", "Nominal GPUs", "Used", "Borrowed", "Lendable"], rows, {id: "cohorts", class: "grid"}),
  ];
}

const NODE_STATES = ["ready", "cordoned", "draining", "drained", "quarantined", "lost"];

VIEWS.nodes = function (snap) {
  if (!snap.available) return [el("p", {class: "unavailable", text: `Node state is not available: ${snap.why}`})];
  const teams = new Set();
  let total = 0, free = 0;
  const cards = snap.nodes.map((n) => {
    const cells = [];
    for (const l of n.leases) {
      teams.add(l.team);
      for (let i = 0; i < Math.max(1, Math.ceil(l.gpus - 1e-9)) && l.gpus > 0; i++) {
        cells.push(el("div", {class: "gpu held", "data-team": l.team, "data-workload": l.workload,
                              title: `${l.workload} (${l.team}, ${l.class}): ${fmtNum(l.gpus)} GPU on this node, ${l.workers} worker(s)`,
                              style: {background: teamColor(l.team)}}, el("span", {text: l.team})));
      }
    }
    const gpus = Math.round(n.gpus_total || 0);
    while (cells.length < gpus) cells.push(el("div", {class: "gpu free", title: "free"}));
    if (n.state !== "lost") { total += n.gpus_total || 0; free += n.gpus_free || 0; }
    const probe = n.probe && n.probe.at ? `probe ${n.probe.ok ? "ok" : "failed"} at ${fmtTime(n.probe.at)}${n.probe.message && !n.probe.ok ? ": " + n.probe.message : ""}` : "not probed yet";
    return el("div", {class: `node state-${n.state}`, "data-node": n.id, "data-state": n.state},
      el("div", {class: "node-head"},
        el("strong", {text: n.node_type || "node"}),
        el("code", {text: n.id.slice(0, 12), title: n.id}),
        el("span", {class: "addr", text: n.address || ""}),
        el("span", {class: `badge ${n.state}`, text: n.state})),
      n.reason && n.state !== "ready" ? el("div", {class: "node-reason", text: `${n.reason}${n.since ? " (since " + fmtTime(n.since) + ")" : ""}`}) : null,
      gpus ? el("div", {class: "gpus"}, cells) : el("div", {class: "cpu-only", text: "no GPUs"}),
      el("div", {class: "node-foot", text: `${fmtNum(n.gpus_free)} of ${fmtNum(n.gpus_total)} GPUs free · ${(n.features || []).join(", ") || "no features"} · ${probe}`}));
  });
  return [
    el("div", {class: "toolbar"},
      el("span", {id: "gpu-summary", text: `${fmtNum(total - free)} of ${fmtNum(total)} GPUs leased`}),
      el("span", {class: "legend"}, [...teams].sort().map(teamTag), el("span", {text: "node states:"}),
         NODE_STATES.slice(1).map((s) => el("span", {class: `badge ${s}`, text: s})))),
    el("div", {id: "nodes", class: "nodes"}, cards),
  ];
};

// Two decimals, or two significant digits for what is smaller than 0.01 (a few GPU-minutes are not "0.00").
function small(x) {
  if (x === null || x === undefined) return "-";
  x = Number(x);
  return x === 0 || Math.abs(x) >= 0.01 ? x.toFixed(2) : x.toPrecision(2);
}
function money(x) { return small(x); }
function hours(x) { return x === null || x === undefined ? "-" : `${small(x)} h`; }

function budgetCell(b) {
  if (!b) return "n/a";
  if (b.budget === null || b.budget === undefined) return `${money(b.spent)} (no budget)`;
  return `${money(b.spent)} of ${money(b.budget)} (${Math.round(100 * b.share)}%)${b.alerting ? " · over alert share" : ""}`;
}

const COST_GROUPS = [["team", "By team"], ["class", "By class"], ["workload", "By workload"], ["sweep", "By sweep"],
                     ["pipeline", "By pipeline"]];

VIEWS.cost = function (snap, r) {
  if (!snap.available) return [el("p", {id: "cost-unavailable", class: "unavailable", text: `Cost accounting is not available: ${snap.why}`})];
  const c = snap.cost;
  const select = el("select", {id: "cost-window"}, snap.windows.map((w) => el("option", {value: w, selected: w === snap.window ? "" : null,
                                                                                         text: {all: "whole journal", "24h": "last 24 hours", "7d": "last 7 days", month: "this month (UTC)"}[w] || w})));
  select.addEventListener("change", () => open(r, {window: select.value}));
  const out = [
    el("div", {class: "toolbar"}, el("label", {}, "Window ", select),
       el("span", {text: `${c.since ? fmtTime(c.since) : "from the start"} to ${fmtTime(c.until)}${c.teams ? " · teams " + c.teams.join(", ") : " · all teams"}`})),
    el("dl", {class: "facts", id: "cost-totals"}, [
      ["Leased", `${money(c.leased_cost)} for ${hours(c.leased_gpu_hours)} of GPU`],
      ["Idle GPUs", `${money(c.idle_cost)} for ${hours(c.idle_gpu_hours)} (the whole cluster)`],
      ["CPU-only nodes", money(c.cpu_node_cost)],
      ["Total", el("strong", {text: money(c.total_cost)})],
      c.unpriced && c.unpriced.length ? ["Unpriced", `no price for ${c.unpriced.join(", ")} (counted in GPU-hours at no cost)`] : null,
    ].filter(Boolean).map(([k, v]) => [el("dt", {text: k}), el("dd", {}, v)])),
  ];
  if ((c.budgets || []).length) {
    const rows = c.budgets.map((b) => el("tr", {"data-team": b.team},
      el("td", {}, teamTag(b.team)), el("td", {class: "num", text: budgetCell(b)}),
      // The bar's mark is the alert share of the budget, its end the budget.
      el("td", {class: "barcell"}, b.budget ? quotaBar({used: b.spent, nominal: b.budget * b.alert_share,
                                                         borrowing_limit: b.budget * (1 - b.alert_share)},
                                                        `spent ${money(b.spent)} of ${money(b.budget)}; the mark: the alert share`) : "")));
    out.push(el("h2", {text: "Budgets this month"}), table(["Team", "Spent of budget", ""], rows, {id: "budgets", class: "grid"}));
  }
  if ((c.node_types || []).length) {
    out.push(el("h2", {text: "By node type"}), table(["Node type", "Price / GPU-h", "Nodes", "Leased", "Idle", "Leased cost", "Idle cost"],
      c.node_types.map((n) => el("tr", {}, el("td", {text: n.node_type}), el("td", {class: "num", text: n.price === null ? "unpriced" : money(n.price)}),
        el("td", {class: "num", text: n.nodes}), el("td", {class: "num", text: hours(n.leased_gpu_hours)}),
        el("td", {class: "num", text: hours(n.idle_gpu_hours)}), el("td", {class: "num", text: money(n.leased_cost)}),
        el("td", {class: "num", text: money(n.idle_cost)}))), {class: "grid"}));
  }
  for (const [g, title] of COST_GROUPS) {
    const rows = (c.groups || {})[g] || [];
    if (!rows.length) continue;
    out.push(el("h2", {text: title}), table([g[0].toUpperCase() + g.slice(1), "GPU-hours", "Cost", ...(g === "workload" ? ["Team", "Class"] : [])],
      rows.map((x) => el("tr", {"data-key": x.key},
        el("td", {}, g === "team" ? teamTag(x.key) : g === "workload" ? el("a", {href: `/workload/${encodeURIComponent(x.key)}`, text: x.key}) : x.key),
        el("td", {class: "num", text: hours(x.gpu_hours)}), el("td", {class: "num", text: money(x.cost)}),
        g === "workload" ? [el("td", {}, teamTag(x.team)), el("td", {text: x.class || ""})] : null)), {id: `cost-${g}`, class: "grid"}));
  }
  return [el("div", {id: "cost"}, out)];
};

VIEWS.workload = function (snap) {
  const w = snap.workload;
  document.getElementById("title").textContent = shown(`Workload ${w.id}`);
  const facts = [
    ["Team", teamTag(w.team)], ["Class", w.class], ["State", el("span", {class: "state", "data-state": w.state, text: w.state})],
    ["Position", w.position ?? "-"], ["Reason", w.reason || "-"], ["Now", w.detail || "-"],
    ["Owner", w.redacted ? "hidden" : (w.owner || "-")], ["Submitted", fmtTime(w.submit_time)],
    ["Admitted", fmtTime(w.admitted_at)], ["Step", w.step ?? "-"],
    ["Preemptions / restarts", `${w.preemptions ?? 0} / ${w.restarts ?? 0}`],
  ];
  const out = [
    w.redacted ? el("p", {id: "redacted", class: "banner warn", text: "Another team's workload: its spec, config, owner and journal are shown to its team only."}) : null,
    el("dl", {class: "facts", id: "facts"}, facts.map(([k, v]) => [el("dt", {text: k}), el("dd", {}, v)])),
  ];
  const quota = Object.entries(w.team_quota || {});
  if (quota.length) {
    const rows = quota.map(([r, q]) => el("tr", {},
      el("td", {text: r.toUpperCase()}), el("td", {class: "num", text: fmtNum(q.used)}),
      el("td", {class: "num", text: fmtNum(q.nominal)}), el("td", {class: "num", text: fmtNum(q.borrowing_limit)}),
      el("td", {class: "barcell"}, quotaBar(q))));
    out.push(el("h2", {text: `Team ${w.team}'s quota`}),
             table(["Resource", "Used", "Nominal", "Borrowing limit", ""], rows, {id: "quota", class: "grid"}));
  }
  if (snap.journal_visible) {
    out.push(el("h2", {text: "MLflow"}));
    if (!snap.mlflow_runs.length) out.push(el("p", {class: "hint", text: "No MLflow run yet."}));
    for (const r of snap.mlflow_runs) {
      out.push(el("p", {class: "mlflow"}, r.url ? el("a", {href: r.url, target: "_blank", rel: "noopener noreferrer", id: `mlflow-${r.id}`, text: `MLflow run ${r.id}`})
                                               : `MLflow run ${r.id} (start the console with --mlflow-url to link it)`));
    }
    out.push(el("h2", {text: "Journal"}), table(["Time", "Event", "Note"],
      snap.journal.map((e) => el("tr", {"data-kind": e.kind}, el("td", {class: "time", text: fmtTime(e.ts)}),
                                 el("td", {text: e.kind}), el("td", {text: e.note || ""}))), {id: "journal", class: "grid"}));
  }
  return out;
};

// ---------------------------------------------------------------------------------------------------- wiring
function route() {
  for (const [re, view, title] of ROUTES) {
    const m = location.pathname.match(re);
    if (m) return {view, title, id: view === "workload" ? decodeURIComponent(m[1]) : null};
  }
  return {view: "queue", title: "Queue", id: null};
}

let stream = null;

function open(r, extra) {
  if (stream) stream.close();
  const params = new URLSearchParams({view: r.view, ...(r.id ? {id: r.id} : {}), ...(extra || {}), csrf: secret()});
  stream = new EventSource(`/api/stream?${params}`);
  setLive("connecting");
  stream.addEventListener("snapshot", (ev) => {
    const snap = JSON.parse(ev.data);
    const content = document.getElementById("content");
    const focus = document.activeElement && document.activeElement.id;
    content.replaceChildren(...VIEWS[r.view](snap, r).filter(Boolean));
    banner("");
    setLive("live", snap.at);
    document.body.dataset.updated = String(snap.at);
    const box = document.getElementById("show-done");
    if (box) {
      box.addEventListener("change", () => open(r, box.checked ? {all: "1"} : {}));
      if (focus === "show-done") box.focus();
    }
  });
  stream.addEventListener("failure", (ev) => { banner(JSON.parse(ev.data).error, "error"); setLive("error"); });
  stream.addEventListener("logout", () => { stream.close(); location.assign("/login"); });
  stream.onerror = () => {
    setLive("reconnecting");
    // A stream the server refused (the session is gone: a console restart, a logout elsewhere) is not retried by
    // the browser: ask who we are, then log in again or try again.
    if (stream.readyState === EventSource.CLOSED) setTimeout(() => recover(r, extra), 2000);
  };
}

async function recover(r, extra) {
  try {
    const who = await api("/api/whoami");
    if (who.status === 401) { location.assign("/login"); return; }
  } catch (e) { /* the console is away: try again */ }
  open(r, extra);
}

async function whoami() {
  const r = await api("/api/whoami");
  if (r.status === 401) { location.assign("/login"); return; }
  const who = document.getElementById("who");
  if (!r.ok) { who.textContent = "?"; return; }
  const me = await r.json();
  if (me.auth === false) {
    who.textContent = "authentication off";
  } else {
    who.textContent = shown(`${me.user} · ${me.role}${me.teams.length ? " · " + me.teams.join(", ") : ""}`);
    document.getElementById("logout").hidden = false;
  }
}

function main() {
  takeSecret();
  document.getElementById("logout").addEventListener("submit", () => sessionStorage.removeItem(SECRET_KEY));
  const r = route();
  document.getElementById("title").textContent = shown(r.id ? `Workload ${r.id}` : r.title);
  document.title = `Raylane · ${r.id || r.title}`;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.nav === r.view);
  whoami();
  open(r);
}

document.addEventListener("DOMContentLoaded", main);
