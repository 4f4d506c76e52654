"""A training spec's ``datasets:`` and ``data_config:`` (issue 26, item 4): the schema (``raylane.config.datasets``),
the submit-time checks of files and functions (``raylane.launchers.datasets.source_errors``, run by
``raylane.launchers.check`` and so by ``raylane spec check``), and what the driver hands the trainer.

Pure: no Ray is started (the conformance test imports ``ray.data`` and ``ray.train`` to read their signatures). Bad
cases are tables: each names the input, the path the error must carry, the value and a phrase of what is allowed.
The user's project is a folder written per test, its module under a name of its own.
"""
from __future__ import annotations

import inspect
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.specdoc import assert_has_error, errors_of

from raylane.config.datasets import FORMAT_OPTIONS, READERS, DatasetSource
from raylane.config.loader import load_policy, load_spec_from_dict
from raylane.errors import FatalError, ValidationError
from raylane.launchers import datasets as ld
from raylane.launchers.check import check_code, check_spec_dict, check_spec_file

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "policies" / "local.yaml"
EXAMPLE = ROOT / "examples" / "user-code" / "ray-regression"


def spec_doc(datasets=None, data_config=None, **changes) -> dict:
    doc = {"name": "reg", "team": "team-a", "class": "pretrain", "kind": "train", "entrypoint": "m:train_loop",
           "gang": {"workers": 2, "resources": {"gpu": 0, "cpu": 1}}, "run": {"intent": "a dataset test"}}
    if datasets is not None:
        doc["datasets"] = datasets
    if data_config is not None:
        doc["data_config"] = data_config
    doc.update(changes)
    return doc


@pytest.fixture
def project(tmp_path):
    """A user's project folder: ``<name>.py`` (a train loop and dataset functions), ``bad_<name>.py`` (fails at
    import) and ``data/train.csv``; returns (folder, module name)."""
    name = "dsproj_" + uuid.uuid4().hex[:10]
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.csv").write_text("x,y\n1,2\n")
    (folder / f"{name}.py").write_text(textwrap.dedent('''
        LIMIT = 3


        def train_loop(config):
            pass


        def make_valid(rows=10, *, shuffle=False):
            return {"rows": rows}


        def needs_path(path):
            return path


        def broken():
            raise RuntimeError("no data today")


        class Maker:
            pass
    '''))
    (folder / f"bad_{name}.py").write_text("raise RuntimeError('cannot import')\n")
    return folder, name


# ------------------------------------------------------------------------------------------------ good specs


def test_the_example_spec_passes_every_check_submission_runs():
    spec = check_spec_file(EXAMPLE / "spec.yaml", load_policy(LOCAL), working_dir=EXAMPLE)
    assert spec.datasets["train"].format == "parquet" and spec.datasets["validation"].path == "validation.parquet"
    assert spec.data_config.datasets_to_split == ["train"]
    # Datasets change nothing the scheduler sees: the gang is its resources alone.
    core = spec.to_core("w-1", load_policy(LOCAL), submit_time=0.0)
    assert (core.gang.workers, core.gang.per_worker.gpu, core.gang.per_worker.cpu) == (2, 0, 1)


def test_a_spec_without_datasets_has_none():
    spec = load_spec_from_dict(spec_doc())
    assert spec.datasets == {} and spec.data_config is None


def test_datasets_round_trip_as_the_user_wrote_them():
    # The control plane stores the spec as a dict (model_dump) and parses it again.
    doc = spec_doc({"train": {"format": "images", "path": ["a", "b"], "size": [32, 32], "mode": "RGB"},
                    "valid": {"function": "m:make", "kwargs": {"rows": 5}}},
                   {"datasets_to_split": ["train"], "execution_options": {"preserve_order": True,
                                                                          "resource_limits": {"cpu": 2}}})
    spec = load_spec_from_dict(doc)
    data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert load_spec_from_dict(data) == spec
    assert spec.datasets["train"].reader_options() == {"size": (32, 32), "mode": "RGB"}


# ------------------------------------------------------------------------------------------------- bad specs

