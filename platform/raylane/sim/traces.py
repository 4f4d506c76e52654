"""Job traces: reading the Philly, Tiresias and generic CSV formats into one list of ``TraceJob``.

This module owns the trace formats and nothing else: it knows column names, units and time parsing, and reports
every bad row at once as a ``ValidationError`` whose entries name the row, the column and the bad value. It knows
nothing of clusters or policies.

Words
- *submit*: seconds since the trace's origin (the earliest submit in the file, or the window start).
- *duration*: the seconds a job needs once running, without interruption. The simulator knows it; a policy sees it
  only as a runtime estimate, and only where the replay is told to give one.
- *team*: who the job belongs to; from a column chosen per format (Philly: the virtual cluster ``cluster``).
- *user*: who submitted it, from a ``user`` column where the header has one (any format; the original Philly logs
  have one, the republished file shipped here does not) or the column ``user_column`` names.

Formats (chosen by ``format=`` or recognised from the header)
- ``philly``: ``timestamp,duration,num_gpus,gpu_time,cluster`` (Microsoft Philly 2017 as republished by Sia and
  AdaptDL). ``timestamp`` is ``YYYY-MM-DD HH:MM:SS`` (taken as UTC); rows are not in time order.
- ``tiresias``: ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` (Tiresias' simulator).
- ``generic``: required ``submit_time`` (seconds, or an ISO 8601 date-time), ``duration`` (seconds), ``gpus``
  (total GPUs of the job; may be fractional); optional ``id``, ``team``, ``user``, ``name`` (what the user calls
  the job; the runtime model learns from each user's runs of a name), ``class``, ``workers`` (gang
  size; each worker gets ``gpus / workers``, which must be a share of one GPU (below 1: ``gpus: 0.5`` alone, or
  ``gpus: 2, workers: 4`` for 0.5 each) or a whole number of GPUs, as Ray requires), ``cpus`` and ``memory`` (GiB; totals, split evenly over the workers), ``features``
  (``;``-separated node tags every worker needs), ``estimate`` (the runtime the user declared, seconds) and
  ``placement`` (a gang placement strategy). Elastic jobs: ``min_workers`` and ``max_workers`` (the sizes the
  gang may run at; each defaults to the job's worker count, which must lie between them) and ``speedup`` (its
  curve, ``SPEEDUP_ALLOWED``; empty: the replay's default). ``duration`` and ``gpus`` stay the job's at its
  requested size (``workers``), and each worker keeps ``gpus / workers``. Unknown columns are an error. See
  ``examples/traces/generic.csv``.

Speedup curves (``parse_speedup``): ``linear`` (n workers go n times as fast as one) and ``amdahl:P`` (a serial
fraction P in [0, 1): speedup(n) = 1 / (P + (1 - P) / n)). A job at n workers progresses at
speedup(n) / speedup(requested) seconds of its duration per second.
"""
from __future__ import annotations

import csv
import gzip
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from raylane.errors import NotFoundError, ValidationError
from raylane.scheduling.types import gpu_request_error

__all__ = ["FORMATS", "TraceJob", "Trace", "load_trace", "detect_format", "parse_time", "Speedup", "parse_speedup",
           "SPEEDUP_ALLOWED"]

# How many bad rows one error lists before it only counts the rest (a broken file has thousands).
MAX_REPORTED_ERRORS = 25

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
GENERIC_REQUIRED = ("submit_time", "duration", "gpus")
GENERIC_OPTIONAL = ("id", "team", "user", "name", "class", "workers", "cpus", "memory", "features", "estimate",
                    "placement",
                    "min_workers", "max_workers", "speedup")

FORMATS = ("philly", "tiresias", "generic")

