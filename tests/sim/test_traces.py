"""Trace loaders: the three formats, windows, teams, and errors that name the row, the column and the value."""
from __future__ import annotations

from pathlib import Path

import pytest

from raylane.errors import NotFoundError, ValidationError
from raylane.sim.traces import DEFAULT_TEAM, detect_format, load_trace

from tests.sim.builders import TRACES

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,vc-a
2017-10-09 06:13:03,2951.0,8,23608.0,vc-b
2017-10-10 00:00:00,10.0,2,20.0,vc-a
"""


def test_philly_rows_are_sorted_by_time_and_teams_are_virtual_clusters(tmp_path):
    tr = load_trace(write(tmp_path, PHILLY))
    assert tr.format == "philly"
    assert [j.duration for j in tr.jobs] == [2951.0, 66.0, 10.0]
    assert [j.submit for j in tr.jobs][:2] == [0.0, 2932.0]
    assert [j.team for j in tr.jobs] == ["vc-b", "vc-a", "vc-a"]
    assert tr.origin is not None


def test_philly_window_counts_from_its_start(tmp_path):
    tr = load_trace(write(tmp_path, PHILLY), start="2017-10-09 07:00:00", end="2017-10-10")
    assert [j.duration for j in tr.jobs] == [66.0]
    assert tr.jobs[0].submit == 115.0 and tr.skipped == 2


def test_tiresias_sample_trace():
    tr = load_trace(TRACES / "tiresias_60_job.csv")
    assert tr.format == "tiresias" and len(tr.jobs) == 60
    assert {j.team for j in tr.jobs} == {DEFAULT_TEAM}
    assert tr.jobs[1].gpus == 8 and tr.jobs[1].submit == 30.0


def test_generic_example_file():
    tr = load_trace(REPO / "examples" / "traces" / "generic.csv")
    assert tr.format == "generic" and len(tr.jobs) >= 5
    assert any(j.workers for j in tr.jobs) and any(j.features for j in tr.jobs) and any(j.cls for j in tr.jobs)


def test_generic_optional_columns(tmp_path):
    tr = load_trace(write(tmp_path, "id,submit_time,duration,gpus,team,class,workers,features,estimate\n"
                                    "x,5,100,16,nlp,pretrain,2,a100;nvlink,120\n"))
    j = tr.jobs[0]
    assert (j.id, j.submit, j.gpus, j.team, j.cls, j.workers, j.estimate) == ("x", 5.0, 16, "nlp", "pretrain", 2,
                                                                               120.0)
    assert j.features == frozenset({"a100", "nvlink"})


def test_team_column_none_puts_every_job_in_one_team(tmp_path):
    tr = load_trace(write(tmp_path, PHILLY), team_column="none")
    assert {j.team for j in tr.jobs} == {DEFAULT_TEAM}


@pytest.mark.parametrize("text,path,value,allowed", [
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,abc,1,1,a\n",
     "row 2, column duration", "abc", "a number > 0"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\nyesterday,5,1,5,a\n",
     "row 2, column timestamp", "yesterday", "date-time"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,5,1.5,5,a\n",
     "row 2, column num_gpus", "1.5", "an integer >= 1"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,5,1\n",
     "row 2, column (all)", "2017-10-09 07:01:55,5,1", "5 fields"),
    ("submit_time,duration,gpus,workers\n0,10,6,4\n", "row 2, column workers", "4",
     "a fraction below 1 (a share of one GPU) or a whole number of GPUs per worker (gpus 6 / workers 4 = 1.5)"),
    ("submit_time,duration,gpus\n0,10,1.5\n", "row 2, column gpus", "1.5", "a whole number of GPUs, or below 1"),
    ("submit_time,duration,gpus\n0,10,0\n", "row 2, column gpus", "0", "above 0, unless the job asks for cpus"),
    ("submit_time,duration,gpus,colour\n0,10,1,red\n", "(header)", "colour", "a generic-format column"),
    ("id,submit_time,duration,gpus\na,0,10,1\na,1,10,1\n", "row 3, column id", "a", "unique job id (row 2"),
    ("job_id,num_gpu,submit_time,duration\n0,-2,0,10\n", "row 2, column num_gpu", "-2", "an integer >= 1"),
    ("foo,bar\n1,2\n", "(header)", "foo,bar", "philly ("),
])
def test_errors_name_row_column_and_value(tmp_path, text, path, value, allowed):
    with pytest.raises(ValidationError) as e:
        load_trace(write(tmp_path, text))
    assert any(p == path and v == value and allowed in a for p, v, a in e.value.errors), e.value.errors


def test_every_bad_row_is_reported_at_once(tmp_path):
    rows = "".join(f"2017-10-09 07:01:55,x{i},1,1,a\n" for i in range(40))
    with pytest.raises(ValidationError) as e:
        load_trace(write(tmp_path, "timestamp,duration,num_gpus,gpu_time,cluster\n" + rows))
    errs = e.value.errors
    assert errs[0][0] == "row 2, column duration" and errs[-1][0] == "(more rows)" and errs[-1][1] == 15


def test_bad_window_and_missing_file(tmp_path):
    with pytest.raises(ValidationError) as e:
        load_trace(write(tmp_path, PHILLY), start="October")
    assert e.value.errors[0][:2] == ("start", "October")
    with pytest.raises(NotFoundError):
        load_trace(tmp_path / "nope.csv")


def test_detect_format():
    assert detect_format(["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]) == "philly"
    assert detect_format(["job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration",
                          "interval"]) == "tiresias"
    assert detect_format(["submit_time", "duration", "gpus"]) == "generic"
    assert detect_format(["a"]) is None


def test_gzip_trace_reads_like_the_plain_csv(tmp_path):
    import gzip

    plain = write(tmp_path, PHILLY)
    packed = tmp_path / "philly.csv.gz"
    packed.write_bytes(gzip.compress(PHILLY.encode()))
    a, b = load_trace(plain), load_trace(packed)
    assert a.format == b.format == "philly"
    assert [(j.submit, j.duration, j.gpus, j.team) for j in a.jobs] == [(j.submit, j.duration, j.gpus, j.team)
                                                                        for j in b.jobs]


def test_generic_fractional_gpus(tmp_path):
    """A share of one GPU per worker: alone (0.5) or a total split over workers (2 over 4: 0.5 each)."""
    tr = load_trace(write(tmp_path, "id,submit_time,duration,gpus,workers\na,0,10,0.5,\nb,1,10,2,4\nc,2,10,0.25,1\n"
                                    "d,3,10,8,\n"))
    got = {j.id: (j.gpus, j.workers) for j in tr.jobs}
    assert got == {"a": (0.5, None), "b": (2, 4), "c": (0.25, 1), "d": (8, None)}
    assert isinstance(got["d"][0], int), "integer traces keep integer GPU counts"
