"""``raylane plan`` and ``raylane plan check`` through the real ``raylane`` app: each solver, explanations, charts,
the example plan files (three bad, one good) and bad input."""
import json

import pytest
from typer.testing import CliRunner

from raylane.cli import app

EX = "examples/pipelines/"
PIPE, CLUSTER = EX + "worked-example.yaml", EX + "cluster-3node.yaml"


def run(*args):
    r = CliRunner().invoke(app, list(args))
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r


@pytest.mark.parametrize("solver,makespan", [("heft", None), ("olb", None), ("cpsat", 9.25)])
def test_plan_each_solver(tmp_path, solver, makespan):
    out = tmp_path / "plan.yaml"
    r = run("plan", PIPE, "--cluster", CLUSTER, "--solver", solver, "--json", "--out", str(out))
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["stages"]) == {"T1", "T2", "T3", "T4"}
    if makespan:
        assert data["makespan_h"] == pytest.approx(makespan)
        assert data["data_moved_gb"] == pytest.approx(5)  # T2's 5 GB from gpu-1 to T4 on ssd-1
        assert data["critical_path"][-1]["stage"] == "T4" and data["critical_path"][-1]["finish_h"] == 9.25
        assert data["explanations"]["T3"]["features"] == ["ssd"]
    assert out.exists()
    # The plan it wrote passes ``plan check``.
    r = run("plan", "check", PIPE, str(out), "--cluster", CLUSTER)
    assert r.exit_code == 0 and "plan is valid" in r.output, r.output


def test_plan_table_critical_path_reasons_and_bad_solver():
    r = run("plan", PIPE, "--cluster", CLUSTER, "--solver", "cpsat")
    assert r.exit_code == 0 and "makespan: 9.25 h (cpsat, optimal, bound 9.25 h)" in r.output
    assert "critical path (9.25 h):" in r.output
    assert "T4 on ssd-1 5.25-9.25 h: after T2 [transfer] T2's 5 GB from gpu-1 take 0.25 h" in r.output
    assert "not cpu-1: lacks feature(s) ssd (has: none)" in r.output
    assert "on gpu-1 it would finish at 10 h (+0.75 h): T3's 20 GB would take 1 h to move" in r.output
    r = run("plan", PIPE, "--cluster", CLUSTER, "--solver", "magic")
    assert r.exit_code == 2 and "--solver: got 'magic'; allowed: best, heft, olb, cpsat" in r.output


def test_plan_help_lists_check_and_gantt_is_written(tmp_path):
    r = run("plan", "--help")
    assert r.exit_code == 0 and "check" in r.output
    png = tmp_path / "g.png"
    r = run("plan", PIPE, "--cluster", CLUSTER, "--gantt", str(png))
    assert r.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_describe():
    r = run("plan", PIPE, "--cluster", CLUSTER, "--describe")
    assert r.exit_code == 0, r.output
    for needle in ("T4: needs [T2, T3]", "features [ssd]", "gpu-1 <-> ssd-1: 20 GB/h", "output 20", "kind: plan",
                   "storage 6 GB/s = 21600 GB/h", "lowest of the link's bandwidth and the storage rates"):
        assert needle in r.output


@pytest.mark.parametrize("name,needles", [
    ("t4-before-t3-output", ["[dependency] T4 starts at 5.5 h on cpu-1, before T3's output arrives at 7 h",
                             "20 GB from ssd-1 take 2 h): 1.5 h early", "data moved 25 GB", "+2.7%"]),
    ("t3-without-ssd", ["[features] T3 needs ssd; cpu-1 has no features", "makespan 9.5 h"]),
    ("wrong-makespan", ["[makespan] claimed makespan 8 h, computed 9.25 h (off by -1.25 h)"]),
])
def test_check_flags_each_bad_example_plan_with_its_numbers(name, needles):
    r = run("plan", "check", PIPE, f"{EX}plans/{name}.yaml", "--cluster", CLUSTER)
    assert r.exit_code == 1, r.output
    for needle in needles + ["best known 9.25 h: CP-SAT's plan, proven optimal"]:
        assert needle in r.output, (needle, r.output)


def test_check_valid_plan_gives_exit_0_and_the_gap():
    r = run("plan", "check", PIPE, EX + "plans/optimal.yaml", "--cluster", CLUSTER, "--time-limit", "5")
    assert r.exit_code == 0, r.output
    assert "plan is valid" in r.output and "gap to best known 9.25 h: +0.0%" in r.output
    assert "T4 on ssd-1 5.25-9.25 h: after T2 [transfer]" in r.output
    r = run("plan", "check", PIPE, EX + "plans/t4-before-t3-output.yaml", "--cluster", CLUSTER, "--json")
    data = json.loads(r.output)
    assert r.exit_code == 1 and not data["valid"] and data["gap"] == pytest.approx(0.25 / 9.25)
    [v] = data["violations"]
    assert (v["kind"], v["stage"], v["node"], v["amount"]) == ("dependency", "T4", "cpu-1", 1.5)
    assert data["best_known"] == {"makespan_h": 9.25, "status": "OPTIMAL", "bound_h": 9.25, "note": ""}


def test_check_bad_input_is_a_named_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: plan\nmakespan: 9\nstages:\n  T1: {node: gpu-1, start: 0, finish: 3, colour: red}\n")
    r = run("plan", "check", PIPE, str(bad), "--cluster", CLUSTER)
    assert r.exit_code == 2 and "stages.T1.colour: got 'red'; unknown field; allowed: node, start, finish" in r.output
    r = run("plan", "check", PIPE, str(tmp_path / "missing.yaml"), "--cluster", CLUSTER)
    assert r.exit_code == 2 and "missing.yaml: cannot read" in r.output
    r = run("plan", "check", PIPE, EX + "plans/optimal.yaml", "--cluster", CLUSTER, "--time-limit", "0")
    assert r.exit_code == 2 and "time_limit_s: got 0.0; a number of seconds > 0" in r.output


def test_a_runnable_pipeline_spec_plans_offline_too():
    """examples/pipelines/lm-lifecycle.yaml (stages with workloads) on the embedded cluster: each stage's demand is
    its gang, its duration the estimate; features put prep on the ssd node and pretrain on the nvlink node."""
    r = CliRunner().invoke(app, ["plan", EX + "lm-lifecycle.yaml", "--cluster", EX + "cluster-local.yaml",
                                 "--solver", "cpsat", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert {s: v["node"] for s, v in data["stages"].items()}["prep"] == "gpu-b"
    assert data["stages"]["pretrain"]["node"] == "gpu-a"
    # 30 s + 2 min + 1 min + 30 s, one after the other.
    assert data["makespan_h"] * 60 == pytest.approx(4.0, abs=0.05)


def test_offline_a_stage_stating_no_duration_is_refused_naming_it(tmp_path):
    """``raylane plan`` has no run history: a stage with neither duration nor workload.runtime_estimate exits 2,
    naming the stage and what to declare (the control plane would predict it; a constant never stands in)."""
    import yaml

    data = yaml.safe_load(open(EX + "lm-lifecycle.yaml").read())
    del data["stages"]["eval"]["duration"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data))
    r = run("plan", str(path), "--cluster", EX + "cluster-local.yaml")
    assert r.exit_code == 2, r.output
    assert "stages.eval.duration: got None; declare duration" in r.output, r.output