FILE = {"format": "csv", "path": "data/train.csv"}
SOURCE = "required: a format (parquet, csv, json, images) with a path, or function"
BAD = [
    # (name, datasets, data_config, other changes, path, value, a phrase of what is allowed)
    ("empty source", {"train": {}}, None, {}, "datasets.train.format", None, SOURCE),
    ("unknown format", {"train": {"format": "xml", "path": "a.xml"}}, None, {}, "datasets.train.format", "xml",
     "one of parquet, csv, json, images"),
    ("format without path", {"train": {"format": "csv"}}, None, {}, "datasets.train.path", None,
     "required with format csv"),
    ("empty path", {"train": {"format": "csv", "path": " "}}, None, {}, "datasets.train.path", " ",
     "a file or folder (relative to the job's working directory"),
    ("empty path list", {"train": {"format": "csv", "path": []}}, None, {}, "datasets.train.path", [],
     "or a non-empty list of them"),
    ("format and function", {"train": {"format": "csv", "path": "a", "function": "m:f"}}, None, {},
     "datasets.train.format", "csv", "either format and path (a file source) or function"),
    ("path of a function", {"train": {"function": "m:f", "path": "a"}}, None, {}, "datasets.train.path", "a",
     "only with format"),
    ("bad function ref", {"train": {"function": "make data"}}, None, {}, "datasets.train.function", "make data",
     "'package.module:function' returning a ray.data.Dataset"),
    ("kwargs of a file", {"train": {**FILE, "kwargs": {"n": 1}}}, None, {}, "datasets.train.kwargs", {"n": 1},
     "only with function"),
    ("columns of csv", {"train": {**FILE, "columns": ["x"]}}, None, {}, "datasets.train.columns", ["x"],
     "only with format parquet"),
    ("size of a function", {"train": {"function": "m:f", "size": [8, 8]}}, None, {}, "datasets.train.size", [8, 8],
     "a function source does not take size"),
    ("bad image size", {"train": {"format": "images", "path": "i", "size": [0, 8]}}, None, {},
     "datasets.train.size", [0, 8], "[height, width]: two integers >= 1"),
    ("bad image mode", {"train": {"format": "images", "path": "i", "mode": "RGBZ"}}, None, {},
     "datasets.train.mode", "RGBZ", "one of 1, L, LA, P, RGB"),
    ("blocks zero", {"train": {**FILE, "override_num_blocks": 0}}, None, {}, "datasets.train.override_num_blocks",
     0, ">= 1"),
    ("unknown field", {"train": {**FILE, "colums": ["x"]}}, None, {}, "datasets.train.colums", ["x"],
     "did you mean columns?"),
    ("bad name", {"my train!": FILE}, None, {}, "datasets.my train!", "my train!", "a dataset name of at most 63"),
    ("not a mapping", ["train.csv"], None, {}, "datasets", ["train.csv"], "a mapping"),
    ("kind eval", {"train": FILE}, None, {"kind": "eval"}, "datasets", {"train": FILE}, "only for kind: train"),
    ("split unknown", {"train": FILE}, {"datasets_to_split": ["train", "valid"]}, {},
     "data_config.datasets_to_split[1]", "valid", "a name of datasets: train"),
    ("split twice", {"train": FILE}, {"datasets_to_split": ["train", "train"]}, {},
     "data_config.datasets_to_split[1]", "train", "each name once"),
    ("split text", {"train": FILE}, {"datasets_to_split": "train"}, {}, "data_config.datasets_to_split", "train",
     "all (every dataset is split among the workers), or a list of dataset names"),
    ("config without datasets", None, {"datasets_to_split": "all"}, {}, "data_config", {"datasets_to_split": "all"},
     "only with datasets"),
    ("negative cpu limit", {"train": FILE}, {"execution_options": {"resource_limits": {"cpu": -1}}}, {},
     "data_config.execution_options.resource_limits.cpu", -1, ">= 0"),
    ("decimal memory", {"train": FILE}, {"execution_options": {"resource_limits": {"object_store_memory": "2G"}}},
     {}, "data_config.execution_options.resource_limits.object_store_memory", "2G", "like 16Gi"),
    ("unknown knob", {"train": FILE}, {"shuffle": True}, {}, "data_config.shuffle", True,
     "allowed fields: datasets_to_split, enable_shard_locality, execution_options"),
]


@pytest.mark.parametrize("datasets, data_config, changes, path, value, allowed", [c[1:] for c in BAD],
                         ids=[c[0] for c in BAD])
def test_bad_dataset_specs_name_path_value_and_allowed(datasets, data_config, changes, path, value, allowed):
    errors = errors_of(load_spec_from_dict, spec_doc(datasets, data_config, **changes))
    assert len(errors) == 1, errors
    assert_has_error(errors, path, value, allowed)


