"""Per-flavor quotas in the control plane, without Ray (``tests/controltest.py``; issue 28, item 3): team a may hold
2 GPUs of a100 nodes and none of h100 ones. Its gang that prefers h100 runs on a100; the next waits, told that its
flavor quota is full (not capacity: the h100 node is free), while team b takes the h100 node; ``explain`` shows the
team's GPUs per node type; a gang no flavor quota could ever hold is refused at submit, naming the field."""
from __future__ import annotations

import pytest

from raylane.control.records import State
from raylane.errors import ValidationError
from tests.controltest import Harness, node_id
from tests.raytest import local_policy, spec

NODES = (("gpu-a", {"gpus": 2, "node_type": "a100"}), ("gpu-h", {"gpus": 2, "node_type": "h100"}))


@pytest.fixture
def h(tmp_path):
    p = local_policy(pretrain={"min_runtime": 0})
    p["teams"] = {"a": {"quotas": {"gpu": {"nominal": 4}}, "flavors": {"a100": {"nominal": 2}, "h100": {"nominal": 0, "borrowing_limit": 0}}},
                  "b": {"quotas": {"gpu": {"nominal": 4}}}}
    harness = Harness(str(tmp_path / "journal.db"), p, nodes=NODES)
    yield harness
    harness.close()


def submit(h, name, team, types, gpu=2) -> str:
    s = spec(name, team, "pretrain", gpu=gpu, cpu=0.5)
    s["gang"]["node_types"] = list(types)
    return h.call("submit", spec=s)["id"]


def test_a_team_runs_on_the_node_type_its_flavor_quota_allows_and_waits_when_it_is_full(h):
    first = submit(h, "a-first", "a", ["h100", "a100"])
    h.tick()
    assert h.record(first).state is State.ADMITTED
    assert set(h.cs.state.leases[first].placement) == {node_id("gpu-a")}
    second = submit(h, "a-second", "a", ["h100", "a100"])
    other = submit(h, "b-job", "b", ["h100"])
    h.tick()
    assert h.record(other).state is State.ADMITTED
    rec = h.record(second)
    assert rec.state is State.PENDING
    assert "uses 0 of 0 GPU nominal on node type h100" in rec.reason and "a100 is full for it too" in rec.reason
    out = h.call("explain", workload_id=second)
    assert out["team_flavors"]["a100"] == {"used": 2.0, "nominal": 2, "borrowing_limit": None,
                                           "lending_limit": None}
    assert out["team_flavors"]["h100"]["used"] == 0.0 and out["team_flavors"]["h100"]["borrowing_limit"] == 0


def test_raylane_explain_prints_the_teams_gpus_per_flavor(h, monkeypatch):
    from typer.testing import CliRunner

    from raylane.cli import cluster
    from raylane.cli import app

    wid = submit(h, "a-first", "a", ["h100", "a100"])
    h.tick()

    class Client:  # the CLI's client, answering from the state machine
        def __getattr__(self, name):
            return lambda *a, **kw: h.call(name, **({"workload_id": a[0]} if a else {}), **kw)

    monkeypatch.setattr(cluster, "connect", lambda: Client())
    got = CliRunner().invoke(app, ["explain", wid])
    assert got.exit_code == 0, got.output
    assert "quota gpu on a100: used 2 of nominal 2, borrowing limit none" in got.stdout
    assert "quota gpu on h100: used 0 of nominal 0, borrowing limit 0" in got.stdout


def test_a_gang_no_flavor_quota_could_hold_is_refused_at_submit(h):
    with pytest.raises(ValidationError) as err:
        submit(h, "a-big", "a", ["h100"], gpu=2)
    assert [e[0] for e in err.value.errors] == ["gang.node_types"]
    assert "at most 0 on h100 (teams.a.flavors" in err.value.errors[0][2]
    assert h.call("queue") == []  # nothing was queued


# -- the policy files -------------------------------------------------------------------------------------------

def test_policy_check_names_each_bad_flavor_and_checks_node_types_against_a_cluster_file(tmp_path):
    from pathlib import Path

    import yaml
    from typer.testing import CliRunner

    from raylane.cli import app

    root = Path(__file__).resolve().parents[2]
    example, cluster = root / "policies" / "flavors.yaml", root / "deploy" / "clusters" / "autoscaling.yaml"
    runner = CliRunner()
    ok = runner.invoke(app, ["policy", "check", str(example), "--cluster", str(cluster)])
    assert ok.exit_code == 0 and "OK" in ok.stdout
    doc = yaml.safe_load(example.read_text())
    doc["teams"]["nlp"]["flavors"]["h200"] = {"nominal": 8}
    doc["teams"]["vision"]["flavors"]["l4-4x"] = {"nominal": 30, "lending_limit": 40}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    got = runner.invoke(app, ["policy", "check", str(bad)])
    assert got.exit_code == 1
    assert "teams.vision.flavors.l4-4x.lending_limit: got 40; a number from 0 to nominal (30)" in got.stderr
    doc["teams"]["vision"]["flavors"]["l4-4x"] = {"nominal": 30}  # over vision's GPU ceiling of 24
    doc["teams"]["vision"]["quotas"]["gpu"]["borrowing_limit"] = 0
    bad.write_text(yaml.safe_dump(doc))
    got = runner.invoke(app, ["policy", "check", str(bad)])
    assert "teams.vision.flavors:" in got.stderr and "GPU quota ceiling (24" in got.stderr
    assert "over it: l4-4x" in got.stderr
    doc["teams"]["vision"]["flavors"]["l4-4x"] = {"nominal": 16}
    bad.write_text(yaml.safe_dump(doc))
    assert runner.invoke(app, ["policy", "check", str(bad)]).exit_code == 0  # no cluster: node types not known
    got = runner.invoke(app, ["policy", "check", str(bad), "--cluster", str(cluster)])
    assert got.exit_code == 1
    assert "teams.nlp.flavors.h200: got 'h200'; a node type of the cluster: a100-8x, l4-4x" in got.stderr


# -- scale-up ---------------------------------------------------------------------------------------------------

def test_scale_up_asks_only_for_the_nodes_a_teams_flavor_quota_lets_it_use(tmp_path):
    """Group ``big`` adds a100 nodes; team-a's a100 quota is 4 GPUs: its first 4-GPU gang gets a node asked for, its
    second none, with the reason; team-b (no flavor quota) gets its node."""
    from tests.control.test_control_scale import ScaleHarness, big, cluster, policy, scale_entries

    pol = policy(flavors={"a100": {"nominal": 4, "borrowing_limit": 0}})
    h = ScaleHarness(str(tmp_path / "journal.db"), pol, cluster(max_nodes=3))
    try:
        first = h.call("submit", spec=big("first"))["id"]
        second = h.call("submit", spec=big("second"))["id"]
        other = h.call("submit", spec=big("other", team="team-b"))["id"]
        h.tick()
        assert [e["event"] for e in scale_entries(h, first)] == ["requested"]
        assert [e["event"] for e in scale_entries(h, other)] == ["requested"]
        assert scale_entries(h, second) == []
        reason = h.record(second).reason
        assert "no new node asked for: team team-a's flavor quotas have no room for its 4 GPUs" in reason
        assert "(room left: a100 0" in reason
    finally:
        h.close()
