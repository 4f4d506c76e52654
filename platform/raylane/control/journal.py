"""The control actor's durable journal: an append-only log of every state change, in sqlite.

The control actor writes an entry *before* it acts on a change (admit before creating the placement group,
preempt before telling the workload), and rebuilds its whole state by replaying the journal when it starts. The
journal owns nothing else. One file per control plane; sqlite's WAL mode makes each append durable on commit.

Entry kinds are ``Kind``'s members, stored as their values (``admitted``): the journal's text is the same whether a
caller names a kind by the enum or by its value. Entries read back carry the stored text; a kind an older release
wrote and this one no longer knows is read as it is, and its readers skip it.

Compaction (``raylane.control.archive`` decides what and when; this module stores it, in the same file, each step
inside one sqlite transaction, so that a crash at any step leaves the journal as it was before it):

- *live tail*: the ``journal`` table: what a restart replays. Every entry is appended here.
- *archive*: the entries of each ended workload moved out of the tail (``archive`` table, one compressed row per
  workload: ``pack``), kept until ``ended_at`` passes the retention.
- *audit archive*: audit entries moved out of the tail in chunks (``audit_chunks``), kept until the newest entry of
  a chunk passes the audit retention.
- *node archive*: the node book's entries (kind ``node``) moved out of the tail in chunks (``node_chunks``) when a
  snapshot of the book is written with them (``compact(archive_nodes=True)``), kept until the newest entry of a
  chunk passes the retention: history (``raylane sim --from-journal``, ``entries_of_kind``) reads them, a restart
  loads the snapshot instead.
- *snapshot*: named blobs written with the compaction that made them (``snapshot`` table): the state a restart
  loads instead of replaying what was archived (the runtime model), with the ``seq`` it was taken at.

Readers that answer about history (``entries_for``, ``entries_of_kind``, ``history``, ``archived_entries``) read the
archive too; ``replay`` and ``entries_after`` read the live tail only.
"""
from __future__ import annotations

import enum
import heapq
import json
import logging
import os
import sqlite3
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

log = logging.getLogger("raylane.control")


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


# Preset dictionary of the archive's compression: the words a workload's entries are made of, the commonest last
# (zlib finds matches nearer the end cheaper). A blob names its dictionary by its first byte; a new dictionary gets
# a new byte and the old ones stay readable.
_ZDICTS = {1: (
    '"outcome": "ok", "reason": "", "role": "operator", "target": "", "teams": [], "token_id": "-", "user": "'
    '{"action": "submit", {"action": "release", "kind": "train", "name": "", "run": {"intent": "", "owner": "'
    '"team": "team-"}, "submit_time": 17, "token_id": "-"}, {"mlflow_run_id": "", "job_id": "raysubmit_'
    '{"attained_gpu_s": 0.0, "lost_node": "", "step": , "restart": true, "preemption": true, "deadline": '
    '"note": "requeued: preempted by ", {"note": "cancelled by ", "by": "", "close_run": true, "job_stop_at": null}'
    '{"note": "failed: ", "outcome": "failed", "state": "FAILED", "step": null}{"detail": "'
    '{"path": "", "step": }, "checkpointed", "datasets": {}, "entrypoint": "workloads.ray_train:train_loop_per_worker"'
    '{"borrowing": false, "devices": [[0, 1], [0]], "note": "admitted on ", "pg_name": "raylane-.1", "placement": ["'
    '{"job_id": null, "note": "submitted by anonymous: test ", "owner": "anonymous", "spec": {"class": "pretrain", '
    '"config": {}, "gang": {"features": [], "group_by": "rack", "node_types": [], "resources": {"cpu": 0.5, "gpu": '
    '1.0, "memory": 0.0}, "workers": 1}, {"note": "succeeded: finished", "outcome": "finished", "state": "SUCCEEDED", '
    '"step": ]], [17000, 17000, "submitted", "admitted", "running", "finished", "audit", {"job_id": "raysubmit_'
).encode()}
_ZDICT = 1  # the dictionary new blobs are packed with


