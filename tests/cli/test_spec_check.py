"""``raylane spec check`` (and ``raylane submit``'s checks before submitting): every check submission runs, and for
any file, however broken, an error naming the field or the line and column, never a traceback.

Pure: no Ray is started (``raylane submit`` is refused before it connects). The CLI runs in-process through typer's
``CliRunner``. User code is a small module written into a temporary folder per test (``--working-dir``), under a
name of its own so that no test sees another's module. The fuzz test mutates the repository's specs with a fixed
seed; a failure prints the mutation and the output, enough to reproduce it by hand.
"""
from __future__ import annotations

import functools
import importlib
import json
import math
import random
import re
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from raylane.cli import cluster
from raylane.cli import app
from raylane.config import loader

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "policies" / "local.yaml"
SPECS = sorted((ROOT / "examples" / "specs").glob("*.yaml")) + sorted((ROOT / "examples").glob("*/**/spec.yaml"))
PRETRAIN = ROOT / "examples" / "specs" / "pretrain-team-a.yaml"
LM_ENTRYPOINT = "workloads.ray_train:train_loop_per_worker"

runner = CliRunner()

# One error line of a ValidationError as print_error shows it: "  PATH: got VALUE; ALLOWED".
ERROR_LINE = re.compile(r"^  (?P<path>.+?): got (?P<rest>.*)$")
HEADER = re.compile(r"^(?P<source>.+): (?P<n>\d+) error\(s\)$")


def check(*args: str):
    return runner.invoke(app, ["spec", "check", *map(str, args)])


def problems(result) -> list[str]:
    """Why ``result`` is not the outcome of a check a user may see: exit 0 or 1, no traceback, and on exit 1 every
    error line naming a field path or a line and column."""
    out: list[str] = []
    if result.exit_code not in (0, 1):
        out.append(f"exit code {result.exit_code}")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        out.append(f"raised {type(result.exception).__name__}: {result.exception}")
    if "Traceback" in result.output:
        out.append("a traceback in the output")
    if result.exit_code == 1:
        lines = result.stderr.splitlines()
        head = HEADER.match(lines[0]) if lines else None
        if head is None:
            out.append(f"no 'FILE: N error(s)' header: {lines[:1]}")
            return out
        errors = [ERROR_LINE.match(line) for line in lines[1:]]
        if len(errors) != int(head["n"]) or not all(errors):
            out.append(f"{head['n']} error(s) announced, lines: {lines[1:]}")
        for m in filter(None, errors):
            if m["path"].strip() in ("", "(yaml)"):
                out.append(f"an error with no field path or position: {m.group(0)}")
    return out


def assert_clean(result):
    assert not problems(result), f"{problems(result)}\n--- output:\n{result.output}"


def error_lines(result) -> dict[str, str]:
    """{path: rest of the line} of the errors ``result`` printed."""
    return {m["path"]: m["rest"] for m in map(ERROR_LINE.match, result.stderr.splitlines()[1:]) if m}