def test_every_bad_source_of_a_file_is_reported_at_once():
    errors = errors_of(load_spec_from_dict, spec_doc({"a": {"format": "xml", "path": "x"}, "b": {"format": "csv"},
                                                      "c": {"function": "m:f", "columns": ["x"]}}))
    assert [p for p, _, _ in errors] == ["datasets.a.format", "datasets.b.path", "datasets.c.columns"]


# ------------------------------------------------------------------------------------------- submit checks

CODE = [
    # (name, datasets ({m}: the project's module), path, value, phrases of what is allowed)
    ("missing file", {"train": {"format": "csv", "path": "data/nope.csv"}}, "datasets.train.path", "data/nope.csv",
     ["an existing file or folder for ray.data.read_csv", "/data/nope.csv does not exist",
      "relative to the working directory"]),
    ("missing in a list", {"train": {"format": "csv", "path": ["data/train.csv", "data/b.csv"]}},
     "datasets.train.path[1]", "data/b.csv", ["/data/b.csv does not exist"]),
    ("missing local://", {"train": {"format": "json", "path": "local://data/x.json"}}, "datasets.train.path",
     "local://data/x.json", ["ray.data.read_json", "/data/x.json does not exist"]),
    ("missing module", {"v": {"function": "{m}_nope:make_valid"}}, "datasets.v.function", "{m}_nope:make_valid",
     ["module '{m}_nope' not found", "--working-dir"]),
    ("missing function", {"v": {"function": "{m}:make_test"}}, "datasets.v.function", "{m}:make_test",
     ["has no 'make_test'", "make_valid"]),
    ("import fails", {"v": {"function": "bad_{m}:make"}}, "datasets.v.function", "bad_{m}:make",
     ["importing 'bad_{m}' failed: RuntimeError: cannot import"]),
    ("not callable", {"v": {"function": "{m}:LIMIT"}}, "datasets.v.function", "{m}:LIMIT",
     ["a function returning a ray.data.Dataset", "it is int 3, not a function"]),
    ("a class", {"v": {"function": "{m}:Maker"}}, "datasets.v.function", "{m}:Maker",
     ["it is class Maker, not a function"]),
    ("unknown kwarg", {"v": {"function": "{m}:make_valid", "kwargs": {"row": 5}}}, "datasets.v.kwargs",
     {"row": 5}, ["the keyword arguments {m}:make_valid takes", "'row'"]),
    ("missing kwarg", {"v": {"function": "{m}:needs_path"}}, "datasets.v.kwargs", {},
     ["missing a required argument: 'path'", "called with kwargs only"]),
]


def _fill(x, m):
    if isinstance(x, str):
        return x.replace("{m}", m)
    if isinstance(x, dict):
        return {k: _fill(v, m) for k, v in x.items()}
    if isinstance(x, list):
        return [_fill(v, m) for v in x]
    return x


@pytest.mark.parametrize("datasets, path, value, phrases", [c[1:] for c in CODE], ids=[c[0] for c in CODE])
def test_submit_checks_name_the_dataset_field(project, datasets, path, value, phrases):
    folder, m = project
    doc = spec_doc(_fill(datasets, m), entrypoint=f"{m}:train_loop")
    load_spec_from_dict(doc)  # valid on its own: only the files and the code are wrong
    errors = errors_of(check_spec_dict, doc, working_dir=folder)
    assert len(errors) == 1, errors
    assert_has_error(errors, path, _fill(value, m), _fill(phrases[0], m))
    for phrase in phrases[1:]:
        assert _fill(phrase, m) in errors[0][2], errors[0]


def test_good_sources_pass_and_remote_uris_are_left_to_ray(project):
    folder, m = project
    doc = spec_doc({"train": {"format": "csv", "path": ["data/train.csv", "data"]},
                    "remote": {"format": "parquet", "path": "s3://bucket/never/checked.parquet"},
                    "valid": {"function": f"{m}:make_valid", "kwargs": {"rows": 4, "shuffle": True}}},
                   {"datasets_to_split": ["train"]}, entrypoint=f"{m}:train_loop")
    spec = check_spec_dict(doc, working_dir=folder)
    assert set(spec.datasets) == {"train", "remote", "valid"}


