"""What each page of the web console shows, as JSON: built from control-plane calls made with the viewer's own
credential, so what another team may not see is already left out by the control plane's gate.

A view is a function ``(client, settings, **args) -> dict`` registered in ``BUILDERS`` by its name. A call the
running control plane does not have (an older version, or a feature not built yet) makes its part of the page
``{"available": False, "why": ...}``; the page says so instead of failing.

Words: *view* (queue, teams, nodes, cost, workload), *snapshot* (a view at one moment: ``build``'s result, with
``at``, the time it was taken).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from raylane.control.api import WORKLOAD_ID
from raylane.errors import ValidationError
from raylane.render import journal_lines

__all__ = ["VIEWS", "BUILDERS", "COST_WINDOWS", "WORKLOAD_ID", "build", "mlflow_run_url"]


def build(client, settings, view: str, **args) -> Dict[str, Any]:
    """The snapshot of ``view`` for the caller of ``client``."""
    return {"view": view, "at": time.time(), **BUILDERS[view](client, settings, **args)}


def _optional(client, method: str, **kw) -> Tuple[Any, Optional[str]]:
    """(result, None), or (None, why) when this client or the running control plane has no such call."""
    fn = getattr(client, method, None)
    if fn is None:
        return None, f"this Raylane has no `{method}` call"
    try:
        return fn(**kw), None
    except ValidationError as exc:
        if exc.source == "control-plane request":  # raylane.control.api.parse: an unknown call name
            return None, f"the running control plane has no `{method}` call (an older version)"
        raise


def queue(client, settings, include_done: bool = False) -> Dict[str, Any]:
    """Every workload in queue order, with position, reason, wait, forecast (a pending one's ``eta_*``, a running
    lease's ``predicted_end*``: what the page's timeline draws) and (for the caller's teams) owner; another team's
    rows are marked ``redacted`` (the control plane leaves their owner and what their runtime rests on out)."""
    rows = []
    counts: Dict[str, int] = {}
    for r in client.queue(include_done):
        row = dict(r)
        row["redacted"] = "owner" not in row
        counts[row["state"]] = counts.get(row["state"], 0) + 1
        rows.append(row)
    return {"rows": rows, "counts": counts, "include_done": include_done}


def teams(client, settings) -> Dict[str, Any]:
    """Each team's use of its quota (nominal, borrowing and lending limits), the cohorts above it (a quota tree's)
    and, where cost accounting exists, its spend against its budget; the tree's cohorts with their figures."""
    rows, why = _optional(client, "teams")
    spend = _team_spend(client)
    cohorts, _ = _optional(client, "cohorts") if why is None else (None, None)
    return {"available": why is None, "why": why, "teams": rows or [], "spend": spend, "cohorts": cohorts or []}


def _team_spend(client) -> Dict[str, Any]:
    """team -> its month's spend against its budget (``spent``, ``budget``, ``share``, ``alerting``), for the teams
    the caller may see the cost of (an operator: all; anyone else: their own), or {} without cost accounting."""
    out, why = _optional(client, "cost", by="team")
    if why is not None:
        return {}
    return {b["team"]: b for b in _as_dict(out).get("budgets", [])}


def _as_dict(report: Any) -> Dict[str, Any]:
    """A cost report (``raylane.cost.CostReport``, or its dict) as a dict."""
    return report.to_dict() if hasattr(report, "to_dict") else dict(report or {})


def nodes(client, settings) -> Dict[str, Any]:
    """Every node (lost ones too) with its service state, GPUs and the leases on it."""
    rows, why = _optional(client, "nodes", include_lost=True)
    return {"available": why is None, "why": why, "nodes": rows or []}


COST_WINDOWS = {"all": None, "24h": 86400.0, "7d": 7 * 86400.0, "month": "month"}


def cost(client, settings, window: str = "all") -> Dict[str, Any]:
    """Spend from the control plane's cost accounting (GPU-hours times each node type's price) in ``window`` (a key
    of ``COST_WINDOWS``): totals, idle GPUs, per node type, team, class, sweep, pipeline and workload, and each team's
    month against its budget; for the teams the caller may see."""
    span = COST_WINDOWS[window]
    if span == "month":
        from raylane.cost import month_start

        since = month_start(time.time())
    else:
        since = time.time() - span if span else None
    out, why = _optional(client, "cost", since=since)
    return {"available": why is None, "why": why, "window": window, "windows": list(COST_WINDOWS),
            "cost": _as_dict(out) if why is None else None}


def workload(client, settings, workload_id: str) -> Dict[str, Any]:
    """``explain`` for one workload (redacted for another team's), its journal as ``raylane explain`` prints it,
    and links to its MLflow runs."""
    out = dict(client.explain(workload_id))
    journal: List[Dict[str, Any]] = out.pop("journal", None) or []
    runs: List[str] = []
    for e in journal:
        rid = e.get("mlflow_run_id")
        if rid and rid not in runs:
            runs.append(rid)
    lines = [{"ts": e["ts"], "kind": e["kind"], "note": e.get("note") or _summary(e)}
             for e in journal_lines(journal)]
    return {"workload": out, "journal": lines, "journal_visible": not out.get("redacted"),
            "mlflow_runs": [{"id": r, "url": mlflow_run_url(settings.mlflow_url, r)} for r in runs]}


SUMMARY_KEYS = ("state", "outcome", "reason", "detail", "step", "job_id", "placement", "by")


def _summary(entry: Dict[str, Any]) -> str:
    """A journal entry without a note, in a line: its few telling fields."""
    parts = []
    for k in SUMMARY_KEYS:
        v = entry.get(k)
        if v in (None, "", [], ()):
            continue
        if k == "placement" and isinstance(v, (list, tuple)):
            v = ", ".join(str(n)[:12] for n in v)
        parts.append(f"{k}={v}")
    return "; ".join(parts)[:500]


def mlflow_run_url(base: Optional[str], run_id: str) -> Optional[str]:
    """The MLflow UI's page of a run (its ``#/runs/ID`` route finds the run's experiment), or None without a UI."""
    if not base:
        return None
    return f"{base.rstrip('/')}/#/runs/{run_id}"


BUILDERS: Dict[str, Callable[..., Dict[str, Any]]] = {
    "queue": queue, "teams": teams, "nodes": nodes, "cost": cost, "workload": workload,
}
VIEWS: Tuple[str, ...] = tuple(BUILDERS)
