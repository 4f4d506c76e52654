"""raylane.entrypoints without Ray: how a spec's code is found and checked before a workload queues."""
import sys
import textwrap

import pytest

from raylane import entrypoints as ep
from raylane.errors import ValidationError

PROJECT = {
    "proj_loops.py": '''
        import pydantic

        class Cfg(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(extra="forbid")
            steps: int = pydantic.Field(ge=1)
            lr: float = 0.1

            @pydantic.field_validator("lr")
            @classmethod
            def _small(cls, v):
                if v > 1:
                    raise ValueError("a learning rate above 1 diverges; use at most 1")
                return v

        def loop(config):
            return config

        loop.config_schema = Cfg

        def bare():
            return None

        def defaulted(config=None):
            return config

        def two(config, other):
            return None

        def evaluate(config):
            return {"acc": 1.0}

        class Predict:
            def __init__(self, config):
                self.config = config

            def __call__(self, batch):
                return batch

        class NoCall:
            pass

        def needs_keyword(config, *, token):
            return None
    ''',
    "proj_broken.py": "import not_installed_anywhere_xyz\n",
    "proj_raises.py": "raise RuntimeError('boom at import')\n",
}


@pytest.fixture
def project(tmp_path):
    for name, text in PROJECT.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    yield str(tmp_path)
    for mod in [m for m in sys.modules if m.startswith("proj_")]:
        del sys.modules[mod]


def errors(exc):
    return [(p, v, a) for p, v, a in exc.value.errors]


def spec(**kw):
    return {"kind": "train", **kw}


@pytest.mark.parametrize("value", ["nocolon", "a.b:", ":fn", "pkg.mod:fn()", "1mod:fn", 42, None])
def test_the_form_is_module_colon_function(value):
    with pytest.raises(ValidationError) as exc:
        ep.parse(value)
    assert errors(exc)[0][0] == "entrypoint" and "'package.module:function'" in errors(exc)[0][2]


@pytest.mark.parametrize("entry,why", [
    ("proj_nowhere:loop", "module 'proj_nowhere' not found"),
    ("proj_loops:nothing", "has no 'nothing'; its callables: Cfg, NoCall, Predict, bare"),
    ("proj_broken:x", "it needs module 'not_installed_anywhere_xyz', which is not installed"),
    ("proj_raises:x", "RuntimeError: boom at import"),
    ("proj_loops:two", "it needs 2 arguments; Ray Train passes at most one (config)"),
    ("proj_loops:needs_keyword", "required keyword-only argument"),
    ("proj_loops:Predict", "is not a function"),
])
def test_a_bad_train_entrypoint_is_refused_naming_it(project, entry, why):
    with pytest.raises(ValidationError) as exc:
        ep.check_spec(spec(entrypoint=entry), working_dir=project)
    (path, value, allowed), = errors(exc)
    assert (path, value) == ("entrypoint", entry) and why in allowed, allowed


def test_good_entrypoints_of_each_kind_load_from_the_working_dir(project):
    assert ep.check_spec(spec(entrypoint="proj_loops:bare"), working_dir=project).__name__ == "bare"
    assert ep.check_spec(spec(entrypoint="proj_loops:defaulted"), working_dir=project).__name__ == "defaulted"
    assert ep.check_spec({"kind": "eval", "entrypoint": "proj_loops:evaluate"}, working_dir=project)
    assert ep.check_spec({"kind": "batch", "entrypoint": "proj_loops:Predict"}, working_dir=project)
    assert project not in sys.path  # only for the duration of the check
    with pytest.raises(ValidationError, match="no __call__"):
        ep.check_spec({"kind": "batch", "entrypoint": "proj_loops:NoCall"}, working_dir=project)


def test_the_config_is_checked_against_the_declared_schema_in_its_own_words(project):
    with pytest.raises(ValidationError) as exc:
        ep.check_spec(spec(entrypoint="proj_loops:loop", config={"steps": 0, "lr": 5.0, "extra": 1,
                                                                  "fault": {"hold_at_step": 1}}),
                      working_dir=project)
    got = {p: a for p, _, a in errors(exc)}
    assert set(got) == {"config.steps", "config.lr", "config.extra"}  # fault is the platform's, not the loop's
    assert got["config.lr"] == "a learning rate above 1 diverges; use at most 1"
    # A checkpoint reference becomes a directory only at start: the schema does not see it (this one has no
    # init_from field, and still passes).
    ref = {"workload": "w", "step": 2}
    assert ep.check_spec(spec(entrypoint="proj_loops:loop", config={"steps": 3, "init_from": ref}),
                         working_dir=project).__name__ == "loop"


def test_commands_and_kinds(project):
    assert ep.check_spec({"kind": "eval", "command": ["python", "x.py"]}) is None
    cases = [
        ({"kind": "train", "command": ["python", "x.py"]}, "command", "only for one-shot kinds"),
        ({"kind": "eval", "command": []}, "command", "a non-empty list"),
        ({"kind": "eval", "command": "python x.py"}, "command", "a non-empty list"),
        ({"kind": "eval", "command": ["a"], "entrypoint": "m:f"}, "command", "either entrypoint or command"),
        ({"kind": "train"}, "entrypoint", "required for kind train"),
        ({"kind": "tune", "entrypoint": "m:f"}, "entrypoint", "only for kinds train, eval, batch"),
    ]
    for s, path, why in cases:
        with pytest.raises(ValidationError) as exc:
            ep.check_spec(s, working_dir=project)
        assert errors(exc)[0][0] == path and why in errors(exc)[0][2], (s, errors(exc))
    # Only the form, on a machine without the project.
    assert ep.check_spec(spec(entrypoint="proj_nowhere:loop"), load_code=False) is None
