"""What the control plane remembers of a resize (issue 15) and of a workload's MLflow run, and what a serving
replica counts it reclaimed.

Pure: journal entries applied to a ``Record`` as recovery replays them (the live path applies the same entries), and
the serving driver's count of GPUs given, from an ``explain`` view. No Ray.
"""
from __future__ import annotations

from raylane.control.journal import Entry
from raylane.control.records import Record, State
from raylane.launchers.serve import _gpus_given

SPEC = {"team": "team-a", "class": "pretrain", "gang": {"workers": {"min": 2, "max": 4}, "resources": {"gpu": 1}}}


def replay(*entries) -> Record:
    rec = Record("w", SPEC, 0.0)
    for i, (kind, data) in enumerate(entries):
        rec.apply(Entry(i + 1, float(i + 1), kind, "w", data))
    return rec


ADMIT = ("admitted", {"placement": ["a", "b"], "devices": [[0], [1]], "pg_name": "raylane-w"})
RUNNING = ("running", {"job_id": "j"})


def resizing(frm, to, placement, devices, reason="r"):
    return ("resizing", {"from_workers": frm, "to_workers": to, "placement": placement, "devices": devices,
                         "reason": reason, "deadline": 30.0, "attained_gpu_s": 7.0, "note": f"resizing: {reason}"})


def test_growth_holds_the_new_placement_while_the_gang_stops():
    rec = replay(ADMIT, RUNNING, resizing(2, 4, ["a", "b", "a", "b"], [[0], [1], [2], [3]], "grows"))
    assert rec.state is State.RESIZING and rec.state.holds_lease and rec.state.stopping
    # Booked at once: the record (and the books rebuilt from it on a restart) hold the grown gang.
    assert rec.placement == ("a", "b", "a", "b") and rec.workers == 4
    assert rec.stop_deadline == 30.0 and rec.attained_gpu_s == 7.0
    assert rec.resize["to_workers"] == 4 and rec.preemptions == 0


def test_a_shrink_keeps_the_whole_gang_until_it_has_stopped_then_runs_at_its_new_size():
    rec = replay(("admitted", {"placement": list("abab"), "devices": [[0], [1], [2], [3]], "pg_name": "raylane-w"}),
                 RUNNING, resizing(4, 2, ["a", "b"], [[0], [1]], "shrinks"))
    assert rec.state is State.RESIZING and rec.workers == 4
    rec.apply(Entry(9, 9.0, "resized", "w", {"from_workers": 4, "to_workers": 2, "placement": ["a", "b"],
                                             "devices": [[0], [1]], "pg_name": "raylane-w", "attained_gpu_s": 9.0,
                                             "step": 120, "note": "resized"}))
    assert rec.state is State.ADMITTED and rec.workers == 2 and rec.devices == ((0,), (1,))
    assert rec.resize == {} and rec.resizes == 1 and rec.step == 120 and rec.stop_deadline is None
    assert rec.attained_gpu_s == 9.0 and rec.admitted_at == 9.0
    assert rec.public()["workers"] == 2 and rec.public()["state"] == "ADMITTED"


def test_a_preemption_during_a_resize_stops_the_gang_for_good():
    rec = replay(ADMIT, RUNNING, resizing(2, 4, list("abab"), [[0], [1], [2], [3]]),
                 ("preempting", {"deadline": 40.0, "reason": "x"}),
                 ("requeued", {"attained_gpu_s": 8.0}))
    assert rec.state is State.PENDING and rec.resize == {} and rec.placement == ()
    assert rec.preemptions == 1 and rec.resizes == 0


def test_serving_counts_the_gpus_a_shrink_gave_and_a_stopped_gangs_whole_size():
    view = {"team": "team-a", "spec": {"gang": {"workers": {"min": 2, "max": 4}, "resources": {"gpu": 2}}},
            "journal": [
                {"kind": "admitted", "placement": list("abcd")},
                {"kind": "resizing", "from_workers": 4, "to_workers": 3,
                 "reason": "shrinks from 4 to 3 workers (minimum 2) to free capacity for rep-1 (team-a/serving, ..."},
                {"kind": "resized", "placement": list("abc")},
                {"kind": "resizing", "from_workers": 3, "to_workers": 2,
                 "reason": "shrinks from 3 to 2 workers (minimum 2) to free capacity for rep-10 (team-a/serving, ..."},
                {"kind": "resized", "placement": list("ab")},
                {"kind": "preempting", "note": "preempted: rep-1 (team-a/serving) needs ..."},
            ]}
    # rep-1: one worker of 2 GPUs by the first shrink, then the whole 2-worker gang; rep-10 is not rep-1.
    assert _gpus_given(view, "rep-1") == 2 + 4
    assert _gpus_given(view, "rep-10") == 2
    assert _gpus_given(view, "rep-2") == 0
    assert _gpus_given({"team": "team-b", "redacted": True}, "rep-1") == 0  # another team's journal: not shown


def test_the_mlflow_run_a_driver_names_is_kept_and_replayed_and_an_error_is_cleared_by_a_later_name():
    # The gang may start before its driver's run exists; its workers read these two fields (raylane.train).
    rec = replay(ADMIT, RUNNING)
    assert rec.mlflow_run_id is None and rec.mlflow_run_error is None
    rec = replay(ADMIT, RUNNING, ("event", {"note": "MLflow run not started", "mlflow_run_error": "RetryableError: x"}))
    assert rec.mlflow_run_id is None and rec.mlflow_run_error == "RetryableError: x"
    rec = replay(ADMIT, RUNNING, ("event", {"mlflow_run_error": "RetryableError: x"}),
                 ("event", {"note": "MLflow run abc", "mlflow_run_id": "abc"}))
    assert rec.mlflow_run_id == "abc" and rec.mlflow_run_error is None
    assert rec.public()["mlflow_run_id"] == "abc"
    # A restart (pipelines' stages, resumed drivers) may name it with the running report.
    assert replay(ADMIT, ("running", {"job_id": "j", "mlflow_run_id": "r2"})).mlflow_run_id == "r2"
