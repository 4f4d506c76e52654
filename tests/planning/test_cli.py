"""``raylane plan`` on the worked example through the CLI, each solver."""
import json

import pytest
import typer
from typer.testing import CliRunner

from raylane.cli_plan import register

EX = "examples/pipelines/"
app = typer.Typer()
register(app)
app.command("noop", hidden=True)(lambda: None)  # two commands so typer keeps "plan" as a subcommand


@pytest.mark.parametrize("solver,makespan", [("heft", None), ("olb", None), ("cpsat", 9.25)])
def test_plan_each_solver(tmp_path, solver, makespan):
    out = tmp_path / "plan.yaml"
    r = CliRunner().invoke(app, ["plan", EX + "worked-example.yaml", "--cluster", EX + "cluster-3node.yaml",
                                 "--solver", solver, "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["stages"]) == {"T1", "T2", "T3", "T4"}
    if makespan:
        assert data["makespan_h"] == pytest.approx(makespan)
        assert data["data_moved_gb"] == pytest.approx(5)  # T2's 5 GB from gpu-1 to T4 on ssd-1
    assert out.exists()


def test_plan_table_and_bad_solver():
    r = CliRunner().invoke(app, ["plan", EX + "worked-example.yaml", "--cluster", EX + "cluster-3node.yaml"])
    assert r.exit_code == 0 and "makespan" in r.output and "T4" in r.output
    r = CliRunner().invoke(app, ["plan", EX + "worked-example.yaml", "--cluster", EX + "cluster-3node.yaml",
                                 "--solver", "magic"])
    assert r.exit_code == 2


def test_describe():
    r = CliRunner().invoke(app, ["plan", EX + "worked-example.yaml", "--cluster", EX + "cluster-3node.yaml",
                                 "--describe"])
    assert r.exit_code == 0, r.output
    for needle in ("T4: needs [T2, T3]", "features [ssd]", "gpu-1 <-> ssd-1: 20 GB/h", "output 20", "kind: plan"):
        assert needle in r.output
