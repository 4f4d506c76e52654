"""raylane.codecheck: the spec's code checked in a child process (what ``raylane submit`` overlaps with connecting)
answers exactly what the same check in-process answers. No Ray."""
from pathlib import Path

import pytest

from raylane.codecheck import CodeCheck
from raylane.config.loader import load_spec_from_dict, read_yaml
from raylane.errors import FatalError, ValidationError

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ROOT / "examples" / "specs" / "pretrain-team-a.yaml"


def spec(**changes):
    data, _ = read_yaml(PRETRAIN, "spec file")
    data.update(changes)
    return data


def in_process(data):
    try:
        load_spec_from_dict(data, "spec", code=True, working_dir=str(ROOT), load_code=True)
    except ValidationError as exc:
        return exc.errors
    return None


@pytest.mark.parametrize("data", [
    spec(),
    spec(entrypoint="no_such_module_here:train"),
    spec(entrypoint="workloads.ray_train:no_such_function"),
    spec(config={"lr": 1e18}),
], ids=["good", "missing module", "missing function", "config its schema refuses"])
def test_the_child_answers_what_the_check_in_process_answers(data, monkeypatch):
    monkeypatch.chdir(ROOT)
    expected = in_process(data)
    check = CodeCheck(data, "spec", working_dir=str(ROOT))
    if expected is None:
        check.result()
        return
    with pytest.raises(ValidationError) as err:
        check.result()
    assert err.value.errors == expected and err.value.source == "spec"


def test_a_child_that_cannot_answer_is_a_fatal_error_with_its_output(monkeypatch):
    check = CodeCheck(spec(), "spec")
    check._payload = "not base64 pickle\n"  # what a broken interpreter or environment would make of it
    with pytest.raises(FatalError, match="checking the spec's code failed"):
        check.result()
