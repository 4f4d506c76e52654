"""Restart time and journal size against history length, before and after compaction (``raylane.control.archive``).

For each history length N (default 10k and 100k; ``--full`` adds 1M): a journal with N ended workloads and 1,000
live ones (500 running, 500 pending) on the Ray-free state machine (``tests/controltest.Harness``). The history is
one real workload's rows, made by the harness (submit, admit, run, finish, their audit entries), written N times in
bulk with new ids and times. Printed: the journal's bytes per workload of history and the restart time (the journal
replayed into a new ``ControlState``) as written (before), then after one compaction (VACUUM'd, so that the file's
size is what it holds), and the ratio. ``--before-max N``: skip the uncompacted restart above N workloads (it replays
every row: minutes at 1M). Figures only; nothing is asserted.

    .venv/bin/python -m tests.bench.bench_restart [--full] [--sizes 10000,100000] [--before-max 100000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time
from typing import List

from tests.controltest import Harness
from tests.raytest import local_policy, spec

LIVE = 1000


def _policy():
    data = local_policy()
    data["journal"] = {"compact_every": 10**9, "archive_after": "1h", "compact_batch": 10**7}
    return data


def _template(tmp: str):
    """The rows of one workload's life (submit to finish), as the harness journals them."""
    h = Harness(os.path.join(tmp, "template.db"), _policy())
    wid = h.call("submit", spec=spec("lm", "team-a", "pretrain"))["id"]
    h.tick()
    h.call("report", workload_id=wid, kind="running", job_id="raysubmit_template")
    h.clock.advance(600)
    h.call("release", workload_id=wid, outcome="finished", state="SUCCEEDED", step=100)
    rows = [(ts, kind, data) for _, ts, kind, w, data in
            h.cs.journal._db.execute("SELECT seq, ts, kind, workload_id, data FROM journal WHERE workload_id = ?"
                                     " ORDER BY seq", (wid,))]
    h.close()
    return wid, rows


def build(path: str, history: int, template) -> float:
    """A journal at ``path``: the harness's nodes, ``history`` ended workloads written in bulk, then ``LIVE`` live
    ones submitted through the harness. Returns the fake clock's time at the end."""
    wid0, rows = template
    h = Harness(path, _policy())
    h.close()
    db = sqlite3.connect(path)
    t0 = 1_600_000_000.0
    names = [f"lm-{i % 50}" for i in range(50)]
    batch = []
    for i in range(history):
        wid = f"{names[i % 50]}-{i:012x}"
        dt = t0 + i * 30.0 - rows[0][0]
        run_s = 300.0 + (i * 7919 % 3600)  # runtimes that vary, for the model to learn
        for j, (ts, kind, data) in enumerate(rows):
            at = ts + dt + (run_s if kind in ("finished",) or (kind == "audit" and j == len(rows) - 1) else 0.0)
            batch.append((at, kind, wid, data.replace(wid0, wid).replace('"lm"', json.dumps(names[i % 50]))))
        if len(batch) >= 200_000:
            db.executemany("INSERT INTO journal (ts, kind, workload_id, data) VALUES (?, ?, ?, ?)", batch)
            batch = []
    db.executemany("INSERT INTO journal (ts, kind, workload_id, data) VALUES (?, ?, ?, ?)", batch)
    db.commit()
    db.close()
    h = Harness(path, _policy())
    h.clock.t = t0 + history * 30.0 + 3600 * 24
    for i in range(LIVE):
        h.call("submit", spec=spec(f"live-{i % 20}", "team-a" if i % 2 else "team-b", "pretrain", gpu=1))
    h.tick()
    now = h.clock.t
    h.close()
    return now


def restart(path: str, now: float):
    """Seconds to open the journal and rebuild the control plane from it, and the harness (open)."""
    t = time.perf_counter()
    h = Harness(path, _policy())
    h.clock.t = now
    return time.perf_counter() - t, h


def size(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def vacuum(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.execute("VACUUM")
    db.close()


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(prog="bench_restart")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--full", action="store_true", help="add 1,000,000 workloads of history (minutes to build)")
    ap.add_argument("--before-max", type=int, default=100_000,
                    help="skip the restart on the uncompacted journal above this many workloads of history")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.full:
        sizes.append(1_000_000)
    tmp = tempfile.mkdtemp(prefix="bench-restart-")
    try:
        template = _template(tmp)
        print(f"{'history':>9} {'live':>5} | {'before: s':>9} {'B/workload':>10} | {'compact s':>9} | "
              f"{'after: s':>8} {'B/workload':>10} {'live rows':>9} | {'restart x':>9} {'size x':>6}")
        for n in sizes:
            path = os.path.join(tmp, f"journal-{n}.db")
            now = build(path, n, template)
            vacuum(path)
            before_b = size(path)
            before_s = None
            if n <= args.before_max:
                before_s, h = restart(path, now)
                h.close()
            h = restart(path, now)[1]
            t = time.perf_counter()
            moved = h.cs.compactor.run(limit=None)
            compact_s = time.perf_counter() - t
            h.close()
            vacuum(path)
            after_b = size(path)
            after_s, h = restart(path, now)
            live_rows = h.cs.journal.sizes()["live_entries"]
            assert moved == n and len(dict.keys(h.cs.records)) == LIVE, (moved, len(h.cs.records))
            h.close()
            bs = f"{before_s:9.2f}" if before_s is not None else f"{'skipped':>9}"
            ratio = f"{before_s / after_s:8.1f}x" if before_s is not None else f"{'-':>9}"
            print(f"{n:>9,} {LIVE:>5} | {bs} {before_b / n:10.0f} | {compact_s:9.2f} | {after_s:8.2f} "
                  f"{after_b / n:10.0f} {live_rows:>9,} | {ratio} {before_b / after_b:5.1f}x", flush=True)
            os.remove(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