# The team column used when none is named: the first of these the header has; else every job is in DEFAULT_TEAM.
_DEFAULT_TEAM_COLUMNS = {"philly": ("cluster",), "tiresias": (), "generic": ("team", "user")}
DEFAULT_TEAM = "default"


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float
    duration: float
    # Total GPUs of the job; a float where workers take shares of a GPU (0.5, or 2 over 4 workers).
    gpus: float
    team: str
    cls: Optional[str] = None
    # Gang shape when the trace gives one; the replay derives it from ``gpus`` and the node size otherwise.
    workers: Optional[int] = None
    cpus: float = 0.0
    memory: float = 0.0
    features: frozenset = frozenset()
    # A runtime the user declared (generic format); used when the replay's estimates mode is "declared".
    estimate: Optional[float] = None
    placement: Optional[str] = None
    # Elastic jobs: the gang's size bounds (None: the job's worker count) and its speedup curve (None: the
    # replay's default for its class).
    min_workers: Optional[int] = None
    max_workers: Optional[int] = None
    speedup: Optional[str] = None
    # Who submitted it, from the user column (None: the trace names no users); a team's user rule reads it.
    user: Optional[str] = None
    # What the user calls it (generic column ``name``): the runtime model learns per user and name.
    name: Optional[str] = None
    # Its code and config (``raylane.runtimes.entry_digest``; a journal replay's), for the runtime model.
    entry: Optional[str] = None


SPEEDUP_ALLOWED = "linear, or amdahl:P with a serial fraction P >= 0 and < 1 (like amdahl:0.05)"


@dataclass(frozen=True, slots=True)
class Speedup:
    """How much faster a job runs on n workers than on one: ``linear`` (n) or Amdahl's law with serial fraction
    ``serial``. Only ratios are used (rate at n = speedup(n) / speedup(requested)), so one worker's speed cancels."""

    kind: str = "linear"
    serial: float = 0.0

    def __call__(self, n: float) -> float:
        if self.kind == "linear":
            return float(n)
        return 1.0 / (self.serial + (1.0 - self.serial) / n)

    def rate(self, n: float, requested: float) -> float:
        """Seconds of the job's duration (measured at ``requested`` workers) done per second at ``n`` workers."""
        return 1.0 if n == requested else self(n) / self(requested)

    def __str__(self) -> str:
        return "linear" if self.kind == "linear" else f"amdahl:{self.serial:g}"


def parse_speedup(text: str) -> Speedup:
    """A curve from ``linear`` or ``amdahl:P``; ValueError naming the text and ``SPEEDUP_ALLOWED`` otherwise."""
    t = (text or "").strip().lower()
    if t == "linear":
        return Speedup()
    if t.startswith("amdahl:"):
        try:
            p = float(t.split(":", 1)[1])
        except ValueError:
            p = math.nan
        if math.isfinite(p) and 0.0 <= p < 1.0:
            return Speedup("amdahl", p)
    raise ValueError(f"speedup {text!r}: allowed: {SPEEDUP_ALLOWED}")


@dataclass
class Trace:
    jobs: List[TraceJob]
    source: str
    format: str
    # The wall-clock time (POSIX seconds, UTC) of ``submit == 0`` when the trace has dates; else None.
    origin: Optional[float] = None
    # Rows left out by the window, for the record.
    skipped: int = 0
    notes: List[str] = field(default_factory=list)

    @property
    def teams(self) -> List[str]:
        return sorted({j.team for j in self.jobs})

    def gpu_seconds(self) -> float:
        return sum(j.duration * j.gpus for j in self.jobs)

    def span(self) -> float:
        return (self.jobs[-1].submit - self.jobs[0].submit) if self.jobs else 0.0