def spec_doc(**changes) -> dict:
    """The pretrain example as a dict, with top-level ``changes`` (None deletes a key)."""
    doc = yaml.safe_load(PRETRAIN.read_text())
    for key, value in changes.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def write(tmp_path: Path, content, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content, encoding="utf-8")
    else:
        p.write_text(yaml.safe_dump(content, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------- reading


DEEP_FLOW = "name: x\nconfig: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_MAP = "name: x\nconfig: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"
LAUGHS = "\n".join(["name: x", "config:", "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
                   + [f"  {c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi")]) + "\n"

READING = [
    # (name, file content, the path or position the error names, a phrase of what is allowed)
    ("binary garbage", bytes(random.Random(7).randrange(256) for _ in range(4096)), r"byte \d+", "UTF-8 text"),
    ("UTF-16", "name: x\n".encode("utf-16"), "byte 0", "UTF-8 text"),
    ("NUL byte", b"name: x\nteam: a\x00b\n", "line 2, column 8", "printable text"),
    ("control character", b"name: x\x1b[31m\n", "line 1, column 8", "printable text"),
    ("5,000-deep lists", DEEP_FLOW, "line 2, column 72", "at most 64 levels"),
    ("5,000-deep mappings", DEEP_MAP, "line 2, column 261", "at most 64 levels"),
    ("200-deep block mappings", "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n",
     "line 65, column 65", "at most 64 levels"),
    ("billion laughs", LAUGHS, "line 7, column 6", "at most 100,000 values with aliases expanded"),
    ("an alias inside itself", "name: x\nconfig: &c {a: *c}\n", "line 2, column 9", "does not contain itself"),
    ("a merge of itself", "name: x\nconfig: &c {<<: *c}\n", "line 2, column 9", "does not contain itself"),
    ("undefined alias", "name: x\nconfig: *nope\n", "line 2, column 9", "found undefined alias"),
    ("scanner error", "name: x\nteam: 'unterminated\n", "line 3, column 1", "valid YAML"),
    ("parser error", "name: x\n  team: y\n", "line 2, column 7", "valid YAML"),
    ("a tab as indentation", "name: x\ngang:\n\tworkers: 1\n", "line 3, column 1", "valid YAML"),
    ("several documents", "name: x\n---\nname: y\n", "line 2, column 1", "a single document"),
    ("an integer of 5,000 digits", "name: x\nconfig: {steps: " + "9" * 5000 + "}\n", "line 2, column 17",
     "cannot read"),
    ("an integer beyond a float", "runtime_estimate: " + "9" * 400 + "\n", "line 1, column 19",
     "a number from -1.798e+308 to 1.798e+308"),
    ("an impossible date", "name: x\nconfig: {day: 2024-13-45}\n", "config.day", "a date or time"),
    ("a date", "name: x\nconfig: {day: 2024-01-05}\n", "config.day", "quote it"),
    ("binary", "name: x\nconfig: {blob: !!binary aGVsbG8=}\n", "config.blob", "binary data"),
    ("a set", "name: x\nconfig: {s: !!set {a, b}}\n", "config.s", "write a list"),
    ("a Python tag", "name: !!python/object/apply:os.system [echo hi]\n", "line 1, column 7", "valid YAML"),
    ("an integer key", "name: x\nconfig: {1: one}\n", "config", "reads as an integer"),
    ("a yes key", "name: x\nconfig: {yes: 1}\n", "config", "reads as true or false"),
    ("a null key", "name: x\n~: 1\n", r"\(top level\)", "reads as null"),
    ("a list key", "name: x\n? [a, b]\n: 1\n", r"\(top level\)", "reads as a list"),
    ("a duplicate key", "name: x\nname: y\n", "line 2, column 1", "each key once per mapping"),
    ("not a mapping", "- a\n- b\n", r"\(top level\)", "a mapping with fields"),
    ("empty", "", r"\(top level\)", "a mapping with fields"),
    ("huge", "name: x\nconfig: {a: '" + "x" * (2 << 20) + "'}\n", r"\(file\)", "at most 1,048,576 bytes"),
    ("gang.workers .nan", "gang: {workers: .nan}\n", "gang.workers", "an integer"),
    ("gang.workers .inf", "gang: {workers: .inf}\n", "gang.workers", "an integer"),
    ("runtime_estimate .inf", "runtime_estimate: .inf\n", "runtime_estimate", "duration"),
    ("gang.resources.gpu .nan", "gang: {resources: {gpu: .nan}}\n", "gang.resources.gpu", "number"),
    ("gang.resources.cpu -.inf", "gang: {resources: {cpu: -.inf}}\n", "gang.resources.cpu", "number"),
]


@pytest.mark.parametrize("content, where, allowed", [c[1:] for c in READING], ids=[c[0] for c in READING])
def test_every_reading_problem_is_an_error_naming_where(tmp_path, content, where, allowed):
    result = check(write(tmp_path, content))
    assert_clean(result)
    assert result.exit_code == 1
    errors = error_lines(result)
    hits = {p: rest for p, rest in errors.items() if re.fullmatch(where, p)}
    assert hits, f"no error at {where!r}:\n{result.stderr}"
    assert any(allowed in rest for rest in hits.values()), result.stderr


def test_deep_nesting_names_the_path_down_to_the_level_refused(tmp_path):
    result = check(write(tmp_path, DEEP_FLOW))
    assert_clean(result)
    assert error_lines(result) == {"line 2, column 72": "'config" + "[0]" * 63 + "'; at most 64 levels of nested "
                                                        "mappings and lists"}, result.stderr


def test_nesting_up_to_the_limit_is_read(tmp_path):
    doc = spec_doc(entrypoint="some.module:fn")
    nested: object = 1
    for _ in range(loader.MAX_DEPTH - 2):  # config and the top-level mapping are 2 of the levels
        nested = [nested]
    doc["config"] = {"deep": nested}
    result = check(write(tmp_path, doc), "--no-code")
    assert result.exit_code == 0, result.output


def test_a_long_value_is_shortened_in_the_message(tmp_path):
    result = check(write(tmp_path, spec_doc(name="n" * 100_000)))
    assert_clean(result)
    assert result.exit_code == 1 and "(100,002 characters)" in result.stderr
    assert len(result.stderr) < 2000


# -------------------------------------------------------------------------------------------- user code


@pytest.fixture
def project(tmp_path):
    """A user's project folder holding one module under a fresh name; returns (folder, module name)."""
    name = "userproj_" + uuid.uuid4().hex[:10]
    folder = tmp_path / "project"
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("")
    (folder / name / "train.py").write_text(textwrap.dedent('''
        import math
        from typing import Optional

        import pydantic


        class ModelConfig(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(extra="forbid", strict=True)
            n_layers: int = pydantic.Field(default=2, ge=1, le=64)


        class Config(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
            max_steps: int = pydantic.Field(default=100, ge=1)
            lr: float = pydantic.Field(default=1e-3, gt=0, le=1)
            checkpoint_every: int = pydantic.Field(default=10, ge=1)
            model: ModelConfig = ModelConfig()
            init_from: Optional[str] = None


        def train_loop(config):
            return None


        train_loop.config_schema = Config


        def no_schema(config):
            return None


        def evaluate(config):
            return {"loss": 1.0}


        def two_args(config, other):
            return None


        not_a_function = 3
        '''))
    (folder / name / "broken.py").write_text("import definitely_not_installed_xyz\n")
    (folder / name / "exits.py").write_text("import sys\nsys.exit(3)\n")
    importlib.invalidate_caches()
    yield folder, name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def user_spec(tmp_path, entrypoint, config=None, **changes):
    doc = spec_doc(entrypoint=entrypoint, config=config if config is not None else {"max_steps": 5}, **changes)
    return write(tmp_path, doc, f"spec-{uuid.uuid4().hex[:6]}.yaml")


def test_a_good_entrypoint_passes_and_is_named(tmp_path, project):
    folder, name = project
    result = check(user_spec(tmp_path, f"{name}.train:train_loop"), "--working-dir", folder, "--policy", LOCAL)
    assert result.exit_code == 0, result.output
    assert f"runs {name}.train:train_loop; checked against" in result.stdout


CODE_CASES = [
    # (name, entrypoint or None, spec changes, the path the error names, phrases of the message)
    ("missing module", "{m}.nope:train_loop", {}, "entrypoint", ["module '{m}.nope' not found", "--working-dir"]),
    ("missing function", "{m}.train:trian_loop", {}, "entrypoint", ["has no 'trian_loop'", "train_loop"]),
    ("wrong signature", "{m}.train:two_args", {}, "entrypoint", ["needs 2 arguments", "train_loop_per_worker"]),
    ("not a function", "{m}.train:not_a_function", {}, "entrypoint", ["is not a function"]),
    ("import fails", "{m}.broken:fn", {}, "entrypoint", ["needs module 'definitely_not_installed_xyz'"]),
    ("import exits", "{m}.exits:fn", {}, "entrypoint", ["SystemExit"]),
    ("not module:function", "{m}.train", {}, "entrypoint", ["'package.module:function'"]),
    ("no entrypoint", None, {}, "entrypoint", ["required for kind train"]),
    ("command for train", None, {"command": ["python", "x.py"]}, "command", ["only for one-shot kinds"]),
    ("entrypoint for serve", "{m}.train:train_loop", {"kind": "serve"}, "entrypoint", []),
]


@pytest.mark.parametrize("entrypoint, changes, path, phrases", [c[1:] for c in CODE_CASES],
                         ids=[c[0] for c in CODE_CASES])
def test_code_errors_name_the_entrypoint(tmp_path, project, entrypoint, changes, path, phrases):
    folder, name = project
    ep = entrypoint.format(m=name) if entrypoint else None
    doc = spec_doc(entrypoint=ep, config={"max_steps": 5}, **changes)
    result = check(write(tmp_path, doc), "--working-dir", folder)
    assert_clean(result)
    assert result.exit_code == 1, result.output
    errors = error_lines(result)
    assert path in errors, result.stderr
    if ep and path == "entrypoint":
        assert errors[path].startswith(repr(ep)), errors[path]
    for phrase in phrases:
        assert phrase.format(m=name) in errors[path], errors[path]


SCHEMA_CASES = [
    # (config, the path, the value shown): the issue's four, on a schema of the user's own
    ({"max_steps": "日本語"}, "config.max_steps", "'日本語'"),
    ({"model": {"n_layers": -1}}, "config.model.n_layers", "-1"),
    ({"lr": 1e18}, "config.lr", "1e+18"),
    ({"checkpoint_every": float("nan")}, "config.checkpoint_every", "nan"),
    ({"lr": float("inf")}, "config.lr", "inf"),
    ({"max_step": 5}, "config.max_step", "5"),
]


@pytest.mark.parametrize("config, path, value", SCHEMA_CASES, ids=[c[1] for c in SCHEMA_CASES])
def test_config_is_checked_against_the_declared_schema(tmp_path, project, config, path, value):
    folder, name = project
    result = check(user_spec(tmp_path, f"{name}.train:train_loop", config), "--working-dir", folder)
    assert_clean(result)
    assert result.exit_code == 1
    assert error_lines(result).get(path, "").startswith(value), result.stderr


def test_all_schema_errors_at_once_with_the_spec_errors(tmp_path, project):
    folder, name = project
    p = user_spec(tmp_path, f"{name}.train:train_loop", {"max_steps": 0, "lr": -1}, name="Bad_Name")
    result = check(p, "--working-dir", folder)
    assert set(error_lines(result)) == {"name", "config.max_steps", "config.lr"}, result.stderr


def test_without_a_schema_any_config_passes(tmp_path, project):
    folder, name = project
    result = check(user_spec(tmp_path, f"{name}.train:no_schema", {"anything": [1, "two"]}), "--working-dir", folder)
    assert result.exit_code == 0, result.output


def test_no_code_checks_only_the_form(tmp_path, project):
    folder, name = project
    missing = user_spec(tmp_path, "nobody_has.this_module:fn", {"max_steps": "日本語"})
    result = check(missing, "--no-code")
    assert result.exit_code == 0, result.output
    assert "(code not imported: --no-code)" in result.stdout
    assert "nobody_has" not in sys.modules
    result = check(user_spec(tmp_path, "not a reference"), "--no-code")
    assert result.exit_code == 1 and "entrypoint" in error_lines(result)


def test_the_working_dir_defaults_to_the_current_directory(tmp_path, project, monkeypatch):
    folder, name = project
    p = user_spec(tmp_path, f"{name}.train:train_loop")
    assert check(p).exit_code == 1
    monkeypatch.chdir(folder)
    result = check(p)
    assert result.exit_code == 0, result.output
    assert str(folder) not in sys.path


def test_a_missing_working_dir_is_an_error(tmp_path):
    result = check(PRETRAIN, "--working-dir", tmp_path / "nope")
    assert result.exit_code == 1 and "working directory" in result.stderr and "not found" in result.stderr


def test_submit_runs_the_same_checks_before_submitting(tmp_path, project, monkeypatch):
    # The code is checked in a child process while submit connects (raylane.codecheck); whatever connecting does,
    # a spec that fails its checks is reported as such and nothing is submitted.
    folder, name = project

    def no_cluster():
        raise AssertionError("submit connected to a cluster, and its spec's errors must still be shown")

    monkeypatch.setattr(cluster, "connect", no_cluster)
    monkeypatch.chdir(folder)
    for config, path in (({"lr": 1e18}, "config.lr"), ({"max_steps": 1}, None)):
        bad = user_spec(tmp_path, f"{name}.train:two_args" if path is None else f"{name}.train:train_loop", config)
        result = runner.invoke(app, ["submit", str(bad)])
        assert_clean(result)
        assert result.exit_code == 1 and (path or "entrypoint") in error_lines(result), result.output
    dup = write(tmp_path, PRETRAIN.read_text() + "name: again\n", "dup.yaml")
    result = runner.invoke(app, ["submit", str(dup), "--no-code"])
    assert result.exit_code == 1 and "each key once per mapping" in result.stderr
    garbage = write(tmp_path, DEEP_FLOW, "deep.yaml")
    result = runner.invoke(app, ["submit", str(garbage)])
    assert_clean(result)
    assert result.exit_code == 1 and "at most 64 levels" in result.stderr


# --------------------------------------------------------------------------------- the built-in LM


def lm_schema_declared() -> bool:
    try:
        from raylane import entrypoints

        return entrypoints.config_schema(entrypoints.load(LM_ENTRYPOINT, "train")) is not None
    except Exception:  # noqa: BLE001 - not declared (yet) in this checkout
        return False


LM_CASES = [
    ({"max_steps": "日本語"}, "config.max_steps", "'日本語'"),
    ({"model": {"d_model": 64, "n_layers": -1, "n_heads": 4, "context": 64}}, "config.model.n_layers", "-1"),
    ({"lr": 1e18}, "config.lr", "1e+18"),
    ({"checkpoint_every": float("nan")}, "config.checkpoint_every", "nan"),
]


@pytest.mark.parametrize("change, path, value", LM_CASES, ids=[c[1] for c in LM_CASES])
def test_the_issue_lm_configs_are_refused(tmp_path, change, path, value):
    if not lm_schema_declared():
        pytest.skip(f"{LM_ENTRYPOINT} declares no config_schema in this checkout")
    doc = spec_doc(entrypoint=LM_ENTRYPOINT)
    doc["config"] = {**doc["config"], **change}
    result = check(write(tmp_path, doc), "--working-dir", ROOT, "--policy", LOCAL)
    assert_clean(result)
    assert result.exit_code == 1
    assert error_lines(result).get(path, "").startswith(value), result.stderr


# ------------------------------------------------------------------------------------------- fuzzing


FUZZ_CASES = 300
FUZZ_SEED = 20261123
ODD_VALUES = ["日本語", "🚀" * 3, "\u202eevil", "zero\u200bwidth", "", " ", "a\nb", "\x7f", "null", "~", "yes",
              "-1", "1e18", -1, 0, -(10 ** 30), 10 ** 30, 10 ** 400, 1e18, -1e-300, 1.5, True, False, None,
              float("nan"), float("inf"), float("-inf"), [], {}, [1, [2, [3]]], {"a": {"b": None}}, "x" * 70_000]


def _paths(doc, prefix=()):
    """Every (path, value) inside ``doc``."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value=..., delete=False):
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def _dump(doc) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10_000).encode("utf-8")


def mutate(rng: random.Random, base: bytes) -> tuple[str, bytes]:
    """One mutation of ``base`` (a spec file): (what was done, the new file)."""
    doc = yaml.safe_load(base)
    paths = [p for p, _ in _paths(doc) if p]
    in_config = [p for p in paths if p[0] == "config"]
    path = rng.choice(in_config if in_config and rng.random() < 0.5 else paths)
    where = ".".join(map(str, path))
    op = rng.choice(["value", "value", "value", "number", "delete", "rename", "wrap", "duplicate", "truncate",
                     "bytes", "garbage", "deep", "alias", "splice"])
    if op == "value":
        value = rng.choice(ODD_VALUES)
        _set(doc, path, value)
        return f"{where} = {value!r:.60}", _dump(doc)
    if op == "number":
        value = rng.choice([-1, 0, 10 ** rng.randrange(2, 40), -(10 ** rng.randrange(2, 40)), float("nan"),
                            float("inf"), -float("inf"), rng.uniform(-1e300, 1e300), 2 ** 63, -(2 ** 63) - 1])
        _set(doc, path, value)
        return f"{where} = {value!r}", _dump(doc)
    if op == "delete":
        _set(doc, path, delete=True)
        return f"delete {where}", _dump(doc)
    if op == "rename" and isinstance(path[-1], str):
        parent_path, key = path[:-1], path[-1]
        parent = doc
        for step in parent_path:
            parent = parent[step]
        new = rng.choice([key.upper(), key + "s", key[:-1], "日本語", "", "<<", "1", "true", "null", " " + key])
        parent[new] = parent.pop(key)
        return f"rename {where} to {new!r}", _dump(doc)
    if op == "wrap":
        shape = rng.choice(["list", "dict"])
        levels = rng.randrange(1, 80)
        inner = rng.choice(ODD_VALUES[:20])
        for _ in range(levels):
            inner = [inner] if shape == "list" else {"k": inner}
        _set(doc, path, inner)
        return f"{where} wrapped in {levels} {shape}s", _dump(doc)
    text = _dump(doc) if op in ("duplicate", "alias") else base
    if op == "duplicate":
        lines = text.splitlines(keepends=True)
        i = rng.randrange(len(lines))
        return f"line {i + 1} duplicated", b"".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    if op == "truncate":
        at = rng.randrange(len(text))
        return f"truncated at byte {at}", text[:at]
    if op == "bytes":
        at = rng.randrange(len(text) + 1)
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        return f"{junk!r} inserted at byte {at}", text[:at] + junk + text[at:]
    if op == "garbage":
        n = rng.choice([1, 16, 512, 4096])
        return f"{n} random bytes", bytes(rng.randrange(256) for _ in range(n))
    if op == "deep":
        depth = rng.choice([65, 300, 5000])
        opener, closer = rng.choice([("[", "]"), ("{a: ", "}")])
        if depth > 1000:  # one level a line: PyYAML's scanner is quadratic in the depth of one long line
            opener = opener.strip() + "\n"
        return f"config nested {depth} deep", text + f"\nconfig2: {opener * depth}1{closer * depth}\n".encode()
    if op == "alias":
        return "an alias bomb in config", text.replace(b"config:", b"config:\n  bomb: " + LAUGHS.split(
            "config:\n")[1].replace("\n", "\n  ").encode() + b"\n  rest:", 1)
    # splice: a piece of one place pasted at another, the way an editor mishap would
    a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    at = rng.randrange(len(text) + 1)
    return f"bytes {a}:{b} pasted at {at}", text[:at] + text[a:b] + text[at:]


@functools.lru_cache(maxsize=None)
def fuzz_cases(n: int = FUZZ_CASES, seed: int = FUZZ_SEED) -> list[tuple[str, bytes, Path]]:
    """(what was done, the file, its working directory): the repository's specs import from the repository, a
    user-code example's from its own folder."""
    rng = random.Random(seed)
    bases = [(p, p.read_bytes()) for p in SPECS]
    cases = []
    while len(cases) < n:
        path, base = rng.choice(bases)
        what, content = mutate(rng, base)
        cases.append((f"{path.relative_to(ROOT)}: {what}", content, ROOT if path.parent.name == "specs" else path.parent))
    return cases


def test_fuzzed_specs_get_an_error_naming_where_never_a_traceback(tmp_path):
    failures, outcomes = [], {0: 0, 1: 0}
    for i, (what, content, working_dir) in enumerate(fuzz_cases()):
        p = write(tmp_path, content, f"case-{i}.yaml")
        args = [p, "--working-dir", working_dir] + (["--policy", LOCAL] if i % 2 else []) + (
            ["--no-code"] if i % 3 == 0 else [])
        result = check(*args)
        bad = problems(result)
        if result.exit_code == 0:
            # An accepted spec is one `raylane submit` can send: it reads back as JSON unchanged.
            data = yaml.safe_load(content)
            try:
                sent = json.loads(json.dumps(data))
                if sent != data and not _has_nan(data):
                    bad.append("changes when sent as JSON")
            except (TypeError, ValueError) as exc:
                bad.append(f"accepted but not JSON: {exc}")
        if bad:
            failures.append(f"case {i} ({what}): {bad}\n{result.output[-1500:]}")
        outcomes[result.exit_code] = outcomes.get(result.exit_code, 0) + 1
        p.unlink()
    assert not failures, f"{len(failures)} of {FUZZ_CASES} cases:\n" + "\n\n".join(failures[:5])
    # The mutations reach both outcomes; a fuzzer whose every case is refused at the first byte tests little.
    assert outcomes[0] >= FUZZ_CASES // 20 and outcomes[1] >= FUZZ_CASES // 2, outcomes


def _has_nan(value) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


def test_the_fuzz_cases_are_the_same_every_run():
    assert fuzz_cases(20) == fuzz_cases.__wrapped__(20)
    assert len({content for _, content, _ in fuzz_cases()}) > FUZZ_CASES * 0.9


# ------------------------------------------------------------------------ what each kind's launcher checks


def _example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / "specs" / name).read_text())


