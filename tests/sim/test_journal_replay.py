"""``raylane sim --from-journal``: a control plane's journal as a trace (``raylane.sim.journal``), without Ray.

The journal is written as the control plane writes it (``Journal.append`` with the kinds and fields it uses); each
figure is worked out by hand from the entries."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raylane.config.loader import load_policy
from raylane.control.journal import Journal
from raylane.errors import ValidationError
from raylane.cli.sim import app
from raylane.sim.journal import read_entries, simulate_journal, stop_delays, trace_from_journal

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "policies" / "local.yaml"
T0 = 1_700_000_000.0
NODE_A, NODE_B = "a" * 56, "b" * 56


def _spec(name, team, cls, workers=1, gpu=1.0, elastic=None):
    return {"name": name, "team": team, "class": cls, "kind": "train", "entrypoint": "workloads.ray_train:train",
            "gang": {"workers": elastic or workers, "resources": {"gpu": gpu, "cpu": 0.5}},
            "run": {"intent": "test", "owner": "pytest", "code_version": "v1", "data_snapshot": "d1"}}


@pytest.fixture
def journal(tmp_path):
    path = str(tmp_path / "journal.db")
    j = Journal(path)

    def at(ts, kind, wid, **data):
        j.append(kind, wid, ts=T0 + ts, **data)

    for nid in (NODE_A, NODE_B):
        at(0, "node", "@nodes", node=nid, event="joined", gpus=2.0, cpus=8.0, memory_gib=32.0, node_type="local",
           features=["gpu-sim"])
    # x: runs 10 s, checkpoints at 4 and 7, is preempted at 10 (keeps 7), runs again 20..25 and finishes: 12 s.
    at(0, "submitted", "x", spec=_spec("x", "team-a", "pretrain", workers=2), submit_time=T0 + 0)
    at(0, "admitted", "x", placement=[NODE_A, NODE_A])
    at(4, "checkpointed", "x", step=1)
    at(7, "checkpointed", "x", step=2)
    at(9, "preempting", "x", deadline=T0 + 29)
    at(10, "requeued", "x", attained_gpu_s=20.0)
    at(20, "admitted", "x", placement=[NODE_B, NODE_B])
    at(25, "finished", "x", state="SUCCEEDED")
    # y: submitted at 5, rejected; z: pending at the end; w: lost with node B at 30 after a checkpoint at 28.
    at(5, "submitted", "y", spec=_spec("y", "team-b", "pretrain", gpu=8), submit_time=T0 + 5)
    at(5, "rejected", "y", reason="never fits")
    at(6, "submitted", "z", spec=_spec("z", "team-b", "pretrain"), submit_time=T0 + 6)
    at(26, "submitted", "w", spec=_spec("w", "team-b", "finetune"), submit_time=T0 + 26)
    at(26, "admitted", "w", placement=[NODE_B])
    at(28, "checkpointed", "w", step=1)
    at(30, "node", "@nodes", node=NODE_B, event="lost")
    at(30, "requeued", "w", lost_node=NODE_B)
    at(31, "admitted", "w", placement=[NODE_A])
    at(35, "finished", "w", state="SUCCEEDED")
    # e: an elastic gang submitted at 2 workers that runs 4 s at 2 and 4 s at 4 (a resize keeps its work): 12 s
    # of work at its submitted size.
    at(40, "submitted", "e", spec=_spec("e", "team-a", "pretrain", elastic={"min": 2, "max": 4}),
       submit_time=T0 + 40)
    at(40, "admitted", "e", placement=[NODE_A, NODE_A])
    at(43, "resizing", "e", from_workers=2, to_workers=4, placement=[NODE_A] * 4, devices=[], reason="grow",
       deadline=T0 + 63)
    at(44, "resized", "e", from_workers=2, to_workers=4, placement=[NODE_A] * 4, devices=[])
    at(48, "finished", "e", state="SUCCEEDED")
    j.close()
    return path


def test_a_journal_becomes_the_trace_of_what_ran(journal):
    got = trace_from_journal(journal, load_policy(POLICY))
    jobs = {j.id: j for j in got.trace.jobs}
    assert list(jobs) == ["x", "w", "e"]  # by submit time; y rejected and z pending are left out
    assert got.trace.skipped == 2 and any("pending" in n for n in got.trace.notes)
    assert jobs["x"].duration == pytest.approx(7 + 5)  # 7 kept of the first attempt (its last checkpoint), 5
    assert jobs["w"].duration == pytest.approx(2 + 4)  # 2 kept before the node was lost
    assert jobs["e"].duration == pytest.approx(4 + 4 * 4 / 2)  # 0..44 at 2 workers, 44..48 at 4
    assert (jobs["x"].workers, jobs["x"].gpus, jobs["x"].team, jobs["x"].cls) == (2, 2.0, "team-a", "pretrain")
    assert (jobs["e"].min_workers, jobs["e"].max_workers) == (2, 4)
    assert got.starts == {"x": 0.0, "w": 26.0, "e": 40.0}
    assert got.trace.origin == T0
    assert [(f.node, f.at) for f in got.outages.failures] == [(NODE_B, 30.0)]
    assert sorted((n.id, n.capacity.gpu, n.capacity.cpu) for n in got.nodes) == [(NODE_A, 2.0, 8.0),
                                                                                   (NODE_B, 2.0, 8.0)]
    assert stop_delays(read_entries(journal)) == [pytest.approx(1.0), pytest.approx(1.0)]


def test_a_journal_without_a_policy_needs_one_named(journal):
    with pytest.raises(ValidationError) as err:
        trace_from_journal(journal)
    assert err.value.errors[0][0] == "--policy"


def test_the_replay_runs_every_job_on_the_journals_nodes_and_loses_the_node(journal):
    got = trace_from_journal(journal, load_policy(POLICY))
    result = simulate_journal(got, load_policy(POLICY))
    assert all(f >= 0 for f in result.finish)
    assert [n for n, _ in result.failures] == [NODE_B]


def test_sim_from_journal_on_the_command_line(journal, tmp_path):
    res = CliRunner().invoke(app, ["--from-journal", journal, "--policy", str(POLICY), "--out", str(tmp_path),
                                   "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "summary.json").read_text())
    (run,) = report["runs"].values()
    assert run["jobs"]["finished"] == 3
    bad = CliRunner().invoke(app, ["--from-journal", journal, "--generate", "heavy-tail"])
    assert bad.exit_code != 0 and "--from-journal" in bad.output


def test_the_live_figures_and_the_gangs_hand_over_come_from_the_journal(journal, tmp_path):
    # The fixture's gangs report no hand-over (``running``); a journal that records one: work counts from there.
    j = Journal(journal)
    j.append("submitted", "h", ts=T0 + 50, spec=_spec("h", "team-a", "pretrain"), submit_time=T0 + 50)
    j.append("admitted", "h", ts=T0 + 50, placement=[NODE_A])
    j.append("running", "h", ts=T0 + 53, job_id="raysubmit_h")
    j.append("finished", "h", ts=T0 + 63, state="SUCCEEDED")
    j.close()
    got = trace_from_journal(journal, load_policy(POLICY))
    jobs = {t.id: t for t in got.trace.jobs}
    assert jobs["h"].duration == pytest.approx(10.0)  # 53..63: its gang's run, not the 3 s of hand-over
    assert got.handover_s == pytest.approx(3.0) and got.stop_delay_s == pytest.approx(1.0)
    assert got.ends == {"x": 25.0, "w": 35.0, "e": 48.0, "h": 63.0} and got.preemptions["x"] == 1
    live = got.live_summary()
    assert live["jct"]["mean"] == pytest.approx((25 + 9 + 8 + 13) / 4) and live["preemptions"]["total"] == 1
    # The replay plays them: live fidelity, the hand-over and the stop delay measured.
    r = simulate_journal(got, load_policy(POLICY))
    assert r.options.fidelity == "live" and r.options.handover_s == pytest.approx(3.0)
    k = [t.id for t in r.jobs].index("h")
    assert r.finish[k] - r.first_start[k] == pytest.approx(13.0)  # its hand-over again, then its work
    res = CliRunner().invoke(app, ["--from-journal", journal, "--policy", str(POLICY)])
    assert res.exit_code == 0, res.output
    assert "live (the journal)" in res.output and "hand-over 3.0s" in res.output
    res = CliRunner().invoke(app, ["--from-journal", journal, "--policy", str(POLICY), "--json", "--out",
                                   str(tmp_path)])
    assert json.loads((tmp_path / "summary.json").read_text())["live"]["jobs"]["finished"] == 4
    bad = CliRunner().invoke(app, ["--generate", "heavy-tail", "--nodes", "2", "--handover", "30s"])
    assert bad.exit_code != 0 and "--handover" in bad.output and "--fidelity live" in bad.output
