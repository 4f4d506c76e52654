"""``raylane sim`` end to end on the small traces: table, JSON, files, and flag errors. Pure: no Ray."""
from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from raylane.cli.sim import app

from tests.sim.builders import PHILLY, TIRESIAS

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_compare_writes_json_table_and_plots(tmp_path):
    res = runner.invoke(app, [TIRESIAS, "--nodes", "4", "--gpus-per-node", "4", "--preset", "fifo",
                              "--preset", "las", "--preset", "srtf-oracle", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "summary.json").read_text())
    assert set(report["runs"]) == {"fifo", "las", "srtf-oracle"} and report["partial"] is False
    fifo = report["runs"]["fifo"]
    assert fifo["jobs"]["finished"] == 60 and fifo["jct"]["mean"] > 0
    assert report["ratios"]["fifo"]["jct.mean/fifo"] == 1.0
    assert report["ratios"]["srtf-oracle"]["jct.mean/srtf-oracle"] == 1.0
    for name in ("jct_cdf.png", "timeline.png", "table.txt"):
        assert (tmp_path / name).stat().st_size > 0
    assert "JCT avg" in (tmp_path / "table.txt").read_text()


def test_flags_override_the_preset():
    res = runner.invoke(app, [TIRESIAS, "--nodes", "4", "--gpus-per-node", "4", "--preset", "fifo",
                              "--backfill", "greedy", "--json", "--no-plots"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"]["fifo"]
    assert run["policy"]["backfill"] == "greedy" and run["policy"]["ordering"] == "fifo"


def test_the_text_report_gives_the_cycle_s_wall_time_as_the_replay_ran_it():
    res = runner.invoke(app, [TIRESIAS, "--nodes", "4", "--gpus-per-node", "4", "--preset", "fifo", "--no-plots"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("fifo: replayed 60 jobs"))
    assert re.search(r"\(\d+ cycles; each p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms wall; up to \d+ pending\)",
                     line), line


def test_policy_file_with_generic_trace():
    res = runner.invoke(app, [str(REPO / "examples" / "traces" / "generic.csv"),
                              "--cluster", str(REPO / "deploy" / "clusters" / "mixed-example.yaml"),
                              "--policy", str(REPO / "policies" / "default.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    (run,) = json.loads(res.stdout)["runs"].values()
    assert run["policy"]["admission"] == "quota" and run["jobs"]["finished"] == 10


def test_bad_flags_are_all_reported_with_what_is_allowed():
    res = runner.invoke(app, [TIRESIAS, "--preset", "nope", "--estimates", "psychic", "--ordering", "random"])
    assert res.exit_code == 1
    err = res.stderr
    assert "--preset: got 'nope'; one of fifo" in err
    assert "--estimates: got 'psychic'; one of none, exact, noisy, declared" in err
    assert "--cluster/--nodes" in err


def test_unknown_policy_name_from_a_flag():
    res = runner.invoke(app, [TIRESIAS, "--nodes", "2", "--ordering", "random"])
    assert res.exit_code == 1 and "ordering: got 'random'; one of" in res.stderr


def test_main_cli_has_sim():
    from raylane.cli import app as main_app

    res = runner.invoke(main_app, ["sim", "--help"])
    assert res.exit_code == 0 and "--preset" in res.stdout


def test_the_sim_options_are_one_dataclass_with_the_flags_defaults():
    """``_sim`` takes a ``SimArgs``: one field per parameter of the command, with the default its flag shows."""
    import dataclasses
    import inspect

    from raylane.cli.sim import sim
    from raylane.cli.sim_args import SimArgs

    params = inspect.signature(sim).parameters
    fields = {f.name: f.default for f in dataclasses.fields(SimArgs)}
    assert list(params) == list(fields)
    assert {name: p.default.default for name, p in params.items()} == fields


def test_the_help_shows_each_flag_of_the_dataclass_with_its_help_and_default():
    """``raylane sim --help`` is written from ``SimArgs`` alone: every field's flag, its help and its default."""
    import dataclasses

    from raylane.cli.sim_args import SimArgs, flag_of

    res = runner.invoke(app, ["--help"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    rows = [" ".join(line.strip("│ ").split()) for line in res.stdout.splitlines()]
    for f in dataclasses.fields(SimArgs):
        spec = flag_of(f)
        if spec.argument:
            assert any(row.startswith(spec.metavar) and spec.help in row for row in rows), (f.name, res.stdout)
            continue
        names = [n for ns in (spec.names or ("--" + f.name.replace("_", "-"),)) for n in ns.split("/")]
        row = next((r for r in rows if r.startswith(names[0] + " ")), None)
        assert row is not None and all(n in row for n in names), (f.name, res.stdout)
        assert spec.help is None or spec.help in row, (f.name, row)
        if isinstance(f.default, bool):  # an on/off pair shows the side it defaults to; a lone switch, nothing
            assert len(names) == 1 or f"[default: {names[0 if f.default else 1][2:]}]" in row, (f.name, row)
        elif f.default is not None:
            assert f"[default: {f.default}]" in row, (f.name, row)


def test_ctrl_c_keeps_partial_figures(tmp_path):
    """A real SIGINT to a long replay: it stops, prints the figures of what finished, marked partial, exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "raylane.cli", "sim", PHILLY, "--nodes", "70",
         "--preset", "fifo", "--json", "--out", str(tmp_path), "--no-plots"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 120
    line = ""
    while "trace " not in line and time.monotonic() < deadline:  # the replay starts after this line
        line = proc.stderr.readline()

    def cpu_s():  # the replay's own CPU time: on a loaded machine a wall-clock second may give it almost none
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    start = cpu_s()
    while cpu_s() - start < 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    report = json.loads(out)
    assert report["partial"] is True and report["runs"]["fifo"]["partial"] is True
    assert 0 < report["runs"]["fifo"]["jobs"]["finished"] < 82247
    assert json.loads((tmp_path / "summary.json").read_text())["partial"] is True


def test_outage_flags_add_the_outage_figures(tmp_path):
    events = tmp_path / "events.csv"
    events.write_text("time,node,event,duration\n300,node-001,fail,10m\n")
    args = [TIRESIAS, "--nodes", "4", "--gpus-per-node", "4", "--preset", "fifo", "--drain", "node-002@600+30m",
            "--node-events", str(events), "--drain-deadline", "5m", "--no-plots", "--no-progress"]
    res = runner.invoke(app, args + ["--json"])
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"]["fifo"]
    assert run["outages"]["failures"] == 1 and run["outages"]["drains"] == 1
    assert run["outages"]["down_gpu_hours"] == 4 * 600 / 3600
    assert run["fragmentation"]["stranded_mean"] >= 0
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    for row in ("stranded GPUs avg", "node failures", "lost GPU-h (failures)", "drain time avg"):
        assert row in res.stdout


def test_bad_outage_flags_are_all_reported():
    res = runner.invoke(app, [TIRESIAS, "--nodes", "2", "--fail", "node-000", "--drain", "node-001@soon",
                              "--mtbf", "0", "--drain-deadline", "later"])
    assert res.exit_code == 1
    for part in ("--fail: got 'node-000'; NODE@TIME", "--drain: got 'soon'", "--mtbf: got '0'; a duration > 0",
                 "--drain-deadline: got 'later'"):
        assert part in res.stderr, res.stderr
    res = runner.invoke(app, [TIRESIAS, "--nodes", "2", "--fail", "node-007@1h"])
    assert res.exit_code == 1 and "got 'node-007'; a node of the cluster, e.g. node-000, node-001" in res.stderr


def test_placement_flag_makes_one_run_per_placement():
    res = runner.invoke(app, [TIRESIAS, "--nodes", "4", "--gpus-per-node", "4", "--preset", "greedy",
                              "--placement", "pack", "--placement", "spread", "--json", "--no-progress"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)["runs"]
    assert set(runs) == {"greedy pack", "greedy spread"}
    assert runs["greedy spread"]["options"]["placement"] == "spread"
    assert "stranded_p95" in runs["greedy pack"]["fragmentation"]
    res = runner.invoke(app, [TIRESIAS, "--nodes", "2", "--placement", "scatter"])
    assert res.exit_code == 1 and "--placement: got 'scatter'; one of balanced" in res.stderr


def test_generate_replays_a_mix_and_writes_it_as_a_trace(tmp_path):
    out = tmp_path / "gangs.csv"
    args = ["--generate", "big-gangs", "--jobs", "150", "--seed", "4", "--nodes", "16", "--preset", "las-easy",
            "--json", "--no-plots", "--write-trace", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["trace"] == "generated:big-gangs:seed=4:jobs=150:load=0.9:cluster_gpus=128"
    run = report["runs"]["las-easy"]
    assert run["jobs"]["finished"] == 150
    assert set(run["preemptions"]["per_hour"]) == {"mean", "max", "over_one", "worst"}
    # The written CSV replays to the same figures as the generated trace.
    again = runner.invoke(app, [str(out), "--nodes", "16", "--preset", "las-easy", "--json", "--no-plots"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["runs"]["las-easy"]["jct"] == run["jct"]


def test_hysteresis_flags_override_the_preset_and_the_table_shows_thrash(tmp_path):
    # a: 8 GPUs for 1,000 s, demoted past 100 GPU-s; b arrives at 30 s and preempts it unless a hysteresis holds.
    tr = tmp_path / "pair.csv"
    tr.write_text("id,submit_time,duration,gpus\na,0,1000,8\nb,30,50,1\n")
    base = [str(tr), "--nodes", "1", "--preset", "las", "--las-thresholds", "100", "--no-plots"]
    res = runner.invoke(app, base + ["--hysteresis-min-run", "0"])
    assert res.exit_code == 0, res.output
    assert "preempt/job-h max" in res.stdout
    assert "most preempted per hour of runtime: job a, 1 preemption(s) in 0.29 h (3.50/h)" in res.stdout
    res = runner.invoke(app, base + ["--hysteresis-min-run", "20m", "--hysteresis-fraction", "0.5", "--json"])
    run = json.loads(res.stdout)["runs"]["las"]
    assert (run["policy"]["hysteresis_min_run_s"], run["policy"]["hysteresis_service_fraction"]) == (1200.0, 0.5)
    assert run["preemptions"]["total"] == 0 and run["preemptions"]["per_hour"]["worst"] is None


def test_bad_generate_and_hysteresis_flags_are_all_reported():
    res = runner.invoke(app, [TIRESIAS, "--generate", "long-tail", "--jobs", "0", "--load", "0", "--nodes", "2",
                              "--hysteresis-min-run", "soon", "--hysteresis-fraction", "-1"])
    assert res.exit_code == 1
    err = res.stderr
    assert "TRACE/--generate/--from-journal" in err
    assert "exactly one of a trace file, --generate MIX or --from-journal JOURNAL" in err
    assert "--generate: got 'long-tail'; one of heavy-tail, shared-burst, big-gangs" in err
    assert "--jobs: got 0; an integer >= 1" in err and "--load: got 0.0; a number > 0" in err
    assert "--hysteresis-min-run: got 'soon'" in err and "--hysteresis-fraction: got -1.0" in err
    res = runner.invoke(app, ["--nodes", "2", "--write-trace", "x.csv"])
    assert res.exit_code == 1 and "TRACE/--generate" in res.stderr and "--write-trace" in res.stderr


def test_sim_autoscale_compares_a_fixed_and_an_autoscaled_cluster_end_to_end(tmp_path):
    import typer

    from raylane.cli.sim_autoscale import register

    cli = typer.Typer()
    register(cli)
    cli.command("sim")(lambda: None)  # a second command, so typer keeps the sub-command name
    clusters = REPO / "deploy" / "clusters"
    res = runner.invoke(cli, ["sim-autoscale", "--generate", "big-gangs", "--jobs", "150", "--seed", "1",
                              "--fixed", str(clusters / "big-gangs-peak-fixed.yaml"),
                              "--autoscaled", str(clusters / "big-gangs-autoscaled.yaml"), "--json",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "compare.json").read_text())
    fixed, scaled = report["rows"]
    assert fixed["cost_ratio"] == 1.0 and fixed["jct_ratio"] == 1.0
    # The autoscaled groups buy what the queue asks for: less than the peak-sized cluster, every job done.
    assert 0 < scaled["cost_ratio"] < 1.0 and scaled["nodes_max"] <= 50
    assert (tmp_path / "nodes.png").stat().st_size > 0


def test_sim_autoscale_refuses_an_unpriced_or_growable_fixed_cluster(tmp_path):
    import typer

    from raylane.cli.sim_autoscale import register

    cli = typer.Typer()
    register(cli)
    cli.command("sim")(lambda: None)
    clusters = REPO / "deploy" / "clusters"
    def run(fixed, scaled):
        return runner.invoke(cli, ["sim-autoscale", "--generate", "big-gangs", "--jobs", "50",
                                   "--fixed", str(clusters / fixed), "--autoscaled", str(clusters / scaled)])

    res = run("big-gangs-autoscaled.yaml", "big-gangs-autoscaled.yaml")
    assert res.exit_code != 0 and "node_groups: got 'min/max'; fixed groups only" in res.output, res.output
    res = run("big-gangs-peak-fixed.yaml", "philly-560.yaml")  # no prices: nothing to compare
    assert res.exit_code != 0 and "philly-560.yaml" in res.output and "price per GPU-hour" in res.output, res.output
    # Every file's problems at once, each named with its file: a growable fixed file and an unpriced one.
    res = run("big-gangs-autoscaled.yaml", "philly-560.yaml")
    assert res.exit_code != 0, res.output
    assert "big-gangs-autoscaled.yaml: node_groups: got 'min/max'" in res.output, res.output
    assert "philly-560.yaml: node_groups (gpu).price" in res.output, res.output