def test_the_code_and_the_datasets_are_reported_together(project):
    folder, m = project
    doc = spec_doc({"train": {"format": "csv", "path": "nope.csv"}, "v": {"function": f"{m}:nope"}},
                   entrypoint=f"{m}:no_loop")
    errors = errors_of(check_spec_dict, doc, working_dir=folder)
    assert [p for p, _, _ in errors] == ["entrypoint", "datasets.train.path", "datasets.v.function"]
    # The driver's own check (raylane.run) raises the same three at once.
    with pytest.raises(ValidationError) as info:
        check_code(doc, working_dir=str(folder))
    assert [p for p, _, _ in info.value.errors] == ["entrypoint", "datasets.train.path", "datasets.v.function"]


def test_without_the_users_project_only_the_form_is_checked(project):
    folder, m = project
    doc = spec_doc({"train": {"format": "csv", "path": "nope.csv"}, "v": {"function": "elsewhere:make"}},
                   entrypoint=f"{m}:train_loop")
    assert check_spec_dict(doc, working_dir=folder, load_code=False).datasets["v"].function


RESOLVE = [
    # (path as written, what Ray Data gets, the local file checked (None: not checked)); wd is /w
    ("data/a.csv", "/w/data/a.csv", "/w/data/a.csv"),
    ("/abs/a.csv", "/abs/a.csv", "/abs/a.csv"),
    ("../up/a.csv", "/up/a.csv", "/up/a.csv"),
    ("local://data/a.csv", "local:///w/data/a.csv", "/w/data/a.csv"),
    ("file:///abs/a.csv", "/abs/a.csv", "/abs/a.csv"),
    ("s3://bucket/a.csv", "s3://bucket/a.csv", None),
    ("gs://bucket/dir", "gs://bucket/dir", None),
]


@pytest.mark.parametrize("path, given, checked", RESOLVE, ids=[r[0] for r in RESOLVE])
def test_paths_resolve_against_the_working_dir(path, given, checked):
    assert ld.resolve_path(path, "/w") == (given, checked)


# ------------------------------------------------------------------------------------- what the driver builds


def test_no_datasets_build_nothing():
    assert ld.build(spec_doc()) is None


@pytest.mark.parametrize("function, phrase", [("broken", "raised RuntimeError: no data today"),
                                              ("make_valid", "returned dict, not a ray.data.Dataset")])
def test_a_function_that_fails_or_returns_no_dataset_is_named(project, function, phrase):
    folder, m = project
    with pytest.raises(ld.DatasetBuildError) as info:
        ld.build(spec_doc({"v": {"function": f"{m}:{function}"}}), working_dir=str(folder))
    assert isinstance(info.value, FatalError)  # the driver fails the workload at once: a retry builds the same
    assert f"datasets.v: {m}:{function} {phrase}" in str(info.value)


def test_data_config_becomes_ray_trains():
    from ray.train import DataConfig

    dc = ld._data_config({"datasets_to_split": ["train"], "enable_shard_locality": False,
                          "execution_options": {"preserve_order": True,
                                                "resource_limits": {"cpu": 2, "object_store_memory": "512Mi"}}})
    assert isinstance(dc, DataConfig)
    opts = dc._get_user_execution_options("train")
    assert (opts.preserve_order, opts.resource_limits.cpu, opts.resource_limits.object_store_memory) == \
        (True, 2, 512 * 2**20)
    assert dc._datasets_to_split == ["train"] and dc._enable_shard_locality is False
    assert ld._data_config(None) is None


def test_formats_and_options_are_what_the_installed_ray_takes():
    import ray.data
    from ray.data import ExecutionOptions, ExecutionResources
    from ray.train import DataConfig
    from ray.train.torch import TorchTrainer

    for fmt, reader in READERS.items():
        params = inspect.signature(getattr(ray.data, reader)).parameters
        for option, formats in FORMAT_OPTIONS.items():
            if fmt in formats:
                assert option in params, f"ray.data.{reader} takes no {option}"
    assert {"datasets", "dataset_config"} <= set(inspect.signature(TorchTrainer).parameters)
    assert {"datasets_to_split", "execution_options", "enable_shard_locality"} <= \
        set(inspect.signature(DataConfig).parameters)
    assert {"resource_limits", "preserve_order", "verbose_progress"} <= \
        set(inspect.signature(ExecutionOptions).parameters)
    assert {"cpu", "gpu", "memory", "object_store_memory"} <= \
        set(inspect.signature(ExecutionResources.for_limits).parameters)
    assert set(DatasetSource.model_fields) == {"function", "kwargs", "format", "path", *FORMAT_OPTIONS}
