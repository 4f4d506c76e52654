"""Checkpoint references between workloads (raylane.control.checkpoints), pure: parsing, what can resolve now,
later or never, and the pinned copy that outlives the source's retention. No Ray."""
from __future__ import annotations

import os

import pytest

from raylane.control.checkpoints import (CheckpointRef, drop_copy, find_source, judge, parse_ref, pin_copy,
                                         pin_dir, step_of)
from raylane.control.records import Record
from raylane.errors import ValidationError


@pytest.mark.parametrize("value, expected", [
    ("/some/checkpoint", None),
    (None, None),
    ({"workload": "pretrain-x"}, CheckpointRef("pretrain-x", None)),
    ({"workload": "pretrain-x", "step": "latest"}, CheckpointRef("pretrain-x", None)),
    ({"workload": "pretrain-x-1a2b3c", "step": 30}, CheckpointRef("pretrain-x-1a2b3c", 30)),
])
def test_parse_ref(value, expected):
    assert parse_ref(value) == expected


def test_parse_ref_names_every_bad_field():
    with pytest.raises(ValidationError) as info:
        parse_ref({"workload": "", "step": 0, "steps": 3})
    assert sorted(p for p, _, _ in info.value.errors) == ["config.init_from.step", "config.init_from.steps",
                                                           "config.init_from.workload"]
    assert "'latest' or a step number >= 1" in str(info.value)


@pytest.mark.parametrize("path, metrics, step", [
    ("/r/a/checkpoint_00000030", None, 30),
    ("/r/a/checkpoint_7/", None, 7),
    ("/r/a/checkpoint_2026-11-23_13-00-00.123", {"step": 12}, 12),
    ("/r/a/checkpoint_2026-11-23_13-00-00.123", {}, None),
])
def test_step_of(path, metrics, step):
    assert step_of(path, metrics) == step


def _written(*steps):
    return {s: f"/runs/src/checkpoint_{s:08d}" for s in steps}


ON_DISK = {f"/runs/src/checkpoint_{s:08d}" for s in (40, 50, 60)} | {"/runs/src/_pinned/checkpoint_00000020"}
CASES = {
    # name: (ref step, source ended, written, pinned) -> (ready, never, step, substring of reason or path)
    "latest, newest on disk": (None, False, _written(10, 20, 30, 40, 50, 60), None, (True, False, 60, "00000060")),
    "latest, nothing yet": (None, False, {}, None, (False, False, None, "first checkpoint")),
    "latest, source ended empty": (None, True, {}, None, (False, True, None, "without writing a checkpoint")),
    "step on disk": (50, False, _written(40, 50, 60), None, (True, False, 50, "00000050")),
    "step rotated out, pinned copy": (20, False, _written(20, 40, 50, 60), "/runs/src/_pinned/checkpoint_00000020",
                                      (True, False, 20, "_pinned")),
    "step rotated out, no pin": (20, False, _written(20, 40, 50, 60), None, (False, True, None, "deleted by its "
                                                                                                  "retention")),
    "step still to come": (90, False, _written(40, 50, 60), None, (False, False, 90, "step 90 (last checkpoint at "
                                                                                     "step 60)")),
    "step past, never written": (55, False, _written(50, 60), None, (False, True, None, "past step 55")),
    "step beyond the last": (700, False, _written(60), None, (False, True, None, "to step 600 only")),
    "step off the cadence": (95, False, _written(60), None, (False, True, None, "every 10 steps")),
    "the last step is on the cadence": (600, False, _written(60), None, (False, False, 600, "waiting")),
    "source ended before the step": (90, True, _written(60), None, (False, True, None, "ended without a checkpoint "
                                                                                      "at step 90")),
}


@pytest.mark.parametrize("name", CASES)
def test_judge(name):
    step, ended, written, pinned, (ready, never, got_step, text) = CASES[name]
    v = judge(CheckpointRef("src", step), source_id="src", source_ended=ended, max_step=600, cadence=10,
              written=written, pinned=pinned, exists=ON_DISK.__contains__)
    assert (v.ready, v.never, v.step if (ready or not never) else None) == (ready, never, got_step), v
    assert text in (v.path if v.ready else v.reason), v


def test_pinned_copy_survives_the_source_deleting_its_checkpoint(tmp_path):
    src = tmp_path / "runs" / "src" / "checkpoint_00000020"
    src.mkdir(parents=True)
    (src / "state.pt").write_bytes(b"weights" * 100)
    (src / "meta.json").write_text('{"step": 20}')
    dst = pin_copy(str(src), pin_dir(str(src), 20))
    assert dst == str(tmp_path / "runs" / "src" / "_pinned" / "checkpoint_00000020")
    assert os.stat(src / "state.pt").st_ino == os.stat(os.path.join(dst, "state.pt")).st_ino  # a hard link
    import shutil

    shutil.rmtree(src)  # the source's retention
    assert open(os.path.join(dst, "state.pt"), "rb").read() == b"weights" * 100
    assert pin_copy(str(src), dst) == dst  # a second pin of the same step reuses the copy
    assert not [p for p in os.listdir(os.path.dirname(dst)) if ".partial" in p]
    drop_copy(dst)
    assert not os.path.exists(dst)


def test_find_source_by_id_or_newest_of_a_name():
    old = Record("pre-aaaaaa", {"name": "pre"}, 1.0)
    new = Record("pre-bbbbbb", {"name": "pre"}, 2.0)
    other = Record("ft-cccccc", {"name": "ft"}, 3.0)
    recs = [old, new, other]
    assert find_source(CheckpointRef("pre"), recs) is new
    assert find_source(CheckpointRef("pre-aaaaaa"), recs) is old
    assert find_source(CheckpointRef("nope"), recs) is None


def test_explain_folds_each_run_of_checkpoints_into_one_line():
    from raylane.render import journal_lines

    journal = [{"ts": 1, "kind": "running", "note": "gang starting"},
               {"ts": 2, "kind": "checkpointed", "step": 10}, {"ts": 3, "kind": "checkpointed", "step": 20},
               {"ts": 4, "kind": "event"},  # a progress update, shown as "now" instead
               {"ts": 5, "kind": "preempting", "note": "preempted"}, {"ts": 6, "kind": "checkpointed", "step": 25}]
    assert [(e["ts"], e["kind"], e["note"]) for e in journal_lines(journal)] == [
        (1, "running", "gang starting"), (2, "checkpointed", "2 checkpoint(s), steps 10..20"),
        (5, "preempting", "preempted"), (6, "checkpointed", "1 checkpoint(s), step 25")]
