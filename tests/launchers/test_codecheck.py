"""raylane.codecheck: the spec's code checked in a child process (what ``raylane submit`` overlaps with connecting)
answers exactly what the same check in-process answers. No Ray."""
from pathlib import Path

import pytest

from raylane.codecheck import CodeCheck
from raylane.config.loader import read_yaml
from raylane.errors import FatalError, ValidationError
from raylane.launchers.check import check_spec_dict

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "examples" / "specs" / "pretrain-team-a.yaml"


def spec(**changes):
    data, _ = read_yaml(PRETRAIN, "spec file")
    data.update(changes)
    return data


def in_process(data):
    try:
        check_spec_dict(data, "spec", working_dir=str(ROOT), load_code=True)
    except ValidationError as exc:
        return exc.errors
    return None


CASES = pytest.mark.parametrize("data", [
    spec(),
    spec(entrypoint="no_such_module_here:train"),
    spec(entrypoint="workloads.ray_train:no_such_function"),
    spec(config={"lr": 1e18}),
], ids=["good", "missing module", "missing function", "config its schema refuses"])


def answers_as_in_process(check: CodeCheck, data) -> None:
    expected = in_process(data)
    if expected is None:
        check.result()
        return
    with pytest.raises(ValidationError) as err:
        check.result()
    assert err.value.errors == expected and err.value.source == "spec"


@CASES
def test_the_child_answers_what_the_check_in_process_answers(data, monkeypatch):
    monkeypatch.chdir(ROOT)
    answers_as_in_process(CodeCheck(data, "spec", working_dir=str(ROOT)), data)


def test_a_child_that_cannot_answer_is_a_fatal_error_with_its_output(monkeypatch):
    check = CodeCheck(spec(), "spec")
    check._payload = "not base64 pickle\n"  # what a broken interpreter or environment would make of it
    with pytest.raises(FatalError, match="checking the spec's code failed"):
        check.result()


# -- the warm checker ------------------------------------------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from raylane import codecheck  # noqa: E402

USER_MODULE = '''
import os
import heldlib

if os.environ.get("USERMOD_REQUIRED") != "yes":
    raise RuntimeError("USERMOD_REQUIRED is not set in this environment")


def {name}(config):
    return heldlib.VALUE
'''


