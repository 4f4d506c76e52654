"""A workload class's run limit in the policy (``max_runtime``, ``on_max_runtime``): accepted values and their core
form, refused ones named with path, value and what is allowed, and ``raylane policy check`` reporting them.

Pure: no Ray. Bad-field cases are a table, as in ``tests/config/test_config.py``.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from raylane.cli import app
from raylane.config.loader import load_policy_from_dict
from tests.specdoc import assert_has_error, errors_of, raw, with_field

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "policies" / "local.yaml"  # its sweep class checkpoints every 5 s


def sweep(**fields) -> dict:
    doc = raw(LOCAL)
    doc["classes"]["sweep"].update(fields)
    return doc


@pytest.mark.parametrize("fields, limit, action", [
    ({}, None, "requeue"),
    ({"max_runtime": "2h"}, 7200.0, "requeue"),
    ({"max_runtime": "1h30m", "on_max_runtime": "stop"}, 5400.0, "stop"),
    ({"max_runtime": 5}, 5.0, "requeue"),  # a checkpoint every 5 s: one within the limit
    ({"max_runtime": 1, "on_max_runtime": "stop", "checkpoint_every": 0}, 1.0, "stop"),  # stop needs no checkpoint
    ({"max_runtime": None, "on_max_runtime": "stop"}, None, "stop"),
])
def test_run_limits_reach_the_core_class(fields, limit, action):
    c = load_policy_from_dict(sweep(**fields)).workload_class("sweep")
    assert (c.max_runtime_s, c.on_max_runtime) == (limit, action)


LIMIT_CASES = [
    # (id, class fields, error path, error value, part of the allowed text)
    ("limit 0", {"max_runtime": 0}, "classes.sweep.max_runtime", 0, "a duration > 0, like 2h or 3d, or null"),
    ("limit negative", {"max_runtime": "-1h"}, "classes.sweep.max_runtime", "-1h", "a duration: seconds"),
    ("limit words", {"max_runtime": "two hours"}, "classes.sweep.max_runtime", "two hours", "like 90s, 10m, 2h"),
    ("action unknown", {"max_runtime": "2h", "on_max_runtime": "kill"}, "classes.sweep.on_max_runtime", "kill",
     "one of requeue, stop"),
    ("action not a string", {"on_max_runtime": True}, "classes.sweep.on_max_runtime", True, "one of requeue, stop"),
    ("requeue without checkpoints", {"max_runtime": "2h", "checkpoint_every": 0}, "classes.sweep.on_max_runtime",
     "requeue", "requeue with checkpoint_every > 0 and at most max_runtime (7200s)"),
    ("requeue with checkpoints past the limit", {"max_runtime": "1m", "checkpoint_every": "2m",
                                                 "on_max_runtime": "requeue"},
     "classes.sweep.on_max_runtime", "requeue", "(checkpoint_every is 120s)"),
    ("typo", {"max_run_time": "2h"}, "classes.sweep.max_run_time", "2h", "max_runtime, on_max_runtime"),
]


@pytest.mark.parametrize("fields, path, bad, allowed", [c[1:] for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES])
def test_run_limit_errors_name_path_value_and_allowed(fields, path, bad, allowed):
    assert_has_error(errors_of(load_policy_from_dict, sweep(**fields), "local"), path, bad, allowed)


def test_the_requeue_check_is_reported_beside_the_other_errors_of_the_file():
    doc = with_field(sweep(max_runtime="2h", checkpoint_every=0), "classes.eval.max_runtime", "soon")
    paths = [e[0] for e in errors_of(load_policy_from_dict, doc)]
    assert sorted(paths) == ["classes.eval.max_runtime", "classes.sweep.on_max_runtime"]


def test_cli_policy_check_reports_a_bad_run_limit(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(sweep(max_runtime="2h", on_max_runtime="kill")))
    result = CliRunner().invoke(app, ["policy", "check", str(path)])
    assert result.exit_code == 1
    assert "classes.sweep.on_max_runtime: got 'kill'; one of requeue, stop" in result.stderr
    path.write_text(yaml.safe_dump(sweep(max_runtime="2h", on_max_runtime="stop")))
    result = CliRunner().invoke(app, ["policy", "check", str(path)])
    assert result.exit_code == 0 and result.stdout.startswith(f"OK {path}")
