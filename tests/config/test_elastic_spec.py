"""Elastic gangs in specs and policies (issue 15): ``gang.workers: {min, max}``, ``resizable`` classes, the core's
``Gang`` bounds and the ``Resize`` decision's place in ``CycleResult``.

Pure: no Ray. Bad cases are a table: each names the value, the path the error must carry and a phrase of the
allowed text the error must show.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.specdoc import assert_has_error, errors_of, raw, with_field

from raylane.cli.spec import spec_summary
from raylane.config.loader import load_policy, load_policy_from_dict, load_spec_from_dict
from raylane.config.models import spec_workers, validate_spec_against_policy
from raylane.errors import ValidationError
from raylane.scheduling.types import Admit, CycleResult, Gang, Resize, Resources, WorkloadClass

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "policies" / "local.yaml"
DEFAULT = ROOT / "policies" / "default.yaml"
PRETRAIN = ROOT / "examples" / "specs" / "pretrain-team-a.yaml"


@pytest.fixture(scope="module")
def local_policy():
    return load_policy(LOCAL)


def spec_doc(workers, **fields) -> dict:
    doc = with_field(raw(PRETRAIN), "gang.workers", workers)
    # One GPU per worker: a range up to 4 stays within team-a's quota ceiling on the local policy.
    doc = with_field(doc, "gang.resources.gpu", 1)
    for k, v in fields.items():
        doc = with_field(doc, k, v)
    return doc




# ------------------------------------------------------------------------------------------------ good specs

GOOD = [
    # (workers as written, lo, hi, elastic)
    (2, 2, 2, False),
    ("3", 3, 3, False),
    ({"min": 2, "max": 4}, 2, 4, True),
    ({"min": 1, "max": 1}, 1, 1, False),
    ({"min": 3, "max": 3}, 3, 3, False),
]


@pytest.mark.parametrize("workers, lo, hi, elastic", GOOD, ids=[str(g[0]) for g in GOOD])
def test_good_worker_specs(workers, lo, hi, elastic, local_policy):
    spec = load_spec_from_dict(spec_doc(workers), policy=local_policy)
    assert (spec.gang.lo, spec.gang.hi, spec.gang.elastic) == (lo, hi, elastic)
    assert spec_workers(spec.gang.workers) == lo
    w = spec.to_core("w-1", local_policy, submit_time=0.0)
    assert w.gang.workers == lo
    assert (w.gang.lo, w.gang.hi, w.gang.elastic) == (lo, hi, elastic)
    assert w.gang.total == Resources(gpu=lo, cpu=lo, memory=lo)


def test_elastic_gang_is_built_at_min_with_its_bounds(local_policy):
    w = load_spec_from_dict(spec_doc({"min": 2, "max": 4}), policy=local_policy).to_core("w-1", local_policy, 0.0)
    assert (w.gang.workers, w.gang.min_workers, w.gang.max_workers) == (2, 2, 4)
    assert w.cls.resizable


def test_an_elastic_spec_round_trips_as_the_user_wrote_it(local_policy):
    # The control plane stores the spec as a dict (model_dump) and parses it again on the driver.
    spec = load_spec_from_dict(spec_doc({"min": 2, "max": 4}), policy=local_policy)
    data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert data["gang"]["workers"] == {"min": 2, "max": 4}
    assert load_spec_from_dict(data, policy=local_policy) == spec
    assert spec_workers(data["gang"]["workers"]) == 2


def test_spec_summary_shows_the_range(local_policy):
    spec = load_spec_from_dict(spec_doc({"min": 2, "max": 4}), policy=local_policy)
    assert "2..4 (elastic) x (1 GPU" in spec_summary(PRETRAIN, spec, LOCAL, code=False)
    fixed = load_spec_from_dict(spec_doc(2), policy=local_policy)
    assert ": 2 x (1 GPU" in spec_summary(PRETRAIN, fixed, LOCAL, code=False)


# ------------------------------------------------------------------------------------------------- bad specs

ANY = "an integer >= 1 (a fixed gang), or (min: N, max: M) with integers 1 <= N <= M"
BAD = [
    ("zero", 0, "gang.workers", 0, "an integer >= 1"),
    ("negative", -2, "gang.workers", -2, ANY),
    ("float", 1.5, "gang.workers", 1.5, "an integer >= 1"),
    ("bool", True, "gang.workers", True, ANY),
    ("text", "many", "gang.workers", "many", ANY),
    ("list", [2, 4], "gang.workers", [2, 4], ANY),
    ("min zero", {"min": 0, "max": 4}, "gang.workers.min", 0, "an integer >= 1"),
    ("max zero", {"min": 1, "max": 0}, "gang.workers.max", 0, "an integer >= 1"),
    ("min text", {"min": "two", "max": 4}, "gang.workers.min", "two", "an integer >= 1"),
    ("max float", {"min": 1, "max": 2.5}, "gang.workers.max", 2.5, "an integer >= 1"),
    ("min above max", {"min": 4, "max": 2}, "gang.workers.max", 2, "an integer >= min (4)"),
    ("max missing", {"min": 2}, "gang.workers", {"min": 2}, ANY + " (an elastic gang, for a class with resizable: "
                                                                  "true) (missing max)"),
    ("min missing", {"max": 2}, "gang.workers", {"max": 2}, "(missing min)"),
    ("unknown key", {"min": 1, "max": 2, "step": 1}, "gang.workers", {"min": 1, "max": 2, "step": 1},
     "(unknown step)"),
]


@pytest.mark.parametrize("workers, path, bad, allowed", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_worker_specs_name_path_value_and_allowed(workers, path, bad, allowed):
    errors = errors_of(load_spec_from_dict, spec_doc(workers))
    assert len(errors) == 1, errors
    assert_has_error(errors, path, bad, allowed)


def test_elastic_spec_on_a_class_that_is_not_resizable_is_refused(local_policy):
    doc = spec_doc({"min": 1, "max": 2}, **{"class": "finetune", "team": "team-b"})
    spec = load_spec_from_dict(doc)  # valid on its own: the class decides
    allowed = ("an integer: class finetune is not resizable (resizable: false in the policy), so its gangs have a "
               "fixed size; an elastic {min, max} needs a class with resizable: true: pretrain")
    assert_has_error(validate_spec_against_policy(spec, local_policy), "gang.workers", {"min": 1, "max": 2}, allowed)
    assert_has_error(errors_of(load_spec_from_dict, doc, policy=local_policy), "gang.workers",
                     {"min": 1, "max": 2}, allowed)
    with pytest.raises(ValidationError, match="class finetune is not resizable"):
        spec.to_core("w-1", local_policy, submit_time=0.0)
    # A range of one size is a fixed gang: any class takes it.
    fixed = load_spec_from_dict(spec_doc({"min": 2, "max": 2}, **{"class": "finetune", "team": "team-b"}))
    assert validate_spec_against_policy(fixed, local_policy) == []


def test_quota_ceiling_applies_to_min_not_max(local_policy):
    # team-a may hold 4 GPUs at most: a gang of 2 GPUs per worker fits at 2 workers, not at 3.
    ok = load_spec_from_dict(spec_doc({"min": 2, "max": 8}, **{"gang.resources.gpu": 2}))
    assert validate_spec_against_policy(ok, local_policy) == []
    too_big = load_spec_from_dict(spec_doc({"min": 3, "max": 8}, **{"gang.resources.gpu": 2}))
    assert_has_error(validate_spec_against_policy(too_big, local_policy), "gang.resources.gpu", 2.0,
                     "at most 4 gpu for the whole gang (3 workers)")


def test_elastic_tune_spec_is_refused():
    doc = raw(ROOT / "examples" / "specs" / "sweep-asha-team-a.yaml")
    doc = with_field(doc, "gang.workers", {"min": 1, "max": 2})
    errors = errors_of(load_spec_from_dict, doc)
    assert any(p == "sweep" and "gang.workers 1 for kind: tune (got {'min': 1, 'max': 2})".replace("{", "(")
               .replace("}", ")") in a for p, _, a in errors), errors


# --------------------------------------------------------------------------------------------------- policies


def test_policy_classes_parse_resizable():
    # policies/local.yaml marks pretrain resizable; policies/default.yaml (compared field by field with the core's
    # class in tests/config/test_config.py) leaves every class at the default, false.
    assert not any(c.resizable for c in load_policy(DEFAULT).classes.values())
    policy = load_policy(LOCAL)
    assert policy.classes["pretrain"].resizable
    assert not policy.classes["finetune"].resizable
    assert policy.classes["pretrain"].to_core("pretrain").resizable
    assert not policy.classes["finetune"].to_core("finetune").resizable


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), ("sometimes", False), (2, False)])
def test_policy_resizable_must_be_a_boolean(value, ok):
    doc = with_field(raw(DEFAULT), "classes.pretrain.resizable", value)
    if ok:
        assert load_policy_from_dict(doc).classes["pretrain"].resizable is value
    else:
        assert_has_error(errors_of(load_policy_from_dict, doc), "classes.pretrain.resizable", value,
                         "true or false")


# ------------------------------------------------------------------------------------------------ core types


def test_gang_bounds_and_at():
    fixed = Gang(3, Resources(gpu=1, cpu=2))
    assert (fixed.lo, fixed.hi, fixed.elastic) == (3, 3, False)
    g = Gang(2, Resources(gpu=1, cpu=2), min_workers=2, max_workers=8)
    assert (g.lo, g.hi, g.elastic) == (2, 8, True)
    g5 = g.at(5)
    assert (g5.workers, g5.min_workers, g5.max_workers) == (5, 2, 8)
    assert g5.total == Resources(gpu=5, cpu=10)
    assert g.total == Resources(gpu=2, cpu=4)
    assert WorkloadClass("c", 1, True).resizable is False


def test_cycle_result_carries_resizes_last_and_defaulted():
    w = load_spec_from_dict(spec_doc({"min": 2, "max": 4})).to_core("w-1", load_policy(LOCAL), 0.0)
    old = CycleResult((Admit(w, ("n1", "n2")),), (), ())
    assert old.resized == () and len(old.decisions) == 1
    r = Resize(w, 2, 4, ("n1", "n2", "n3", "n4"), (), "grow into free capacity")
    res = CycleResult((), (), (), (r,))
    assert res.resized == (r,) and res.decisions == (r,)
