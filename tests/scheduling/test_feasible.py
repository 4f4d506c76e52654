"""check_feasible: the submit-time test that refuses what no node set and no quota could ever hold."""
import pytest

from raylane.scheduling import Infeasible, check_feasible

from .builders import node, nodes, obj, team, wl

NODES = [obj(n) for n in nodes(2)] + [obj(node("h1").gpus(4).features("h100").label(rack="r9"))]
TEAMS = {t.name: t for t in [team("nlp", gpu=8, borrow=4), team("cv", gpu=8), team("free")]}


@pytest.mark.parametrize("w,field,words", [
    (wl("a").team("ghost"), "team", ["unknown team 'ghost'", "known: cv, free, nlp"]),
    (wl("a").gpus(8).workers(3), "gang", ["needs 24 GPU", "at most 12", "nominal 8", "borrowing limit 4"]),
    (wl("a").team("cv").gpus(8).workers(3), "gang", ["needs 24 GPU", "at most 16", "borrowing limit none"]),
    (wl("a").gpus(1).features("tpu"), "gang.features", ["no node has tpu"]),
    (wl("a").gpus(1).features("h100", "tpu"), "gang.features", ["no node has tpu"]),
    (wl("a").gpus(4).workers(3).strategy("strict-pack"), "gang", ["strict-pack", "fits no set of nodes",
                                                                  "largest matching node n1 has 8 GPU"]),
    (wl("a").gpus(4).workers(2).features("h100"), "gang", ["fits no set of nodes", "h100", "h1 has 4 GPU"]),
    (wl("a").gpus(1).workers(4).strategy("strict-spread"), "gang", ["strict-spread"]),
    (wl("a").gpus(1).strategy("diagonal"), "gang.placement", ["unknown strategy 'diagonal'", "known: balanced"]),
    (wl("a").team("free").gpus(1).workers(2).strategy("group").group_by("pod"), "gang", ["group"]),
])
def test_infeasible(w, field, words):
    r = check_feasible(obj(w), NODES, TEAMS, "quota")
    assert isinstance(r, Infeasible) and r.field == field, r
    for word in words:
        assert word in str(r), (word, str(r))
    assert str(r).startswith(f"can never run: {field}: ")


@pytest.mark.parametrize("w", [
    wl("a").gpus(8).workers(1),
    wl("a").gpus(4).workers(3),                          # 12 = nominal + borrowing limit; spans nodes
    wl("a").team("free").gpus(8).workers(2).strategy("strict-spread"),
    wl("a").gpus(4).features("h100"),
    wl("a").gpus(2).workers(2).strategy("group"),        # h1 is the only node with a rack label
    wl("a").team("free").gpus(8).workers(2),             # a team with no GPU quota is not limited by quota
])
def test_feasible(w):
    assert check_feasible(obj(w), NODES, TEAMS, "quota") is None


def test_under_no_admission_quotas_and_teams_do_not_matter():
    assert check_feasible(obj(wl("a").team("ghost").gpus(8).workers(2)), NODES, TEAMS, "none") is None
    assert check_feasible(obj(wl("a").team("ghost").gpus(8).workers(3)), NODES, TEAMS, "none") is not None


def test_lending_limits_bound_what_a_team_can_ever_borrow():
    teams = {t.name: t for t in [team("nlp", gpu=8), team("cv", gpu=8, lend=2)]}
    assert check_feasible(obj(wl("a").gpus(10)), NODES[:2] + [obj(node("big").gpus(16))], teams) is None
    r = check_feasible(obj(wl("a").gpus(11)), NODES[:2] + [obj(node("big").gpus(16))], teams)
    assert r is not None and "at most 10" in str(r)


def test_no_nodes_at_all():
    r = check_feasible(obj(wl("a")), [], TEAMS)
    assert r is not None and r.field == "gang"
