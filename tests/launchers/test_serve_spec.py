"""The ``serve:`` section of a spec, the deployment it names and its args, the serving autoscaler's decisions, and
the metric definitions. No Ray session: the deployment checks import Ray Serve (to recognise a deployment) but start
nothing.

Bad-field cases are a table: the field a case breaks, its value, the path the error must carry and a phrase of the
allowed text the error must show. Deployment cases are a table too, over a small user project in a temp folder.
Autoscaler cases are timelines of (seconds, ongoing requests) with the target expected after the last sample.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.specdoc import DELETE, with_field
from tests.specdoc import raw as _raw

from raylane import metrics
from raylane.config.loader import MISSING, load_policy, load_spec, load_spec_from_dict
from raylane.config.serve import ServeModelSpec, ServeSpec
from raylane.errors import ValidationError
from raylane.launchers.autoscale import Autoscaling, ReplicaScaler, desired_replicas, pick_release

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "specs" / "serve-team-b.yaml"
LOCAL = ROOT / "policies" / "local.yaml"


def raw() -> dict:
    return _raw(EXAMPLE)


def errors(doc) -> list:
    with pytest.raises(ValidationError) as info:
        load_spec_from_dict(doc, "serve spec")
    return info.value.errors


# ------------------------------------------------------------------------------------------------ the spec


def test_example_is_valid_against_the_local_policy():
    spec = load_spec(EXAMPLE, load_policy(LOCAL))
    assert spec.kind == "serve" and spec.class_ == "serving" and spec.team == "team-b"
    s = spec.serve
    assert s.route_prefix == "/lm" and s.model.deployment == "workloads.serve_lm:LMServer"
    assert s.model.args["checkpoint"] is None and s.model.args["shape"]["d_model"] == 64
    assert s.replica.resources.gpu == 1 and s.replica.resources.memory == 1.0
    a = s.autoscaling
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests) == (1, 2, 2)
    assert (a.upscale_delay, a.downscale_delay) == (2.0, 30.0)
    assert s.latency_objective_ms == 500


def test_defaults_live_in_the_model():
    s = ServeSpec(model={"deployment": "mypkg.mod:Model"})
    assert s.model.args == {} and s.route_prefix is None
    assert s.replica.resources.gpu == 1 and s.replica.max_ongoing_requests > s.autoscaling.target_ongoing_requests
    assert s.autoscaling.min_replicas == 1 and s.autoscaling.downscale_delay == 60


def test_dump_and_reload_round_trips():
    spec = load_spec_from_dict(raw())
    again = load_spec_from_dict(spec.model_dump(by_alias=True, mode="json", exclude_none=True))
    assert again == spec


@pytest.mark.parametrize(
    "field, value, path, allowed",
    [
        ("serve", DELETE, "serve", "required for kind: serve"),
        ("serve.autoscaling.min_replicas", 0, "serve.autoscaling.min_replicas", ">= 1"),
        ("serve.autoscaling.max_replicas", 0, "serve.autoscaling.max_replicas", ">= 1"),
        ("serve.autoscaling.target_ongoing_requests", 0, "serve.autoscaling.target_ongoing_requests", "> 0"),
        ("serve.autoscaling.upscale_delay", "soon", "serve.autoscaling.upscale_delay", "a duration"),
        ("serve.autoscaling.downscale_delay", -1, "serve.autoscaling.downscale_delay", "a duration"),
        ("serve.autoscaling.max_replica", 3, "serve.autoscaling.max_replica", "did you mean max_replicas"),
        ("serve.latency_objective_ms", 0, "serve.latency_objective_ms", "> 0"),
        ("serve.route_prefix", "lm", "serve.route_prefix", "starting with '/'"),
        ("serve.route_prefix", "/a b", "serve.route_prefix", "starting with '/'"),
        ("serve.replica.resources.gpu", -1, "serve.replica.resources.gpu", ">= 0"),
        ("serve.replica.resources.memory", "1G", "serve.replica.resources.memory", "16Gi"),
        ("serve.replica.max_ongoing_requests", 0, "serve.replica.max_ongoing_requests", ">= 1"),
        ("serve.model", DELETE, "serve.model", "required"),
        ("serve.model.deployment", DELETE, "serve.model.deployment", "required: an import path"),
        ("serve.model.deployment", "not a path", "serve.model.deployment", "import path"),
        ("serve.model.args", [1], "serve.model.args", "mapping"),
        # The reference LM's own fields are its args, not the platform's.
        ("serve.model.checkpoint", None, "serve.model.checkpoint", "unknown field; allowed fields: deployment, args"),
        ("serve.model.max_new_tokens", 8, "serve.model.max_new_tokens", "unknown field"),
    ],
)
def test_bad_serve_fields_name_path_value_and_allowed(field, value, path, allowed):
    errs = errors(with_field(raw(), field, value))
    match = [e for e in errs if e[0] == path]
    assert match, errs
    if value is not DELETE:
        assert match[0][1] == value
    assert allowed in match[0][2], match[0]


def test_max_replicas_below_min_names_the_minimum():
    doc = with_field(with_field(raw(), "serve.autoscaling.min_replicas", 3), "serve.autoscaling.max_replicas", 2)
    (err,) = [e for e in errors(doc) if e[0] == "serve.autoscaling.max_replicas"]
    assert err[1] == 2 and ">= min_replicas (3)" in err[2]


@pytest.mark.parametrize("kind", ["train", "tune", "eval", "batch"])
def test_other_kinds_refuse_a_serve_section(kind):
    # A tune spec also lacks its sweep section; only the serve error is this test's business.
    (err,) = [e for e in errors(with_field(raw(), "kind", kind)) if e[0] == "serve"]
    assert err[0] == "serve" and f"this spec's kind is {kind}" in err[2] and "only for kind: serve" in err[2]


def test_all_errors_of_a_serve_spec_come_at_once():
    doc = with_field(raw(), "serve.autoscaling.min_replicas", 0)
    doc = with_field(doc, "serve.route_prefix", "lm")
    doc = with_field(doc, "team", "Bad Team")
    paths = {e[0] for e in errors(doc)}
    assert {"serve.autoscaling.min_replicas", "serve.route_prefix", "team"} <= paths


def test_train_specs_stay_valid_without_a_serve_section():
    spec = load_spec(ROOT / "examples" / "specs" / "pretrain-team-a.yaml")
    assert spec.serve is None


# ---------------------------------------------------------------------------------------------- deployment

# A user's project: deployment classes of every shape the driver meets, and modules that fail to load.
PROJECT = {
    "proj_serve.py": '''
        import pydantic
        from ray import serve

        class Args(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(extra="forbid")
            size: int = pydantic.Field(ge=1)
            name: str = "m"

        class Declared:
            config_schema = Args

            def __init__(self, size, name="m"):
                self.size, self.name = size, name

        class Plain:
            def __init__(self, size, *, name="m"):
                self.size, self.name = size, name

        class Anything:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class PositionalOnly:
            def __init__(self, size, /):
                self.size = size

        @serve.deployment
        class Wrapped:
            config_schema = Args

            def __init__(self, size, name="m"):
                self.size = size

        def handler(request):
            return "hi"
    ''',
    "proj_serve_broken.py": "import not_installed_anywhere_xyz\n",
    "proj_serve_raises.py": "raise RuntimeError('boom at import')\n",
}


@pytest.fixture
def project(tmp_path):
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    yield str(tmp_path)
    for mod in [m for m in sys.modules if m.startswith("proj_serve")]:
        del sys.modules[mod]


def deployment_errors(project, deployment, args=None):
    from raylane.launchers.serve import load_deployment

    with pytest.raises(ValidationError) as info:
        load_deployment(ServeModelSpec(deployment=deployment, args=args or {}), working_dir=project)
    return info.value.errors


@pytest.mark.parametrize(
    "deployment, args, path, value, allowed",
    [
        ("proj_nowhere:Model", {}, "serve.model.deployment", "proj_nowhere:Model", "module 'proj_nowhere' not found"),
        ("proj_serve:Missing", {}, "serve.model.deployment", "proj_serve:Missing",
         "has no 'Missing'; its classes: Anything, Args, Declared, Plain, PositionalOnly"),
        ("proj_serve_broken:Model", {}, "serve.model.deployment", "proj_serve_broken:Model",
         "it needs module 'not_installed_anywhere_xyz', which is not installed"),
        ("proj_serve_raises:Model", {}, "serve.model.deployment", "proj_serve_raises:Model",
         "RuntimeError: boom at import"),
        ("proj_serve:handler", {}, "serve.model.deployment", "proj_serve:handler",
         "a class or a Ray Serve deployment of one"),
        ("proj_serve:PositionalOnly", {}, "serve.model.deployment", "proj_serve:PositionalOnly",
         "positional-only argument 'size'"),
        # A declared schema checks the args, every problem named under serve.model.args.
        ("proj_serve:Declared", {"size": 0}, "serve.model.args.size", 0, ">= 1"),
        ("proj_serve:Declared", {"size": 1, "nmae": "x"}, "serve.model.args.nmae", "x", "did you mean name"),
        ("proj_serve:Declared", {}, "serve.model.args.size", MISSING, "required"),
        ("proj_serve:Wrapped", {"size": "big"}, "serve.model.args.size", "big", "integer"),
        # Without one, the constructor does.
        ("proj_serve:Plain", {"size": 1, "colour": "red"}, "serve.model.args.colour", "red",
         "unknown argument; Plain() takes size, name"),
        ("proj_serve.Plain", {"name": "x"}, "serve.model.args.size", MISSING, "required: Plain() has no default"),
    ],
)
def test_a_bad_deployment_or_args_is_refused_naming_the_field(project, deployment, args, path, value, allowed):
    errs = deployment_errors(project, deployment, args)
    match = [e for e in errs if e[0] == path]
    assert match, errs
    assert match[0][1] == value and allowed in match[0][2], match[0]


@pytest.mark.parametrize("deployment, args", [
    ("proj_serve:Declared", {"size": 2}),
    ("proj_serve:Plain", {"size": 2, "name": "x"}),
    ("proj_serve.Plain", {"size": 2}),
    ("proj_serve:Anything", {"whatever": [1, 2]}),
])
def test_a_class_that_fits_its_args_is_returned(project, deployment, args):
    from raylane.launchers.serve import load_deployment

    cls = load_deployment(ServeModelSpec(deployment=deployment, args=args), working_dir=project)
    assert cls.__name__ == deployment.replace(":", ".").rsplit(".", 1)[1]
    assert cls(**args) is not None


def test_a_ray_serve_deployment_is_returned_as_it_is(project):
    from ray import serve

    from raylane.launchers.serve import load_deployment

    dep = load_deployment(ServeModelSpec(deployment="proj_serve:Wrapped", args={"size": 1}), working_dir=project)
    assert isinstance(dep, serve.Deployment) and dep.func_or_class.__name__ == "Wrapped"


def test_the_example_deployment_and_its_args_pass(tmp_path):
    pytest.importorskip("torch")
    from raylane.launchers.serve import load_deployment

    model = load_spec(EXAMPLE).serve.model
    assert load_deployment(model).__name__ == "LMServer"
    bad = model.model_copy(update={"args": dict(model.args, shape={"d_model": 63}, checkpoint=str(tmp_path))})
    errs = {p: a for p, _, a in deployment_errors(None, bad.deployment, bad.args)}
    assert "multiple of n_heads" in errs["serve.model.args.shape"]
    assert "checkpoint directory" in errs["serve.model.args.checkpoint"]


def test_the_driver_checks_the_deployment_before_registering_anything(project):
    from raylane.launchers.serve import ServingDriver

    class NoControl:  # any call to the control actor would be registering something
        def __getattr__(self, name):
            raise AssertionError(f"control actor called ({name}) before the deployment was checked")

    doc = with_field(raw(), "serve.model.deployment", "proj_nowhere:Model")
    with pytest.raises(ValidationError) as info:
        ServingDriver(doc, ctl=NoControl())
    assert [e[0] for e in info.value.errors] == ["serve.model.deployment"]


# ---------------------------------------------------------------------------------------------- autoscaler

CFG = Autoscaling(min_replicas=1, max_replicas=4, target_ongoing_requests=2, upscale_delay_s=2, downscale_delay_s=10)


@pytest.mark.parametrize("ongoing, expected", [(0, 1), (1, 1), (2, 1), (2.5, 2), (4, 2), (4 + 1e-12, 2), (5, 3),
                                               (100, 4)])
def test_desired_replicas_is_clamped_ceiling(ongoing, expected):
    assert desired_replicas(CFG, ongoing) == expected


@pytest.mark.parametrize(
    "name, timeline, target",
    [
        ("steady load keeps the minimum", [(0, 1), (5, 2), (30, 0)], 1),
        ("a burst scales up only after the upscale delay", [(0, 6), (1.9, 6)], 1),
        ("a sustained burst scales up", [(0, 6), (1, 6), (2, 6)], 3),
        ("to the smallest desire seen while waiting", [(0, 8), (1, 5), (2, 8)], 3),
        ("a dip resets the upscale wait", [(0, 6), (1, 1), (1.5, 6), (3, 6)], 1),
        ("capped at max_replicas", [(0, 50), (2, 50)], 4),
        ("scale-down waits for the downscale delay", [(0, 6), (2, 6), (3, 0), (12, 0)], 3),
        ("scale-down after the delay, to the largest desire seen", [(0, 6), (2, 6), (3, 0), (8, 3), (13, 0)], 2),
        ("a burst during the wait cancels the scale-down", [(0, 6), (2, 6), (3, 0), (9, 6), (14, 0)], 3),
    ],
)
def test_scaler_timelines(name, timeline, target):
    s = ReplicaScaler(CFG)
    for t, ongoing in timeline:
        d = s.observe(t, ongoing)
    assert d.target == target, (name, d)


def test_scaler_target_stays_put_until_it_moves():
    # The driver may not have acted yet (a lease pending, one not held long enough): the target is not re-decided.
    s = ReplicaScaler(CFG)
    s.observe(0, 6)
    assert s.observe(2, 6).target == 3
    assert [s.observe(t, 6).target for t in (3, 4, 5)] == [3, 3, 3]
    assert "steady" in s.observe(6, 6).reason


@pytest.mark.parametrize(
    "held, now, hold, expected",
    [
        ([], 100, 10, None),
        ([("a", 95)], 100, 10, None),
        ([("a", 80), ("b", 85), ("c", 95)], 100, 10, "b"),
        ([("a", 80), ("b", 85)], 100, 0, "b"),
        ([("a", 90)], 100, 10, "a"),
    ],
)
def test_pick_release_gives_back_the_newest_lease_held_long_enough(held, now, hold, expected):
    assert pick_release(held, now, hold) == expected


# ------------------------------------------------------------------------------------------------- metrics


def test_metrics_are_defined_once_with_labels_in_their_help():
    names = [m.name for m in metrics.ALL]
    assert len(names) == len(set(names))
    for m in metrics.ALL:
        assert m.name.startswith("raylane_") and m.help
        for label in m.labels:
            assert label in m.help, (m.name, label)
        assert (m.kind == "histogram") == bool(m.boundaries)


def test_metric_mirror_records_without_ray_and_checks_labels():
    m = metrics.Metric("raylane_test_gauge", "gauge", "A test. Labels: app.", ("app",))
    m.set(3, app="x")
    m.set(4, app="x")
    assert metrics.snapshot("raylane_test_gauge") == {("raylane_test_gauge", (("app", "x"),)): 4.0}
    with pytest.raises(ValueError, match="exactly app"):
        m.set(1, app="x", team="y")
    with pytest.raises(TypeError, match="is a gauge"):
        m.inc(1, app="x")
    h = metrics.Metric("raylane_test_seconds", "histogram", "A test. Labels: app.", ("app",), (1.0,))
    h.observe(2.0, app="x")
    h.observe(3.0, app="x")
    snap = metrics.snapshot("raylane_test_seconds")
    assert snap[("raylane_test_seconds", (("app", "x"),), "count")] == 2
    assert snap[("raylane_test_seconds", (("app", "x"),), "sum")] == 5.0
