"""Keeping the control plane's state from growing with its history: the compactor and the book of records.

This module owns *when* the journal is compacted and *what* is archived; ``raylane.control.journal`` stores it (one
sqlite transaction per compaction). ``Compactor`` runs after a commit once ``JournalSpec.compact_every`` entries were
appended since the last compaction (at most ``JournalSpec.compact_batch`` workloads each time: bounded work inline):

1. take the ended workloads that may leave memory (``archivable``),
2. snapshot the runtime model as it stands with them forgotten (``snapshot_runtimes``), and the node book with the
   cost ledger's node presence (``snapshot_nodes``: nodes lost before the retention are left out),
3. have the journal move their entries and the tail's audit and node entries to the archive, write the snapshots and drop
   what passed its retention (``Journal.compact``: all or nothing),
4. only then drop them from memory (``Records.drop``, ``RuntimeBook.forget``, ``Ledger.forget``: the cost ledger reads
   them back from the archive when a report's window needs them).

A crash before 3 commits leaves the journal as it was (a restart replays it all, as before); after, the restart
reads the snapshot and the live tail. ``Records`` is the state machine's dict of records: the live ones in memory,
an archived one rebuilt from the archive when it is asked for by id (``get``, ``[]``, ``in``), never listed.

Words
- *archivable*: ended (``terminal``), for ``JournalSpec.archive_after`` at least, nothing left to do after its end
  (``ends.pending``), not a stage of a pipeline still running, not the source of a live workload's checkpoint pin.
- *runtimes snapshot*: the pickled ``RuntimeBook`` (model and the ids it learned from), tagged with
  ``RUNTIMES_FORMAT``; one of another format is not loaded: the book is learned again from the archive, in the
  order the workloads ended (``relearn``).
"""
from __future__ import annotations

import json
import pickle
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Optional

from raylane.control import ends
from raylane.control.journal import Entry, Journal, Kind
from raylane.control.learned import RuntimeBook
from raylane.control.records import Record

__all__ = ["Compactor", "Records", "record_from_entries", "load_runtimes", "load_nodes", "RUNTIMES", "RUNTIMES_FORMAT",
           "NODES"]

RUNTIMES = "runtimes"  # the snapshot's name in the journal
NODES = "nodes"  # the node book's and the cost ledger's node presence, as JSON (``snapshot_nodes``)
RUNTIMES_FORMAT = b"raylane.runtimes.v1\n"  # the first bytes of the snapshot: a pickled RuntimeBook of this release


def record_from_entries(wid: str, entries: Iterable[Entry]) -> Optional[Record]:
    """A workload's record rebuilt from its entries (as the replay at a restart builds it); None without a
    ``submitted`` entry."""
    rec = None
    for e in entries:
        if e.kind == Kind.SUBMITTED:
            rec = Record(wid, e.data["spec"], e.data["submit_time"], job_id=e.data.get("job_id"))
        if rec is not None:
            rec.apply(e)
    return rec


class Records(dict):
    """Workload id -> ``Record``: the live records (a dict), and the archived ones read back on a lookup by id.
    Iterating, ``len`` and ``values()`` see the live ones only; an archived record read back is a copy (changing
    it changes nothing), kept in a small cache."""

    CACHE = 256

    def __init__(self, journal: Journal):
        super().__init__()
        self._journal = journal
        self._cache: "OrderedDict[str, Optional[Record]]" = OrderedDict()

    def _archived(self, wid: Any) -> Optional[Record]:
        if not isinstance(wid, str):
            return None
        if wid in self._cache:
            self._cache.move_to_end(wid)
            return self._cache[wid]
        entries = self._journal.archived(wid)
        rec = record_from_entries(wid, entries) if entries else None
        self._cache[wid] = rec
        while len(self._cache) > self.CACHE:
            self._cache.popitem(last=False)
        return rec

    def live(self, wid: str) -> Optional[Record]:
        return dict.get(self, wid)

    def get(self, wid, default=None):
        rec = dict.get(self, wid)
        if rec is None:
            rec = self._archived(wid)
        return default if rec is None else rec

    def __missing__(self, wid):
        rec = self._archived(wid)
        if rec is None:
            raise KeyError(wid)
        return rec

    def __contains__(self, wid) -> bool:
        return dict.__contains__(self, wid) or self._archived(wid) is not None

    def drop(self, ids: Iterable[str]) -> None:
        """Archived: out of memory."""
        for wid in ids:
            self.pop(wid, None)
            self._cache.pop(wid, None)

    def __setitem__(self, wid, rec) -> None:
        self._cache.pop(wid, None)
        super().__setitem__(wid, rec)


def snapshot_runtimes(book: RuntimeBook, archived: Iterable[str]) -> bytes:
    """The book as a restart loads it once ``archived`` are out of memory (``load_runtimes``)."""
    copy = pickle.loads(pickle.dumps(book, protocol=pickle.HIGHEST_PROTOCOL))  # the live book stays as it is
    copy.forget(archived)  # until the compaction is committed
    return RUNTIMES_FORMAT + pickle.dumps(copy, protocol=pickle.HIGHEST_PROTOCOL)


