"""``raylane down`` stops the processes of the local cluster ``raylane up`` started, and no other Ray session's
(``ray stop`` would stop every one on the machine). Plain processes stand in for the cluster's; no Ray."""
from __future__ import annotations

import json
import os
import subprocess

from raylane import localcluster


def test_down_stops_only_its_own_clusters_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(localcluster, "STATE_FILE", tmp_path / "local.json")
    ours = subprocess.Popen(["sleep", "300"], env={**os.environ, localcluster.MARKER: "ours"})
    # One that ignores SIGTERM, as a stuck worker would: killed once the grace period is over.
    stuck = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 300 & wait"],
                             env={**os.environ, localcluster.MARKER: "ours"})
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, localcluster.MARKER: "another-cluster"})
    try:
        (tmp_path / "local.json").write_text(json.dumps({"address": "127.0.0.1:6390", "marker": "ours"}))
        assert {p for p, _ in localcluster.marked_processes(localcluster.MARKER, "ours")} >= {ours.pid, stuck.pid}
        localcluster.down(grace_s=1.0)
        assert ours.wait(timeout=5) != 0 and stuck.wait(timeout=5) != 0
        assert other.poll() is None
        assert localcluster.marked_processes(localcluster.MARKER, "ours") == []
        assert not (tmp_path / "local.json").exists()
    finally:
        for p in (ours, stuck, other):
            p.kill()
            p.wait()


def test_down_without_a_cluster_touches_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(localcluster, "STATE_FILE", tmp_path / "local.json")
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, localcluster.MARKER: "another-cluster"})
    try:
        localcluster.down(grace_s=0.5)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
