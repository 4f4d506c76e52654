"""Policy and spec models, the YAML loader's error reporting, conversion to core types, and the check commands.

Pure: no Ray. Bad-field cases are tables: each names the field it breaks, the value, the path the error must carry
and a phrase of the allowed text the error must show.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.specdoc import DELETE, assert_has_error, errors_of, raw, with_field
from typer.testing import CliRunner

from raylane.cli import app
from raylane.config import loader
from raylane.config.loader import (
    MISSING,
    default_policy_path,
    load_policy,
    load_policy_from_dict,
    load_spec,
    load_spec_from_dict,
)
from raylane.config.models import (
    ORDERING_POLICIES,
    ClusterPolicy,
    WorkloadSpec,
    parse_duration,
    parse_memory,
    validate_spec_against_policy,
)
from raylane.errors import NotFoundError, UnknownNameError, ValidationError
from raylane.scheduling.types import Gang, Quota, Resources, SchedulerConfig, Team, UserRule, WorkloadClass

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "policies" / "default.yaml"
LOCAL = ROOT / "policies" / "local.yaml"
PACKAGED = ROOT / "platform" / "raylane" / "config" / "default_policy.yaml"
SPECS = ROOT / "examples" / "specs"
PRETRAIN = SPECS / "pretrain-team-a.yaml"
BAD_POLICY = ROOT / "tests" / "data" / "bad_policy.yaml"
BAD_SPEC = ROOT / "tests" / "data" / "bad_spec.yaml"


@pytest.fixture(scope="module")
def local_policy() -> ClusterPolicy:
    return load_policy(LOCAL)


# ------------------------------------------------------------------------------------------ the shipped files


def test_default_policy_loads_with_the_documented_classes_and_teams():
    p = load_policy(DEFAULT)
    assert set(p.classes) == {"pretrain", "finetune", "sweep", "eval", "batch-inference", "serving", "data-prep"}
    assert p.workload_class("pretrain") == WorkloadClass(
        name="pretrain", priority=100, preemptible=True, min_runtime_s=600, checkpoint_interval_s=600,
        grace_period_s=120, retry_budget=3, queue_time_target_s=4 * 3600,
    )
    assert p.workload_class("finetune").priority == 200 and p.workload_class("finetune").grace_period_s == 60
    assert p.classes["sweep"].default_placement == "spread"
    assert not p.workload_class("serving").preemptible and p.workload_class("serving").priority == 1000
    assert not p.workload_class("data-prep").preemptible
    assert 3 <= len(p.teams) <= 4
    gpu = [t.quotas["gpu"] for t in p.teams.values()]
    assert any(q.borrowing_limit for q in gpu) and any(q.lending_limit is not None for q in gpu)
    assert {"a100-8x", "h100-8x", "l4-4x", "cpu"} <= set(p.prices)
    assert {"gpu-a100", "gpu-h100", "nvlink", "ssd", "high-ram"} <= set(p.node_features)


def test_local_policy_matches_the_local_demo_cluster(local_policy):
    teams = local_policy.core_teams()
    assert set(teams) == {"team-a", "team-b"}
    for t in teams.values():
        assert t.quotas["gpu"] == Quota(nominal=2, borrowing_limit=2, lending_limit=None)
    assert sum(t.quotas["gpu"].nominal for t in teams.values()) == 4
    for name in local_policy.classes:
        c = local_policy.workload_class(name)
        assert c.min_runtime_s <= 10 and c.checkpoint_interval_s <= 10 and c.grace_period_s <= 30


def test_packaged_default_policy_is_identical_to_the_repository_file():
    assert PACKAGED.read_bytes() == DEFAULT.read_bytes(), (
        "policies/default.yaml changed: cp policies/default.yaml platform/raylane/config/default_policy.yaml"
    )


def test_default_policy_path_is_the_repository_file_in_a_checkout_else_the_packaged_copy(monkeypatch, tmp_path):
    assert default_policy_path() == DEFAULT
    monkeypatch.setattr(loader, "_REPO_ROOT", tmp_path)
    packaged = default_policy_path()
    assert packaged.resolve() == PACKAGED.resolve()
    assert load_policy() == load_policy(DEFAULT)


@pytest.mark.parametrize("spec_file", sorted(SPECS.glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_are_valid_against_the_local_policy(spec_file, local_policy):
    spec = load_spec(spec_file, local_policy)
    assert spec.run.intent


# ------------------------------------------------------------------------------------------ scalar parsing


@pytest.mark.parametrize(
    "text, seconds",
    [(90, 90), (2.5, 2.5), ("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
     ("1.5h", 5400), ("500ms", 0.5), (" 5m ", 300), ("0", 0), (0, 0),
     # one grammar for specs and flags: weeks, parts concatenated in any unit, spaces between parts ignored
     ("2w", 14 * 86400), ("1w2d", 9 * 86400), ("1.5w", 10.5 * 86400), ("1d12h", 129600), ("90m30s", 5430),
     ("1h 30m", 5400), ("30 m", 1800), ("1m500ms", 60.5)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["-5s", -1, "5x", "", "m", "10 minutes", "1h-5m", True, None, [1], math.inf, "nan",
                                  "w", "2W", "1y", "h1", "2w-1d", "1h30", "5mss"])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="a duration"):
        parse_duration(text)


def test_one_duration_grammar_for_specs_policies_and_flags():
    import typer

    from raylane.cli import common
    from raylane.config import fields, models
    from raylane.sim import outages

    # Every caller reads durations with the same parser (re-exported where callers have always found it).
    assert models.parse_duration is fields.parse_duration is outages.parse_duration
    for text, seconds in (("2w", 14 * 86400), ("1h30m", 5400), ("90", 90), ("1w2d", 9 * 86400)):
        assert common.parse_duration(text, "--since") == pytest.approx(seconds)
    assert common.parse_duration(None, "--ttl") is None
    # A flag's duration must be positive; its error names the flag, the value and what is allowed.
    for bad in ("soon", "0", "0s", "-1h"):
        with pytest.raises(typer.Exit):
            common.parse_duration(bad, "--ttl")
    got = CliRunner().invoke(app, ["audit", "--since", "2x"])
    said = " ".join(got.output.split())  # the console wraps long lines
    assert got.exit_code == 1
    assert "--since: got '2x'" in said and common.DURATION_FLAG_ALLOWED in said, got.output


@pytest.mark.parametrize(
    "text, gib",
    [(16, 16), (0.5, 0.5), ("16", 16), ("16Gi", 16), ("16GiB", 16), ("512Mi", 0.5), ("1Ti", 1024),
     ("1048576Ki", 1), ("1.5Gi", 1.5)],
)
def test_memory(text, gib):
    assert parse_memory(text) == pytest.approx(gib)


@pytest.mark.parametrize("text", ["16GB", "16G", "-1Gi", -1, "lots", True, None, "Gi"])
def test_bad_memory(text):
    with pytest.raises(ValueError, match="16Gi"):
        parse_memory(text)


# ------------------------------------------------------------------------------------------ policy errors

POLICY_CASES = [
    # (id, field set, value, error path, error value, part of the allowed text)
    ("ordering", "scheduler.ordering", "sjf", "scheduler.ordering", "sjf", "one of " + ", ".join(ORDERING_POLICIES)),
    ("backfill", "scheduler.backfill", "eager", "scheduler.backfill", "eager", "one of easy, greedy, none"),
    ("preemption", "scheduler.preemption", "always", "scheduler.preemption", "always", "one of default, none, ordering"),
    ("admission", "scheduler.admission", "fair", "scheduler.admission", "fair", "one of none, quota"),
    ("ordering not a string", "scheduler.ordering", 3, "scheduler.ordering", 3, "one of "),
    ("max admissions 0", "scheduler.max_admissions_per_cycle", 0, "scheduler.max_admissions_per_cycle", 0,
     "an integer >= 1"),
    ("max admissions word", "scheduler.max_admissions_per_cycle", "many", "scheduler.max_admissions_per_cycle",
     "many", "an integer >= 1"),
    ("las decreasing", "scheduler.las_thresholds", [600, 60], "scheduler.las_thresholds", [600, 60],
     "strictly increasing"),
    ("las item", "scheduler.las_thresholds", [60, "soon"], "scheduler.las_thresholds[1]", "soon", "a duration"),
    ("half-life 0", "scheduler.fair_share_half_life", 0, "scheduler.fair_share_half_life", 0, "a duration > 0"),
    ("scheduler typo", "scheduler.fair_share_half_life_s", 60, "scheduler.fair_share_half_life_s", 60,
     "did you mean fair_share_half_life?"),
    ("priority float", "classes.pretrain.priority", 1.5, "classes.pretrain.priority", 1.5, "an integer"),
    ("priority missing", "classes.pretrain.priority", DELETE, "classes.pretrain.priority", MISSING,
     "required: an integer"),
    ("preemptible", "classes.pretrain.preemptible", "maybe", "classes.pretrain.preemptible", "maybe",
     "true or false"),
    ("min runtime negative", "classes.pretrain.min_runtime", -5, "classes.pretrain.min_runtime", -5, "a duration"),
    ("checkpoint words", "classes.pretrain.checkpoint_every", "5 minutes", "classes.pretrain.checkpoint_every",
     "5 minutes", "like 90s, 10m, 2h, 1d"),
    ("grace", "classes.eval.grace_period", "soon", "classes.eval.grace_period", "soon", "a duration"),
    ("queue target", "classes.eval.queue_time_target", [1], "classes.eval.queue_time_target", [1], "a duration"),
    ("retry budget", "classes.pretrain.retry_budget", -1, "classes.pretrain.retry_budget", -1, "an integer >= 0"),
    ("placement", "classes.pretrain.default_placement", "packed", "classes.pretrain.default_placement", "packed",
     "one of balanced, data-locality, group, pack, spread, strict-pack, strict-spread"),
    ("class field typo", "classes.pretrain.priorty", 5, "classes.pretrain.priorty", 5,
     "unknown field; allowed fields: priority, preemptible, min_runtime"),
    ("class name", "classes.Pre_Train", {"priority": 1, "preemptible": True}, "classes.Pre_Train", "Pre_Train",
     "lowercase letters, digits and '-'"),
    ("classes empty", "classes", {}, "classes", {}, "a mapping with at least 1 entry"),
    ("classes a list", "classes", ["pretrain"], "classes", ["pretrain"], "a mapping"),
    ("teams missing", "teams", DELETE, "teams", MISSING, "required: a mapping"),
    ("weight 0", "teams.team-a.weight", 0, "teams.team-a.weight", 0, "a number > 0"),
    ("resource name", "teams.team-a.quotas.gpus", {"nominal": 1}, "teams.team-a.quotas.gpus", "gpus",
     "one of gpu, cpu, memory"),
    ("nominal negative", "teams.team-a.quotas.gpu.nominal", -1, "teams.team-a.quotas.gpu.nominal", -1,
     "a number >= 0"),
    ("nominal missing", "teams.team-a.quotas.gpu.nominal", DELETE, "teams.team-a.quotas.gpu.nominal", MISSING,
     "required: a number >= 0"),
    ("borrowing negative", "teams.team-a.quotas.gpu.borrowing_limit", -1, "teams.team-a.quotas.gpu.borrowing_limit",
     -1, "a number >= 0 or null"),
    ("lending above nominal", "teams.team-a.quotas.gpu.lending_limit", 3, "teams.team-a.quotas.gpu.lending_limit",
     3, "a number from 0 to nominal (2)"),
    ("lending negative", "teams.team-a.quotas.gpu.lending_limit", -1, "teams.team-a.quotas.gpu.lending_limit", -1,
     "a number >= 0 or null"),
    ("quota typo", "teams.team-a.quotas.gpu.borrow", 1, "teams.team-a.quotas.gpu.borrow", 1,
     "allowed fields: nominal, borrowing_limit, lending_limit"),
    ("user order unknown", "teams.team-a.users", {"order": "round-robin"}, "teams.team-a.users.order",
     "round-robin", "one of fair, queue"),
    ("user share above 1", "teams.team-a.users", {"max_share": 1.5}, "teams.team-a.users.max_share", 1.5,
     "a number > 0 and <= 1"),
    ("user share 0", "teams.team-a.users", {"max_share": 0}, "teams.team-a.users.max_share", 0,
     "a number > 0 and <= 1"),
    ("user rule typo", "teams.team-a.users", {"max_shares": 0.5}, "teams.team-a.users.max_shares", 0.5,
     "allowed fields: order, max_share"),
    ("user share without gpu quota", "teams.team-a", {"users": {"max_share": 0.5}}, "teams.team-a.users",
     {"max_share": 0.5}, "max_share only with a gpu quota"),
    ("feature tag", "node_features.GPU A100", "x", "node_features.GPU A100", "GPU A100", "lowercase letters"),
    ("feature description", "node_features.ssd", None, "node_features.ssd", None, "a string"),
    ("price negative", "prices.local", -1, "prices.local", -1, "a number >= 0"),
    ("price infinite", "prices.local", math.inf, "prices.local", math.inf, "a number >= 0"),
    ("top-level typo", "clases", {}, "clases", {}, "did you mean classes?"),
]


@pytest.mark.parametrize(
    "field, value, path, bad, allowed", [c[1:] for c in POLICY_CASES], ids=[c[0] for c in POLICY_CASES]
)
def test_policy_field_errors_name_path_value_and_allowed(field, value, path, bad, allowed):
    doc = with_field(raw(LOCAL), field, value)
    errors = errors_of(load_policy_from_dict, doc, "local")
    assert_has_error(errors, path, bad, allowed)


def test_lending_limit_is_checked_even_when_another_quota_field_is_bad():
    doc = with_field(raw(LOCAL), "teams.team-a.quotas.gpu", {"nominal": 2, "borrowing_limit": -1, "lending_limit": 5})
    paths = [e[0] for e in errors_of(load_policy_from_dict, doc)]
    assert "teams.team-a.quotas.gpu.borrowing_limit" in paths and "teams.team-a.quotas.gpu.lending_limit" in paths


def test_bad_policy_file_reports_every_error_at_once():
    errors = errors_of(load_policy, BAD_POLICY)
    assert [e[0] for e in errors] == [
        "scheduler.ordering",
        "scheduler.max_admissions_per_cycle",
        "scheduler.las_thresholds",
        "scheduler.fair_share_halflife",
        "classes.pretrain.priority",
        "classes.pretrain.min_runtime",
        "classes.pretrain.retry_budget",
        "classes.pretrain.default_placement",
        "classes.Serving",
        "teams.nlp.weight",
        "teams.nlp.quotas.gpu.borrowing_limit",
        "teams.nlp.quotas.gpu.lending_limit",
        "teams.nlp.quotas.gpus",
        "teams.vision.quotas.cpu.nominal",
        "prices.a100-8x",
    ]
    for path, value, allowed in errors:
        assert allowed and allowed != "Input should be a valid integer", (path, allowed)


def test_policy_error_message_lists_path_value_and_allowed():
    with pytest.raises(ValidationError) as info:
        load_policy(BAD_POLICY)
    text = str(info.value)
    assert text.startswith(f"{BAD_POLICY}: 15 error(s)")
    assert "  scheduler.ordering: got 'shortest-first'; one of " in text


def test_policy_must_be_a_mapping():
    errors = errors_of(load_policy_from_dict, ["not", "a", "mapping"])
    assert_has_error(errors, "(top level)", ["not", "a", "mapping"], "a mapping with fields scheduler, classes, teams")


# ------------------------------------------------------------------------------------------ YAML and files


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("scheduler:\n  ordering: fifo\n   backfill: easy\n")
    [(where, line, allowed)] = errors_of(load_policy, f)
    assert where == "line 3, column 12"
    assert line == "backfill: easy"
    assert allowed.startswith("valid YAML (")


def test_duplicate_keys_are_errors_not_silently_overwritten(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(LOCAL.read_text() + "\nprices:\n  local: 1\n")
    errors = errors_of(load_policy, f)
    assert len(errors) == 1
    where, key, allowed = errors[0]
    assert where.startswith("line ") and key == "prices" and "each key once" in allowed


def test_empty_file_is_an_error(tmp_path):
    f = tmp_path / "empty.yaml"
    f.write_text("# nothing\n")
    assert_has_error(errors_of(load_policy, f), "(top level)", None, "a mapping with fields")


def test_binary_file_is_an_error(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_bytes(b"classes: \xff\xfe\n")
    assert_has_error(errors_of(load_policy, f), "byte 9", None, "UTF-8 text")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(NotFoundError, match=r"policy file .*nope\.yaml not found"):
        load_policy(tmp_path / "nope.yaml")
    with pytest.raises(NotFoundError, match="spec file .* not found .it is a directory."):
        load_spec(tmp_path)


# ------------------------------------------------------------------------------------------ spec errors

SWEEP = {"trainable": "tests.sweep_fns:quadratic", "space": {"lr": {"type": "uniform", "low": 0.001, "high": 0.01}}, "budget": {"max": 10}, "metric": "loss",
         "mode": "min", "trials": 2}

SPEC_CASES = [
    ("name case", "name", "Pretrain_LM", "name", "Pretrain_LM", "lowercase letters, digits and '-'"),
    ("name long", "name", "a" * 64, "name", "a" * 64, "at most 63"),
    ("name dash", "name", "-lm", "name", "-lm", "starting and ending with a letter or digit"),
    ("team missing", "team", DELETE, "team", MISSING, "required: a name"),
    ("class_ is not the key", "class_", "pretrain", "class_", "pretrain", "unknown field; allowed fields: name, team, class"),
    ("kind", "kind", "training", "kind", "training", "one of train, tune, serve, batch, eval"),
    ("workers 0", "gang.workers", 0, "gang.workers", 0, "an integer >= 1"),
    ("workers float", "gang.workers", 1.5, "gang.workers", 1.5, "an integer >= 1"),
    ("gpu negative", "gang.resources.gpu", -1, "gang.resources.gpu", -1, "a number >= 0"),
    ("gpu share above 1", "gang.resources.gpu", 1.5, "gang.resources.gpu", 1.5,
     "a fraction below 1 (a share of one GPU) or a whole number of GPUs per worker, like 0.5 or 2"),
    ("memory GB", "gang.resources.memory", "16GB", "gang.resources.memory", "16GB", "like 16Gi, 512Mi"),
    ("resource typo", "gang.resources.gpus", 1, "gang.resources.gpus", 1, "allowed fields: gpu, cpu, memory"),
    ("placement", "gang.placement", "scatter", "gang.placement", "scatter", "one of balanced, data-locality"),
    ("feature tag", "gang.features", ["ok", "Bad Tag"], "gang.features[1]", "Bad Tag", "lowercase letters"),
    ("features not a list", "gang.features", "ssd", "gang.features", "ssd", "a list"),
    ("runtime estimate", "runtime_estimate", "soon", "runtime_estimate", "soon", "a duration"),
    ("entrypoint empty", "entrypoint", "", "entrypoint", "", "a string with at least 1 character or null"),
    ("config not a mapping", "config", "lr=1", "config", "lr=1", "a mapping"),
    ("intent blank", "run.intent", "   ", "run.intent", "   ", "a sentence saying why this run exists"),
    ("intent missing", "run.intent", DELETE, "run.intent", MISSING, "required: a sentence"),
    ("run missing", "run", DELETE, "run", MISSING, "required: a mapping with fields intent, owner"),
    ("run typo", "run.reason", "x", "run.reason", "x", "allowed fields: intent, owner, code_version, data_snapshot"),
    ("sweep section on kind train", "sweep", SWEEP, "sweep", SWEEP, "only for kind: tune (this spec's kind is train)"),
]


@pytest.mark.parametrize(
    "field, value, path, bad, allowed", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES]
)
def test_spec_field_errors_name_path_value_and_allowed(field, value, path, bad, allowed):
    doc = with_field(raw(PRETRAIN), field, value)
    assert_has_error(errors_of(load_spec_from_dict, doc), path, bad, allowed)


CROSS_CASES = [
    ("unknown team", "team", "team-c", "team", "team-c", "a team of the policy: one of team-a, team-b"),
    ("unknown class", "class", "research", "class", "research", "a class of the policy: one of pretrain"),
    ("undeclared feature", "gang.features", ["gpu-sim", "gpu-a100"], "gang.features[1]", "gpu-a100",
     "a node feature declared by the policy: one of gpu-sim"),
    ("gang above team ceiling", "gang.workers", 3, "gang.resources.gpu", 2.0,
     "at most 4 gpu for the whole gang (3 workers): team team-a may hold 2 nominal + 2 borrowed"),
]


@pytest.mark.parametrize(
    "field, value, path, bad, allowed", [c[1:] for c in CROSS_CASES], ids=[c[0] for c in CROSS_CASES]
)
def test_spec_against_policy(field, value, path, bad, allowed, local_policy):
    doc = with_field(raw(PRETRAIN), field, value)
    spec = load_spec_from_dict(doc)  # valid on its own
    assert_has_error(validate_spec_against_policy(spec, local_policy), path, bad, allowed)
    assert_has_error(errors_of(load_spec_from_dict, doc, policy=local_policy), path, bad, allowed)
    with pytest.raises(ValidationError):
        spec.to_core("w-1", local_policy, submit_time=0.0)


def test_gang_size_is_not_limited_by_quota_when_admission_is_none(local_policy):
    policy = local_policy.model_copy(update={"scheduler": local_policy.scheduler.model_copy(update={"admission": "none"})})
    spec = load_spec_from_dict(with_field(raw(PRETRAIN), "gang.workers", 5))
    assert validate_spec_against_policy(spec, policy) == []


def test_bad_spec_file_reports_its_own_errors_and_the_policy_ones_at_once(local_policy):
    errors = errors_of(load_spec, BAD_SPEC, local_policy)
    assert [e[0] for e in errors] == [
        "name",
        "kind",
        "gang.workers",
        "gang.resources.memory",
        "gang.placement",
        "runtime_estimate",
        "run.intent",
        "priority",
        "gang.features[0]",
    ]


def test_unknown_team_is_reported_even_when_the_spec_has_other_errors(local_policy):
    doc = with_field(with_field(raw(PRETRAIN), "team", "team-z"), "gang.workers", 0)
    paths = [e[0] for e in errors_of(load_spec_from_dict, doc, policy=local_policy)]
    assert paths == ["gang.workers", "team"]


# ------------------------------------------------------------------------------------------ conversion


def test_policy_defaults_are_the_core_defaults():
    p = load_policy_from_dict({"classes": {"c": {"priority": 1, "preemptible": True}}, "teams": {"t": {}}})
    assert p.to_scheduler_config() == SchedulerConfig()
    assert p.workload_class("c") == WorkloadClass(name="c", priority=1, preemptible=True)
    assert p.core_teams() == {"t": Team(name="t", quotas={})}
    assert p.classes["c"].default_placement == Gang(1, Resources()).strategy


def test_scheduler_config_from_policy():
    doc = with_field(raw(LOCAL), "scheduler", {
        "ordering": "las", "backfill": "greedy", "preemption": "ordering", "admission": "none",
        "max_admissions_per_cycle": 3, "las_thresholds": ["1m", "1h"], "fair_share_half_life": "1d",
        "default_runtime": "2h",
    })
    assert load_policy_from_dict(doc).to_scheduler_config() == SchedulerConfig(
        ordering="las", admission="none", backfill="greedy", preemption="ordering", max_admissions_per_cycle=3,
        las_thresholds=(60.0, 3600.0), fair_share_half_life_s=86400.0, default_runtime_s=7200.0,
    )


def test_core_teams():
    p = load_policy(DEFAULT)
    nlp = p.core_teams()["nlp"]
    assert nlp == Team(
        name="nlp",
        weight=2.0,
        quotas={
            "gpu": Quota(32, 16, 16),
            "cpu": Quota(512, 256, None),
            "memory": Quota(4096, 2048, None),
        },
    )


def test_core_teams_user_rule():
    doc = with_field(raw(LOCAL), "teams.team-a.users", {"max_share": 0.5})
    teams = load_policy_from_dict(doc).core_teams()
    assert teams["team-a"].users == UserRule(fair=True, max_share=0.5)
    assert load_policy_from_dict(raw(LOCAL)).core_teams()["team-a"].users is None  # default: off


def test_unknown_workload_class(local_policy):
    with pytest.raises(UnknownNameError, match="unknown workload class 'nope'; known: eval, finetune"):
        local_policy.workload_class("nope")


def test_spec_to_core(local_policy):
    spec = load_spec(PRETRAIN, local_policy)
    w = spec.to_core("w-7", local_policy, submit_time=12.5)
    assert w.id == "w-7" and w.team == "team-a" and w.submit_time == 12.5 and w.kind == "train"
    assert w.cls == local_policy.workload_class("pretrain")
    assert w.gang == Gang(workers=2, per_worker=Resources(gpu=2, cpu=1, memory=1), strategy="spread")
    assert w.runtime_estimate_s == 300 and w.data_snapshot == "tinytext-v1"


@pytest.mark.parametrize(
    "klass, placement, strategy",
    [("pretrain", None, "pack"), ("sweep", None, "spread"), ("sweep", "strict-pack", "strict-pack")],
)
def test_placement_defaults_to_the_class(klass, placement, strategy, local_policy):
    doc = with_field(with_field(raw(PRETRAIN), "class", klass), "gang.placement", placement)
    w = load_spec_from_dict(doc).to_core("w", local_policy, 0.0)
    assert w.gang.strategy == strategy


def test_spec_fields_and_alias():
    spec = load_spec_from_dict(with_field(raw(PRETRAIN), "gang.features", ["gpu-sim"]))
    assert isinstance(spec, WorkloadSpec)
    assert spec.class_ == "pretrain" and spec.gang.features == ["gpu-sim"]
    assert spec.run.code_version is None and spec.config["max_steps"] == 600


# ------------------------------------------------------------------------------------------ CLI

runner = CliRunner()


def test_cli_policy_check_ok():
    result = runner.invoke(app, ["policy", "check", str(DEFAULT), str(LOCAL)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"OK {DEFAULT}: 7 classes, 4 teams")


def test_cli_policy_check_prints_every_error():
    result = runner.invoke(app, ["policy", "check", str(BAD_POLICY)])
    assert result.exit_code == 1
    for path, value, allowed in errors_of(load_policy, BAD_POLICY):
        assert f"{path}: got {value!r}; {allowed}" in result.stderr


def test_cli_spec_check_ok_against_policy():
    files = [str(p) for p in sorted(SPECS.glob("*.yaml"))]
    result = runner.invoke(app, ["spec", "check", *files, "--policy", str(LOCAL)])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("OK ") == len(files)
    assert "pretrain-tiny-lm (train, class pretrain, team team-a): 2 x (2 GPU, 1 CPU, 1 GiB)" in result.stdout


def test_cli_submit_refuses_a_bare_reservation_of_a_pipeline_before_connecting():
    pipeline = ROOT / "examples" / "pipelines" / "worked-example.yaml"
    result = runner.invoke(app, ["submit", str(pipeline), "--reserve-only"])
    assert result.exit_code == 1, result.output
    assert "--reserve-only: got True; not for kind: pipeline" in result.stderr


def test_cli_spec_check_without_policy_says_so():
    result = runner.invoke(app, ["spec", "check", str(PRETRAIN)])
    assert result.exit_code == 0 and "pass --policy" in result.stdout


def test_cli_spec_check_prints_every_error():
    result = runner.invoke(app, ["spec", "check", str(BAD_SPEC), "--policy", str(LOCAL)])
    assert result.exit_code == 1
    assert f"{BAD_SPEC}: 9 error(s)" in result.stderr
    for path in ["name", "kind", "gang.workers", "gang.resources.memory", "run.intent", "gang.features[0]"]:
        assert f"  {path}: got " in result.stderr


def test_cli_missing_files_and_bad_policy_exit_1(tmp_path):
    result = runner.invoke(app, ["spec", "check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 1 and "not found" in result.stderr
    result = runner.invoke(app, ["spec", "check", str(PRETRAIN), "--policy", str(BAD_POLICY)])
    assert result.exit_code == 1 and "scheduler.ordering: got 'shortest-first'" in result.stderr


# ------------------------------------------------------------------------------------------------ cohort trees

COHORTS = ROOT / "policies" / "cohorts.yaml"


def _tree_doc(cohorts, a="d1", b="d2"):
    """The local policy with ``cohorts`` and team-a / team-b under cohorts ``a`` / ``b`` (None: under the root)."""
    doc = with_field(raw(LOCAL), "cohorts", cohorts)
    for team, c in (("team-a", a), ("team-b", b)):
        if c is not None:
            doc = with_field(doc, f"teams.{team}.cohort", c)
    return doc


TREE = {"org": {}, "d1": {"parent": "org"}, "d2": {"parent": "org"}}

COHORT_CASES = [
    ("unknown cohort", _tree_doc(TREE, a="research"), "teams.team-a.cohort", "research",
     "a cohort of the policy: one of org, d1, d2"),
    ("unknown parent", _tree_doc({**TREE, "d2": {"parent": "orgg"}}), "cohorts.d2.parent", "orgg",
     "a cohort of the policy: one of org, d1, d2 (or omit it: a top-level cohort)"),
    ("cycle", _tree_doc({"org": {"parent": "d2"}, "d1": {"parent": "org"}, "d2": {"parent": "org"}}),
     "cohorts.org.parent", "d2", "(org > d2 > org is a cycle)"),
    ("own parent", _tree_doc({**TREE, "d1": {"parent": "d1"}}), "cohorts.d1.parent", "d1",
     "a parent that does not lead back to d1 (d1 > d1 is a cycle)"),
    ("named like a team", _tree_doc({**TREE, "team-b": {"parent": "org"}}, b="team-b"), "cohorts.team-b", "team-b",
     "a name no team has (team team-b exists)"),
    ("no team under it", _tree_doc({**TREE, "d3": {"parent": "org"}}), "cohorts.d3", "d3",
     "a cohort with at least one team under it"),
    ("lends more than it has", _tree_doc({**TREE, "d1": {"parent": "org", "quotas": {
        "gpu": {"nominal": 1, "lending_limit": 4}}}}), "cohorts.d1.quotas.gpu.lending_limit", 4,
     "a number from 0 to 3 (what cohort d1 can lend: its own nominal 1 plus what its members lend, 2)"),
    ("cohort quota typo", _tree_doc({**TREE, "d1": {"parent": "org", "quotas": {"gpu": {"nominal": 1, "lend": 1}}}}),
     "cohorts.d1.quotas.gpu.lend", 1, "allowed fields: nominal, borrowing_limit, lending_limit"),
    ("cohort weight", _tree_doc({**TREE, "d1": {"parent": "org", "weight": 0}}), "cohorts.d1.weight", 0,
     "a number > 0"),
]


@pytest.mark.parametrize("doc, path, bad, allowed", [c[1:] for c in COHORT_CASES], ids=[c[0] for c in COHORT_CASES])
def test_cohort_tree_errors_name_the_field(doc, path, bad, allowed):
    assert_has_error(errors_of(load_policy_from_dict, doc, "local"), path, bad, allowed)


def test_every_cohort_error_at_once():
    doc = _tree_doc({"org": {"parent": "nowhere"}, "d1": {"parent": "d1"}, "d2": {"parent": "org"}}, a="zz")
    paths = [e[0] for e in errors_of(load_policy_from_dict, doc)]
    assert paths == ["teams.team-a.cohort", "cohorts.org.parent", "cohorts.d1.parent"]


def test_cohort_policy_file_passes_check_and_builds_the_tree():
    result = runner.invoke(app, ["policy", "check", str(COHORTS)])
    assert result.exit_code == 0, result.output
    teams = load_policy(COHORTS).core_teams()
    nlp, ads = teams["nlp"], teams["ads"]
    assert nlp.cohort.name == "research" and nlp.cohort.parent.name == "org" and nlp.cohort.parent.parent is None
    assert nlp.cohort.parent is ads.cohort.parent  # one org, shared
    assert nlp.cohort.quotas["gpu"] == Quota(0, 8, 16) and ads.cohort.weight == 2


def test_a_flat_policy_has_no_cohorts():
    assert all(t.cohort is None for t in load_policy(LOCAL).core_teams().values())