def load_runtimes(journal: Journal) -> Optional[RuntimeBook]:
    """The runtime book the last compaction saved; None when there is none or it is of another format."""
    snap = journal.snapshot(RUNTIMES)
    if snap is None or not snap[1].startswith(RUNTIMES_FORMAT):
        return None
    try:
        book = pickle.loads(snap[1][len(RUNTIMES_FORMAT):])
    except Exception:  # noqa: BLE001 - a class of this release changed shape: learned again instead
        return None
    return book if isinstance(book, RuntimeBook) else None


def snapshot_nodes(book, ledger, now: float, forget_before: float) -> bytes:
    """The node book and the ledger's node presence as a restart loads them (``load_nodes``); nodes lost, and
    spans ended, before ``forget_before`` are left out."""
    return json.dumps({"book": book.snapshot(now, forget_before),
                       "spans": ledger.node_spans(forget_before) if ledger is not None else []}).encode()


def load_nodes(journal: Journal) -> Optional[Dict[str, Any]]:
    """``{"book": ..., "spans": ...}`` of the last compaction (``snapshot_nodes``); None when there is none."""
    snap = journal.snapshot(NODES)
    return None if snap is None else json.loads(snap[1])


def relearn(journal: Journal, book: RuntimeBook) -> None:
    """Feed ``book`` every archived workload, in the order they ended (no usable snapshot)."""
    archived = []
    for wid, entries in journal.archived_workloads():
        rec = record_from_entries(wid, entries)
        if rec is not None:
            book.seen(rec)
            archived.append(wid)
    book.forget(archived)


class Compactor:
    """Compacts ``journal`` after a commit, every ``spec().compact_every`` appended entries (module docstring).
    ``records``: the state machine's; ``runtimes``, ``pipes``: its ``RuntimeBook`` and ``PipelineBook`` now; ``spec``: the policy's
    ``JournalSpec`` now; ``before``: called first (the cost ledger reads what it has not yet: ``_cost_sync``)."""

    def __init__(self, journal: Journal, records: Records, runtimes: Callable[[], RuntimeBook], pipes,
                 spec: Callable[[], Any], clock: Callable[[], float], before: Optional[Callable[[], None]] = None,
                 gate=None, nodes: Optional[Callable[[], Any]] = None, ledger: Optional[Callable[[], Any]] = None):
        self.journal, self.records, self.runtimes, self.pipes = journal, records, runtimes, pipes
        self.spec, self.clock, self.before = spec, clock, before
        # The node book and the cost ledger (None: node entries stay in the tail).
        self.nodes, self.ledger = nodes, ledger
        # The gate, whose tokens dead for longer than the retention compaction forgets (None: none).
        self.gate = gate
        self.runs = 0  # compactions done by this one
        self._busy = False

    def __call__(self) -> None:
        """The journal's ``after_commit``."""
        if not self._busy and self.journal.appended >= self.spec().compact_every:
            self.run()

    def archivable(self, now: float, limit: Optional[int]) -> Dict[str, float]:
        """Id -> when it ended, of the records that may leave memory now (at most ``limit``, those that ended
        first)."""
        spec = self.spec()
        held = set()
        for rec in self.records.values():
            if rec.pin and not rec.pin.get("released") and not rec.state.terminal:
                held.add(rec.pin.get("source"))
        for run in self.pipes().active():
            held.update(run.stages.values())
        out = [(rec.ended_at, wid) for wid, rec in self.records.items()
               if rec.state.terminal and wid not in held and rec.ended_at is not None
               and rec.ended_at <= now - spec.archive_after and not ends.pending(rec)]
        out.sort()
        return {wid: ended for ended, wid in (out if limit is None else out[:limit])}

    def run(self, limit: Optional[int] = -1) -> int:
        """One compaction (``limit``: workloads at most; -1: ``compact_batch``; None: all); how many workloads it
        archived."""
        self._busy = True
        try:
            spec, now = self.spec(), self.clock()
            if self.before is not None:
                self.before()
            moving = self.archivable(now, spec.compact_batch if limit == -1 else limit)
            book = self.runtimes()
            dead = self.gate.dead_tokens(now - spec.retention) if self.gate is not None else []
            snapshots = {RUNTIMES: snapshot_runtimes(book, moving)}
            if self.nodes is not None:
                snapshots[NODES] = snapshot_nodes(self.nodes(), self.ledger() if self.ledger else None, now,
                                                  now - spec.retention)
            self.journal.compact(workloads=moving, snapshots=snapshots, archive_before=now - spec.retention,
                                 audit_before=now - spec.audit_retention, dead_tokens=dead,
                                 archive_nodes=self.nodes is not None)
            if dead:
                self.gate.forget_tokens(dead)
            self.records.drop(moving)
            book.forget(moving)
            if self.ledger is not None:
                self.ledger().forget(moving, nodes_before=now - spec.retention)
            self.runs += 1
            return len(moving)
        finally:
            self._busy = False
