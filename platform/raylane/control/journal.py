"""The control actor's durable journal: an append-only log of every state change, in sqlite.

The control actor writes an entry *before* it acts on a change (admit before creating the placement group,
preempt before telling the workload), and rebuilds its whole state by replaying the journal when it starts. The
journal owns nothing else. One file per control plane; sqlite's WAL mode makes each append durable on commit.

Entry kinds are ``Kind``'s members, stored as their values (``admitted``): the journal's text is the same whether a
caller names a kind by the enum or by its value. Entries read back carry the stored text; a kind an older release
wrote and this one no longer knows is read as it is, and its readers skip it.
"""
from __future__ import annotations

import enum
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, Optional, Union


class Kind(str, enum.Enum):
    """What a journal entry records. A workload's entries (workload id: its id) change its record
    (``raylane.control.records.Record.apply``); the others belong to the book named beside each."""

    SUBMITTED = "submitted"  # spec, submit time, owner
    REJECTED = "rejected"  # refused at submit: why
    ADMITTED = "admitted"  # a lease: placement, devices, placement group
    RUNNING = "running"  # its driver started the gang on the lease (job id)
    EVENT = "event"  # a note, progress (detail), a restart, the MLflow run named or closed, its job stopped
    CHECKPOINTED = "checkpointed"  # its gang saved a checkpoint: step, path
    PINNED = "pinned"  # its claim on another workload's checkpoint (raylane.control.checkpoints)
    UNPINNED = "unpinned"  # that claim released
    PREEMPTING = "preempting"  # preempted: asked to save a checkpoint and stop by a deadline
    RESIZING = "resizing"  # an elastic gang asked to stop and restart at another size
    RESIZED = "resized"  # ... restarted on the same lease at its new size
    RUN_LIMIT = "run_limit"  # its class's max_runtime reached: asked to stop by a deadline, to requeue or to end
    REQUEUED = "requeued"  # its lease ended without an end: back in the queue
    FINISHED = "finished"  # ended: SUCCEEDED or FAILED (``state``)
    CANCELLED = "cancelled"  # ended: cancelled
    NODE = "node"  # raylane.control.nodes: a node joined, was lost, cordoned, drained, ...
    SCALE = "scale"  # raylane.control.state_scale: new nodes asked for a waiting gang, or that ask withdrawn
    POLICY = "policy"  # the policy now in force (workload id ``@policy``)
    PIPELINE = "pipeline"  # raylane.control.pipelines: a pipeline submitted, an output, a re-plan, its end
    TOKEN = "token"  # raylane.control.gate: a token's digest created, rotated or revoked
    AUDIT = "audit"  # raylane.control.gate: who asked for what, with which outcome


@dataclass(frozen=True)
class Entry:
    """One journal row. ``kind``: a ``Kind`` (as appended) or its text (as read back); they compare equal."""

    seq: int
    ts: float
    kind: str
    workload_id: str
    data: Dict[str, Any]


class Journal:
    """``batched``: appends go into one open transaction until ``commit()`` (group commit: one fsync for many
    entries). Its owner commits before it acts on what it journaled and before it answers a caller
    (``ControlActor._durable``); what was appended but not committed is lost with the process, as a change not yet
    acted on. Otherwise each append commits at once."""

    def __init__(self, path: str, *, batched: bool = False):
        self.batched = batched
        self.clock = time.time  # an entry's time when the caller gives none (ControlState sets its own clock)
        self.path = os.path.abspath(os.path.expanduser(path))
        # Readable by the user that runs the control plane only: it holds every team's specs, the token digests
        # and the audit trail. sqlite gives its -wal and -shm files the main file's permissions.
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,"
            " kind TEXT NOT NULL, workload_id TEXT NOT NULL, data TEXT NOT NULL)"
        )

    def append(self, kind: Union[Kind, str], workload_id: str, ts: Optional[float] = None, **data: Any) -> Entry:
        """Journal one entry; ``kind`` must be a ``Kind`` (or a Kind's value): an entry no reader knows is a bug."""
        kind = Kind(kind)
        ts = self.clock() if ts is None else ts
        if self.batched and not self._db.in_transaction:
            self._db.execute("BEGIN")
        cur = self._db.execute(
            "INSERT INTO journal (ts, kind, workload_id, data) VALUES (?, ?, ?, ?)",
            (ts, kind.value, workload_id, json.dumps(data, sort_keys=True, default=str)),
        )
        return Entry(cur.lastrowid, ts, kind, workload_id, data)

    @property
    def pending(self) -> bool:
        """Entries appended and not committed yet (``batched`` only)."""
        return self._db.in_transaction

    def commit(self) -> None:
        """Make every appended entry durable (one fsync); nothing to do when none is pending."""
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    def replay(self) -> Iterator[Entry]:
        for seq, ts, kind, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal ORDER BY seq"
        ):
            yield Entry(seq, ts, kind, wid, json.loads(data))

    def entries_for(self, workload_id: str) -> Iterator[Entry]:
        for seq, ts, kind, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE workload_id = ? ORDER BY seq", (workload_id,)
        ):
            yield Entry(seq, ts, kind, wid, json.loads(data))

    def entries_of_kind(self, kind: Union[Kind, str], since: Optional[float] = None) -> Iterator[Entry]:
        for seq, ts, k, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE kind = ? AND ts >= ? ORDER BY seq",
            (Kind(kind).value, since or 0.0),
        ):
            yield Entry(seq, ts, k, wid, json.loads(data))

    def entries_after(self, seq: int, kinds: Optional[Iterable[Union[Kind, str]]] = None) -> Iterator[Entry]:
        """Entries past ``seq`` (of ``kinds`` only, if given), oldest first: what a reader that keeps up with the
        journal has not seen yet (``raylane.cost.Ledger``)."""
        kinds = [Kind(k).value for k in kinds] if kinds is not None else None
        where = f" AND kind IN ({', '.join('?' * len(kinds))})" if kinds else ""
        for s, ts, k, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE seq > ?" + where + " ORDER BY seq",
            (seq, *(kinds or ())),
        ):
            yield Entry(s, ts, k, wid, json.loads(data))

    def close(self) -> None:
        """Commit what is pending and close (again: nothing)."""
        try:
            self.commit()
        except sqlite3.ProgrammingError:  # closed already
            return
        self._db.close()