def parse_time(value: str) -> float:
    """POSIX seconds (UTC) of a date-time like ``2017-10-01`` or ``2017-10-01 07:01:55``; naive times are UTC."""
    dt = datetime.fromisoformat(value.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def detect_format(header: Sequence[str]) -> Optional[str]:
    cols = set(header)
    if set(PHILLY_COLUMNS) - {"gpu_time"} <= cols:
        return "philly"
    if {"job_id", "num_gpu", "submit_time", "duration"} <= cols:
        return "tiresias"
    if set(GENERIC_REQUIRED) <= cols:
        return "generic"
    return None


class _Rows:
    """Collects (path, value, allowed) errors while rows are parsed, and raises them all together."""

    def __init__(self, source: str):
        self.source = source
        self.errors: List[Tuple[str, object, str]] = []
        self.count = 0

    def bad(self, row: int, column: str, value: object, allowed: str) -> None:
        self.count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append((f"row {row}, column {column}", value, allowed))

    def number(self, row: int, rec: Dict[str, str], column: str, *, minimum: float = 0.0, strict: bool = False,
               integer: bool = False) -> Optional[float]:
        raw = rec.get(column)
        raw = "" if raw is None else raw.strip()
        what = "an integer" if integer else "a number"
        allowed = f"{what} {'>' if strict else '>='} {minimum:g}"
        try:
            v = float(raw)
        except ValueError:
            self.bad(row, column, raw, allowed)
            return None
        if not math.isfinite(v) or v < minimum or (strict and v == minimum) or (integer and v != int(v)):
            self.bad(row, column, raw, allowed)
            return None
        return int(v) if integer else v

    def raise_if_any(self) -> None:
        if self.errors:
            errors = list(self.errors)
            if self.count > len(errors):
                errors.append(("(more rows)", self.count - len(errors), "fix the rows above; the rest are alike"))
            raise ValidationError(self.source, errors)


def load_trace(
    path: Union[str, Path],
    *,
    format: Optional[str] = None,
    team_column: Optional[str] = None,
    user_column: Optional[str] = None,
    start: Optional[Union[str, float]] = None,
    end: Optional[Union[str, float]] = None,
    limit: Optional[int] = None,
) -> Trace:
    """Read a trace, sorted by submit time (ties keep file order).

    ``team_column``: the column whose value is a job's team (``"none"``: one team for all). ``user_column``: the
    column whose value is a job's user (``"none"``: no users; default: ``user`` where the header has it, in any
    format; an empty value: no user for that job). ``start``/``end``:
    keep jobs submitted in ``[start, end)``, as dates (``2017-10-01``) for traces with dates or seconds otherwise;
    submit times are then counted from ``start``. ``limit``: keep only the first ``limit`` jobs after that.
    """
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"trace {p} not found" + (" (it is a directory)" if p.exists() else ""))
    # A trace may be gzip-compressed (``.gz``): the shipped Philly trace is.
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ValidationError(str(p), [("(header)", "", "a CSV header row; the file is empty")]) from None
        rows = list(reader)
    fmt = format or detect_format(header)
    if fmt is None:
        raise ValidationError(str(p), [("(header)", ",".join(header),
                                        "the columns of a known format: philly (" + ",".join(PHILLY_COLUMNS)
                                        + "), tiresias (" + ",".join(TIRESIAS_COLUMNS) + ") or generic ("
                                        + ",".join(GENERIC_REQUIRED) + " and optional " + ",".join(GENERIC_OPTIONAL)
                                        + ")")])
    if fmt not in FORMATS:
        raise ValidationError(str(p), [("format", fmt, "one of " + ", ".join(FORMATS))])
    required = {"philly": PHILLY_COLUMNS[:3] + ("cluster",), "tiresias": ("job_id", "num_gpu", "submit_time",
                                                                            "duration"),
                "generic": GENERIC_REQUIRED}[fmt]
    errors = [("(header)", ",".join(header), f"a column named {c!r} ({fmt} format)") for c in required
              if c not in header]
    if fmt == "generic":
        known = set(GENERIC_REQUIRED) | set(GENERIC_OPTIONAL)
        errors += [("(header)", c, "a generic-format column: " + ", ".join(GENERIC_REQUIRED + GENERIC_OPTIONAL))
                   for c in header if c not in known]
    if team_column is None:
        team_column = next((c for c in _DEFAULT_TEAM_COLUMNS[fmt] if c in header), "none")
    if team_column != "none" and team_column not in header:
        errors.append(("team column", team_column, "a column of the header (" + ", ".join(header)
                       + ") or 'none' for one team"))
    if user_column is None:
        user_column = "user" if "user" in header else "none"
    if user_column != "none" and user_column not in header:
        errors.append(("user column", user_column, "a column of the header (" + ", ".join(header)
                       + ") or 'none' for no users"))
    if errors:
        raise ValidationError(str(p), errors)

    parse = {"philly": _philly_row, "tiresias": _tiresias_row, "generic": _generic_row}[fmt]
    acc = _Rows(str(p))
    parsed: List[Tuple[float, int, TraceJob]] = []
    width = len(header)
    team_col = None if team_column == "none" else team_column
    seen: Dict[str, int] = {}
    for i, raw in enumerate(rows):
        row = i + 2  # 1-based, after the header: what an editor shows
        if not raw or (len(raw) == 1 and not raw[0].strip()):
            continue
        if len(raw) != width:
            acc.bad(row, "(all)", ",".join(raw), f"{width} fields like the header, got {len(raw)}")
            continue
        rec = dict(zip(header, raw))
        job = parse(acc, row, rec, team_col)
        if job is None:
            continue
        if user_column != "none":
            job = replace(job, user=rec[user_column].strip() or None)
        if fmt == "generic" and "name" in rec:
            job = replace(job, name=rec["name"].strip() or None)
        if job.id in seen:
            acc.bad(row, "id" if fmt == "generic" else "job_id", job.id, f"a unique job id (row {seen[job.id]} has it)")
            continue
        seen[job.id] = row
        parsed.append((job.submit, i, job))
    acc.raise_if_any()
    parsed.sort(key=lambda e: (e[0], e[1]))
    jobs = [j for _, _, j in parsed]

    has_dates = fmt == "philly" or (fmt == "generic" and bool(jobs) and _dated(rows, header))
    lo = _bound(start, has_dates, "start", str(p))
    hi = _bound(end, has_dates, "end", str(p))
    kept = [j for j in jobs if (lo is None or j.submit >= lo) and (hi is None or j.submit < hi)]
    skipped = len(jobs) - len(kept)
    if limit is not None:
        skipped += max(0, len(kept) - limit)
        kept = kept[:limit]
    origin = lo if lo is not None else (kept[0].submit if kept else 0.0)
    if not has_dates and lo is None:
        origin = 0.0  # traces in seconds keep their own zero
    kept = [_shift(j, origin) for j in kept] if origin else kept
    return Trace(kept, str(p), fmt, origin if has_dates else None, skipped)