def pack(text: str) -> bytes:
    """``text`` compressed for the archive (raw deflate with the preset dictionary the first byte names)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, _ZDICTS[_ZDICT])
    return bytes((_ZDICT,)) + c.compress(text.encode()) + c.flush()


def unpack(blob: bytes) -> str:
    d = zlib.decompressobj(-15, _ZDICTS[blob[0]])
    return (d.decompress(blob[1:]) + d.flush()).decode()


def _pack_rows(rows) -> bytes:
    """A workload's rows ``(seq, ts, kind, data text)`` as one blob: a JSON list, each row's data as stored."""
    return pack("[" + ",".join(f"[{s},{ts!r},{json.dumps(k)},{d}]" for s, ts, k, d in rows) + "]")


def _unpack_entries(wid: str, blob: bytes) -> List[Entry]:
    return [Entry(s, ts, k, wid, d) for s, ts, k, d in json.loads(unpack(blob))]


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,"
    " kind TEXT NOT NULL, workload_id TEXT NOT NULL, data TEXT NOT NULL)",
    # A workload's entries (explain, compaction) without a scan of the whole tail.
    "CREATE INDEX IF NOT EXISTS journal_workload ON journal (workload_id, seq)",
    "CREATE TABLE IF NOT EXISTS archive (workload_id TEXT PRIMARY KEY, first_seq INTEGER NOT NULL,"
    " last_seq INTEGER NOT NULL, ended_at REAL NOT NULL, entries BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS archive_ended ON archive (ended_at)",
    "CREATE TABLE IF NOT EXISTS audit_chunks (first_seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL,"
    " first_ts REAL NOT NULL, last_ts REAL NOT NULL, entries BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshot (name TEXT PRIMARY KEY, seq INTEGER NOT NULL, data BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS node_chunks (first_seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL,"
    " first_ts REAL NOT NULL, last_ts REAL NOT NULL, entries BLOB NOT NULL)",
)
# Kinds archived in chunks, and their tables.
CHUNKED = {"audit": "audit_chunks", "node": "node_chunks"}
AUDIT_CHUNK = 512  # audit entries per archived chunk


class Journal:
    """``batched``: appends go into one open transaction until ``commit()`` (group commit: one fsync for many
    entries). Its owner commits before it acts on what it journaled and before it answers a caller
    (``ControlActor._durable``); what was appended but not committed is lost with the process, as a change not yet
    acted on. Otherwise each append commits at once.

    ``after_commit``: called (with no argument) after each commit that made entries durable; the control plane's
    compactor (``raylane.control.archive``) hangs there. An ``Exception`` from it is logged and does not undo the
    commit. ``appended``: entries appended since this journal was opened or last compacted."""

    def __init__(self, path: str, *, batched: bool = False):
        self.batched = batched
        self.clock = time.time  # an entry's time when the caller gives none (ControlState sets its own clock)
        self.path = os.path.abspath(os.path.expanduser(path))
        self.after_commit: Optional[Callable[[], None]] = None
        self.appended = 0
        # Readable by the user that runs the control plane only: it holds every team's specs, the token digests
        # and the audit trail. sqlite gives its -wal and -shm files the main file's permissions.
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        for stmt in _SCHEMA:
            self._db.execute(stmt)

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
        self.appended += 1
        if not self.batched:
            self._after_commit()
        return Entry(cur.lastrowid, ts, kind, workload_id, data)

    @property
    def pending(self) -> bool:
        """Entries appended and not committed yet (``batched`` only)."""
        return self._db.in_transaction

    def commit(self) -> None:
        """Make every appended entry durable (one fsync); nothing to do when none is pending."""
        if self._db.in_transaction:
            self._db.execute("COMMIT")
            self._after_commit()

    def _after_commit(self) -> None:
        if self.after_commit is None:
            return
        try:
            self.after_commit()
        except Exception:  # noqa: BLE001 - the entries are durable; a compaction that failed is tried again later
            log.exception("journal compaction failed; the journal is as it was before it")

    # ---------------------------------------------------------------------------------------------- reading
    def replay(self) -> Iterator[Entry]:
        """The live tail, oldest first: what a restart replays (archived workloads and audit entries are not in
        it)."""
        for seq, ts, kind, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal ORDER BY seq"
        ):
            yield Entry(seq, ts, kind, wid, json.loads(data))

    def entries_for(self, workload_id: str) -> Iterator[Entry]:
        """Every entry of ``workload_id``, archived or live, oldest first (archived audit entries: ``entries_of_kind``)."""
        live = [Entry(seq, ts, kind, wid, json.loads(data)) for seq, ts, kind, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE workload_id = ? ORDER BY seq", (workload_id,)
        )]
        old = self.archived(workload_id) or []
        yield from heapq.merge(old, live, key=_seq) if old else live

    def entries_of_kind(self, kind: Union[Kind, str], since: Optional[float] = None) -> Iterator[Entry]:
        """Entries of ``kind`` at or after ``since``, archived or live, oldest first."""
        kind, since = Kind(kind).value, since or 0.0
        live = [Entry(seq, ts, k, wid, json.loads(data)) for seq, ts, k, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE kind = ? AND ts >= ? ORDER BY seq",
            (kind, since),
        )]
        if kind in CHUNKED:
            old = [e for e in self._chunked(kind, since) if e.ts >= since]
        else:
            old = sorted((e for e in self.archived_entries(since) if e.kind == kind and e.ts >= since), key=_seq)
        yield from heapq.merge(old, live, key=_seq) if old else live

    def entries_after(self, seq: int, kinds: Optional[Iterable[Union[Kind, str]]] = None) -> Iterator[Entry]:
        """Live entries past ``seq`` (of ``kinds`` only, if given), oldest first: what a reader that keeps up with the
        journal has not seen yet (``raylane.cost.Ledger``; what was archived it reads with ``archived_entries``)."""
        kinds = [Kind(k).value for k in kinds] if kinds is not None else None
        where = f" AND kind IN ({', '.join('?' * len(kinds))})" if kinds else ""
        for s, ts, k, wid, data in self._db.execute(
            "SELECT seq, ts, kind, workload_id, data FROM journal WHERE seq > ?" + where + " ORDER BY seq",
            (seq, *(kinds or ())),
        ):
            yield Entry(s, ts, k, wid, json.loads(data))

    def history(self) -> Iterator[Entry]:
        """Every entry the journal still holds, archived or live, oldest first (``raylane sim --from-journal``)."""
        yield from read_history(self._db)

    def archived(self, workload_id: str) -> Optional[List[Entry]]:
        """The archived entries of ``workload_id``, oldest first; None if it is not archived."""
        row = self._db.execute("SELECT entries FROM archive WHERE workload_id = ?", (workload_id,)).fetchone()
        return None if row is None else _unpack_entries(workload_id, row[0])

    def is_archived(self, workload_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM archive WHERE workload_id = ?", (workload_id,)).fetchone() is not None

    def archived_entries(self, since: Optional[float] = None) -> Iterator[Entry]:
        """The entries of every archived workload that ended at or after ``since`` (all: None), workload by workload
        in the order they ended, each workload's oldest first."""
        for wid, blob in self._db.execute(
                "SELECT workload_id, entries FROM archive WHERE ended_at >= ? ORDER BY last_seq",
                (-1e300 if since is None else since,)).fetchall():
            yield from _unpack_entries(wid, blob)

    def archived_workloads(self) -> Iterator[Tuple[str, List[Entry]]]:
        """(id, entries) of every archived workload, in the order they ended."""
        for wid, blob in self._db.execute("SELECT workload_id, entries FROM archive ORDER BY last_seq").fetchall():
            yield wid, _unpack_entries(wid, blob)

    def _chunked(self, kind: str, since: float) -> List[Entry]:
        out: List[Entry] = []
        for (blob,) in self._db.execute(f"SELECT entries FROM {CHUNKED[kind]} WHERE last_ts >= ? ORDER BY first_seq",
                                        (since,)).fetchall():
            out += [Entry(s, ts, kind, wid, d) for s, ts, wid, d in json.loads(unpack(blob))]
        return out

    def snapshot(self, name: str) -> Optional[Tuple[int, bytes]]:
        """(seq, data) of the snapshot ``name`` the last compaction wrote; None: none."""
        row = self._db.execute("SELECT seq, data FROM snapshot WHERE name = ?", (name,)).fetchone()
        return None if row is None else (row[0], bytes(row[1]))

    def sizes(self) -> Dict[str, int]:
        """What the journal holds: live entries, archived workloads, archived audit entries' chunks, and the bytes
        of its file (with its write-ahead log)."""
        one = lambda q: self._db.execute(q).fetchone()[0]  # noqa: E731
        files = [self.path, self.path + "-wal"]
        return {"live_entries": one("SELECT count(*) FROM journal"), "archived_workloads": one(
            "SELECT count(*) FROM archive"), "audit_chunks": one("SELECT count(*) FROM audit_chunks"),
                "node_chunks": one("SELECT count(*) FROM node_chunks"),
                "bytes": sum(os.path.getsize(f) for f in files if os.path.exists(f))}

    def last_seq(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'journal'").fetchone()
        return row[0] if row else 0

    # ------------------------------------------------------------------------------------------- compaction
    def compact(self, *, workloads: Dict[str, float], snapshots: Dict[str, bytes], archive_before: float,
                audit_before: float, dead_tokens: Sequence[str] = (), archive_nodes: bool = False) -> int:
        """One compaction, in one transaction (nothing of it is kept unless all of it is): move the entries of
        ``workloads`` (id -> when it ended) to the archive; move the audit entries of the tail to the audit archive;
        write ``snapshots`` (name -> data) at the last seq; drop archived workloads that ended before
        ``archive_before`` and audit chunks whose newest entry is older than ``audit_before``, and every entry of
        ``dead_tokens`` (``Gate.dead_tokens``); ``archive_nodes``: move the tail's node entries to the node archive
        too (the caller's ``snapshots`` hold the node book they built). Node chunks expire with ``archive_before``.
        Commits what is pending first. Returns the seq the snapshots were taken at."""
        self.commit()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            seq = self.last_seq()
            self._archive_workloads(workloads)
            self._archive_chunks(Kind.AUDIT.value, seq)
            if archive_nodes:
                self._archive_chunks(Kind.NODE.value, seq)
            self._write_snapshots(seq, snapshots)
            self._expire(archive_before, audit_before)
            self._forget_tokens(dead_tokens)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        self.appended = 0
        return seq

    def _archive_workloads(self, workloads: Dict[str, float]) -> None:
        audit = Kind.AUDIT.value
        for wid, ended_at in workloads.items():
            rows = self._db.execute("SELECT seq, ts, kind, data FROM journal WHERE workload_id = ? AND kind != ?"
                                    " ORDER BY seq", (wid, audit)).fetchall()
            if not rows:
                continue
            self._db.execute("INSERT OR REPLACE INTO archive VALUES (?, ?, ?, ?, ?)",
                             (wid, rows[0][0], rows[-1][0], ended_at, _pack_rows(rows)))
            self._db.execute("DELETE FROM journal WHERE workload_id = ? AND kind != ?", (wid, audit))

    def _archive_chunks(self, kind: str, upto: int) -> None:
        rows = self._db.execute("SELECT seq, ts, workload_id, data FROM journal WHERE kind = ? AND seq <= ?"
                                " ORDER BY seq", (kind, upto)).fetchall()
        for i in range(0, len(rows), AUDIT_CHUNK):
            chunk = rows[i:i + AUDIT_CHUNK]
            text = "[" + ",".join(f"[{s},{ts!r},{json.dumps(w)},{d}]" for s, ts, w, d in chunk) + "]"
            self._db.execute(f"INSERT INTO {CHUNKED[kind]} VALUES (?, ?, ?, ?, ?)",
                             (chunk[0][0], chunk[-1][0], min(r[1] for r in chunk), max(r[1] for r in chunk),
                              pack(text)))
        self._db.execute("DELETE FROM journal WHERE kind = ? AND seq <= ?", (kind, upto))

    def _write_snapshots(self, seq: int, snapshots: Dict[str, bytes]) -> None:
        for name, data in snapshots.items():
            self._db.execute("INSERT OR REPLACE INTO snapshot VALUES (?, ?, ?)", (name, seq, data))

    def _expire(self, archive_before: float, audit_before: float) -> None:
        self._db.execute("DELETE FROM archive WHERE ended_at < ?", (archive_before,))
        self._db.execute("DELETE FROM audit_chunks WHERE last_ts < ?", (audit_before,))
        self._db.execute("DELETE FROM node_chunks WHERE last_ts < ?", (archive_before,))

    def _forget_tokens(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        dead = set(ids)
        rows = self._db.execute("SELECT seq, data FROM journal WHERE kind = ?", (Kind.TOKEN.value,)).fetchall()
        gone = [(seq,) for seq, data in rows if json.loads(data).get("id") in dead]
        self._db.executemany("DELETE FROM journal WHERE seq = ?", gone)

    def close(self) -> None:
        """Commit what is pending and close (again: nothing)."""
        try:
            self.commit()
        except sqlite3.ProgrammingError:  # closed already
            return
        self._db.close()


def _seq(e: Entry) -> int:
    return e.seq


def read_history(db: sqlite3.Connection) -> Iterator[Entry]:
    """Every entry of the journal open as ``db`` (read-only will do), archived or live, oldest first. A journal from
    before compaction has no archive tables: its live tail is all of it."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    live = [Entry(s, ts, k, wid, json.loads(d)) for s, ts, k, wid, d in
            db.execute("SELECT seq, ts, kind, workload_id, data FROM journal ORDER BY seq")]
    old: List[Entry] = []
    if "archive" in tables:
        for wid, blob in db.execute("SELECT workload_id, entries FROM archive"):
            old += _unpack_entries(wid, blob)
    for kind, table in CHUNKED.items():
        if table in tables:
            for (blob,) in db.execute(f"SELECT entries FROM {table}"):
                old += [Entry(s, ts, kind, wid, d) for s, ts, wid, d in json.loads(unpack(blob))]
    old.sort(key=_seq)
    yield from heapq.merge(old, live, key=_seq)