def _checker_pids():
    out = subprocess.run(["pgrep", "-f", "raylane.codecheck --serve"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _wait_for_checker(timeout=120.0):
    path = codecheck._socket_path()
    deadline = time.time() + timeout
    while time.time() < deadline:
        sock = codecheck._connect(path)
        if sock is not None:
            sock.close()
            return
        time.sleep(0.2)
    log = codecheck._run_dir() / "codecheck.log"
    raise AssertionError(f"no warm checker after {timeout:g}s:\n{log.read_text() if log.exists() else ''}")


def _short_home():
    """A HOME under /tmp: the checker's socket path must fit a Unix socket's 107 bytes whatever TMPDIR the suite
    runs under (clean-clone CI nests it deep)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="rl-cc-", dir="/tmp"))


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A HOME of its own with the checker on, a library folder on PYTHONPATH (``heldlib``: what the checker holds)
    and a user's project folder (``usermod``: imported afresh by each check)."""
    import shutil

    home, lib, proj = _short_home(), tmp_path / "lib", tmp_path / "project"
    for d in (lib, proj):
        d.mkdir()
    (lib / "heldlib.py").write_text("VALUE = 1\n")
    (proj / "usermod.py").write_text(USER_MODULE.format(name="train"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAYLANE_CODECHECK_SERVER", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(lib), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("USERMOD_REQUIRED", "yes")
    monkeypatch.chdir(proj)
    before = _checker_pids()
    yield {"home": home, "lib": lib, "proj": proj}
    codecheck.stop_checker()
    deadline = time.time() + 30
    while _checker_pids() - before and time.time() < deadline:
        time.sleep(0.2)
    shutil.rmtree(home, ignore_errors=True)
    assert not _checker_pids() - before, "a warm checker outlived stop_checker()"


def check(proj, **changes):
    """(warm, errors or None) of one check of the spec with the user's entrypoint."""
    c = CodeCheck(spec(entrypoint="usermod:train", config={}, **changes), "spec", working_dir=str(proj))
    warm = c.warm
    try:
        c.result()
    except ValidationError as exc:
        return warm, exc.errors
    return warm, None


def test_the_first_check_is_cold_and_starts_a_checker_that_takes_the_next(project):
    assert check(project["proj"]) == (False, None)
    _wait_for_checker()
    assert check(project["proj"]) == (True, None)
    held = codecheck._preloaded()
    assert "heldlib" in held and "usermod" not in held  # the library is learned, the user's module never
    assert oct(codecheck._socket_path().stat().st_mode & 0o777) == "0o600"
    assert oct(codecheck._run_dir().stat().st_mode & 0o777) == "0o700"


@pytest.fixture(scope="module")
def warm_root():
    """One warm checker for the repository's own spec, learned from a cold check of it (torch and Ray Train)."""
    import shutil

    home = _short_home()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("RAYLANE_CODECHECK_SERVER", "1")
        mp.chdir(ROOT)
        first = CodeCheck(spec(), "spec", working_dir=str(ROOT))
        assert not first.warm
        first.result()
        _wait_for_checker()
        yield
        codecheck.stop_checker()
    shutil.rmtree(home, ignore_errors=True)


@CASES
def test_a_warm_check_answers_what_the_check_in_process_answers(data, warm_root):
    c = CodeCheck(data, "spec", working_dir=str(ROOT))
    assert c.warm
    answers_as_in_process(c, data)


def test_edits_to_the_users_code_are_seen_by_the_next_warm_check(project):
    check(project["proj"])
    _wait_for_checker()
    (project["proj"] / "usermod.py").write_text(USER_MODULE.format(name="renamed"))
    warm, errors = check(project["proj"])
    assert warm and errors and errors[0][0] == "entrypoint" and "train" in errors[0][2]


def test_the_checks_run_in_the_callers_environment(project, monkeypatch):
    check(project["proj"])
    _wait_for_checker()
    monkeypatch.delenv("USERMOD_REQUIRED")
    warm, errors = check(project["proj"])
    assert warm and errors and "USERMOD_REQUIRED is not set" in errors[0][2]


def test_a_users_module_shadows_a_held_library_of_its_name(project):
    check(project["proj"])
    _wait_for_checker()
    (project["proj"] / "heldlib.py").write_text("raise ImportError('the project heldlib, not the library')\n")
    warm, errors = check(project["proj"])
    assert warm and errors and "the project heldlib, not the library" in errors[0][2]


def test_a_held_library_that_changed_makes_the_checker_stale_and_the_check_cold(project):
    check(project["proj"])
    _wait_for_checker()
    first = codecheck._connect(codecheck._socket_path())
    first.close()
    time.sleep(0.01)  # a new mtime even on coarse clocks
    (project["lib"] / "heldlib.py").write_text("raise ImportError('heldlib 2.0 is broken')\n")
    c = CodeCheck(spec(entrypoint="usermod:train", config={}), "spec", working_dir=str(project["proj"]))
    assert c.warm  # the old checker took it, and answered stale: the answer is the fresh child's
    with pytest.raises(ValidationError, match="heldlib 2.0 is broken"):
        c.result()
    _wait_for_checker()  # a new checker was started, and the next check is warm again with the new library
    (project["lib"] / "heldlib.py").write_text("VALUE = 2\n")
    assert check(project["proj"])[1] is None


def test_a_library_first_seen_by_a_warm_check_is_held_from_the_next_check_on(project):
    check(project["proj"])
    _wait_for_checker()
    (project["lib"] / "newlib.py").write_text("X = 1\n")
    (project["proj"] / "usermod.py").write_text("import newlib\n" + USER_MODULE.format(name="train"))
    taught = CodeCheck(spec(entrypoint="usermod:train", config={}), "spec", working_dir=str(project["proj"]))
    taught.result()
    assert taught.warm and "newlib" in taught.imported and "heldlib" not in taught.imported
    assert "newlib" in codecheck._preloaded()
    after = CodeCheck(spec(entrypoint="usermod:train", config={}), "spec", working_dir=str(project["proj"]))
    after.result()
    assert after.warm and after.imported == []


def test_no_checker_is_used_or_started_when_it_is_off(project, monkeypatch):
    monkeypatch.setenv("RAYLANE_CODECHECK_SERVER", "0")
    assert check(project["proj"]) == (False, None)
    assert check(project["proj"]) == (False, None)
    assert not codecheck._socket_path().exists()


def test_a_home_too_deep_for_a_unix_socket_checks_cold(project, monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(deep))
    assert not codecheck.checker_enabled()
    assert check(project["proj"]) == (False, None)


def test_stop_checker_stops_one_still_starting(project):
    codecheck.start_checker()
    deadline = time.time() + 30
    lock = Path(str(codecheck._socket_path()) + ".lock")
    while not (lock.exists() and lock.read_text().strip()) and time.time() < deadline:
        time.sleep(0.02)
    pid = int(lock.read_text())
    assert codecheck.stop_checker()
    try:  # gone, or a zombie of this process (its parent) not reaped yet
        with open(f"/proc/{pid}/stat") as f:
            assert f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        pass
    assert not codecheck._socket_path().exists()