def _shift(j: TraceJob, origin: float) -> TraceJob:
    return replace(j, submit=j.submit - origin)


def _dated(rows, header) -> bool:
    k = header.index("submit_time")
    for raw in rows:
        if len(raw) > k and raw[k].strip():
            try:
                float(raw[k])
                return False
            except ValueError:
                return True
    return False


def _bound(value, has_dates: bool, what: str, source: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except ValueError:
        pass
    if not has_dates:
        raise ValidationError(source, [(what, value, "seconds (this trace has no dates)")])
    try:
        return parse_time(value)
    except ValueError:
        raise ValidationError(source, [(what, value, "a date like 2017-10-01 or 2017-10-01T06:00:00")]) from None


def _team(rec: Dict[str, str], team_col: Optional[str]) -> str:
    if team_col is None:
        return DEFAULT_TEAM
    return rec[team_col].strip() or DEFAULT_TEAM


def _philly_row(acc: _Rows, row: int, rec: Dict[str, str], team_col) -> Optional[TraceJob]:
    ts = rec["timestamp"].strip()
    try:
        submit = parse_time(ts)
    except ValueError:
        acc.bad(row, "timestamp", ts, "a date-time like 2017-10-09 07:01:55")
        submit = None
    duration = acc.number(row, rec, "duration", strict=True)
    gpus = acc.number(row, rec, "num_gpus", minimum=1, integer=True)
    if submit is None or duration is None or gpus is None:
        return None
    # Philly has no job id: the data row number is stable across sorts and windows.
    return TraceJob(f"philly-{row - 1}", submit, duration, gpus, _team(rec, team_col))


def _tiresias_row(acc: _Rows, row: int, rec: Dict[str, str], team_col) -> Optional[TraceJob]:
    submit = acc.number(row, rec, "submit_time")
    duration = acc.number(row, rec, "duration", strict=True)
    gpus = acc.number(row, rec, "num_gpu", minimum=1, integer=True)
    if submit is None or duration is None or gpus is None:
        return None
    return TraceJob(rec["job_id"].strip() or f"row-{row}", submit, duration, gpus, _team(rec, team_col))


def _generic_row(acc: _Rows, row: int, rec: Dict[str, str], team_col) -> Optional[TraceJob]:
    raw_submit = rec["submit_time"].strip()
    try:
        submit: Optional[float] = float(raw_submit)
        if submit < 0 or not math.isfinite(submit):
            acc.bad(row, "submit_time", raw_submit, "seconds >= 0 or an ISO 8601 date-time")
            submit = None
    except ValueError:
        try:
            submit = parse_time(raw_submit)
        except ValueError:
            acc.bad(row, "submit_time", raw_submit, "seconds >= 0 or an ISO 8601 date-time like 2024-05-01T08:00:00")
            submit = None
    duration = acc.number(row, rec, "duration", strict=True)
    gpus = acc.number(row, rec, "gpus")
    if gpus is not None and gpus == int(gpus):
        gpus = int(gpus)  # integer traces keep integer GPU counts
    ok = submit is not None and duration is not None and gpus is not None

    def opt(column: str, **kw) -> Optional[float]:
        if not (rec.get(column) or "").strip():
            return None
        return acc.number(row, rec, column, **kw)

    workers = opt("workers", minimum=1, integer=True)
    if gpus is not None and workers is not None and gpus:
        why = gpu_request_error(gpus / workers)
        if why is not None:
            acc.bad(row, "workers", rec["workers"], f"a gang size that gives each worker {why} "
                    f"(gpus {gpus:g} / workers {workers:g} = {gpus / workers:g})")
            ok = False
    elif gpus is not None and gpus > 1 and gpus != int(gpus):
        acc.bad(row, "gpus", rec["gpus"], "a whole number of GPUs, or below 1 (a share of one GPU), or a "
                "'workers' count that splits it into shares below 1 or whole GPUs per worker")
        ok = False
    lo = opt("min_workers", minimum=1, integer=True)
    hi = opt("max_workers", minimum=1, integer=True)
    if lo is not None and hi is not None and lo > hi:
        acc.bad(row, "max_workers", rec["max_workers"], f"an integer >= min_workers ({lo})")
        ok = False
    elif workers is not None and ((lo is not None and lo > workers) or (hi is not None and hi < workers)):
        col = "min_workers" if lo is not None and lo > workers else "max_workers"
        acc.bad(row, col, rec[col], f"a bound of the gang's size that holds its workers ({workers}): "
                                    "min_workers <= workers <= max_workers")
        ok = False
    speedup = (rec.get("speedup") or "").strip() or None
    if speedup is not None:
        try:
            speedup = str(parse_speedup(speedup))
        except ValueError:
            acc.bad(row, "speedup", rec["speedup"], SPEEDUP_ALLOWED)
            ok = False
    cpus = opt("cpus") or 0.0
    memory = opt("memory") or 0.0
    estimate = opt("estimate", strict=True)
    if gpus == 0 and not cpus and not memory:
        acc.bad(row, "gpus", rec["gpus"], "above 0, unless the job asks for cpus or memory")
        ok = False
    feats = frozenset(f.strip() for f in (rec.get("features") or "").split(";") if f.strip())
    if not ok:
        return None
    return TraceJob(
        (rec.get("id") or "").strip() or f"row-{row}", submit, duration, gpus, _team(rec, team_col),
        (rec.get("class") or "").strip() or None, workers, cpus, memory, feats, estimate,
        (rec.get("placement") or "").strip() or None, lo, hi, speedup,
    )