@pytest.mark.parametrize("name,change,path,why", [
    ("sweep-asha-team-a.yaml", lambda d: d["sweep"].update(trainable="tests.sweep_fns:no_such_fn"),
     "sweep.trainable", "an importable function"),
    ("sweep-asha-team-a.yaml", lambda d: d["sweep"].update(metric="accuracy"), "sweep.metric", "one of step, loss"),
    ("serve-team-b.yaml", lambda d: d["serve"]["model"].update(deployment="nowhere_pkg:Server"),
     "serve.model.deployment", "not found"),
    ("serve-team-b.yaml", lambda d: d["serve"]["model"]["args"].update(bogus=1), "serve.model.args.bogus", ""),
    ("eval-team-a.yaml", lambda d: d["config"].update(checkpoint=42), "config.checkpoint", ""),
    ("pretrain-team-a.yaml", lambda d: d["config"].update(fault={"crash_at_step": 0}), "config.fault.crash_at_step",
     "an integer >= 1"),
])
def test_spec_check_runs_the_checks_of_the_kinds_launcher(tmp_path, name, change, path, why):
    doc = _example(name)
    assert_clean(check(write(tmp_path, doc), "--policy", LOCAL))
    change(doc)
    result = check(write(tmp_path, doc), "--policy", LOCAL, "--working-dir", ROOT)
    assert_clean(result)
    assert result.exit_code == 1 and path in error_lines(result), result.output
    assert why in error_lines(result)[path], result.output


def test_a_bound_reads_the_same_whichever_equal_type_python_made_first():
    # typing caches Annotated types by equality: Annotated[float, Gt(0)] made first is handed back for Gt(0.0)
    # (seen: the same check read "> 0" in one test process and "> 0.0" in another, by the order tests ran in).
    import typing

    import annotated_types

    first = loader._describe(typing.Annotated[float, annotated_types.Gt(0), annotated_types.Le(1)])
    again = loader._describe(typing.Annotated[float, annotated_types.Gt(0.0), annotated_types.Le(1.0)])
    fresh = loader._describe(typing.Annotated[float, annotated_types.Gt(0.0), annotated_types.Le(1.5)])
    assert first == again == "a number > 0 <= 1"
    assert fresh == "a number > 0 <= 1.5"
