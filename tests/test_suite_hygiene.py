"""The suite's own clean-up check (tests/conftest.py) fails a module that leaves a process or a Ray session behind.

Each case runs an inner pytest session in a subprocess with this repository's conftest and one small module.
"""
from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).with_name("conftest.py")


def run_inner(pytester, body: str):
    shutil.copy(CONFTEST, pytester.path / "conftest.py")
    pytester.makeini("[pytest]\nmarkers =\n    ray: starts Ray\n")
    pytester.makepyfile(test_inner=textwrap.dedent(body))
    return pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")


def test_a_process_left_running_fails_its_module_and_is_killed(pytester):
    res = run_inner(pytester, """
        import subprocess

        def test_starts_a_child_and_forgets_it():
            subprocess.Popen(["sleep", "300"])
    """)
    res.assert_outcomes(passed=1, errors=1)
    out = res.stdout.str()
    assert "test_inner left things behind" in out and "sleep 300" in out
    # The very process it reported was killed (other processes on the machine may well run a `sleep 300`).
    pid = int(re.search(r"(\d+): sleep 300", out).group(1))
    assert not _alive(pid)


def test_a_clean_module_passes(pytester):
    res = run_inner(pytester, """
        import subprocess

        def test_waits_for_its_child():
            subprocess.run(["true"], check=True)
    """)
    res.assert_outcomes(passed=1)


@pytest.mark.ray
def test_a_pure_module_that_starts_ray_fails(pytester):
    res = run_inner(pytester, """
        import ray

        def test_pure_but_starts_ray():
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    """)
    res.assert_outcomes(passed=1, errors=1)
    assert "a module with no `ray`-marked test initialized Ray" in res.stdout.str()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
