"""The suite's own clean-up check (tests/conftest.py) fails a module that leaves a process or a Ray session behind.

Each case runs an inner pytest session in a subprocess with this repository's conftest and one small module.
"""
from __future__ import annotations

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
    assert not any("sleep 300" in cmd for _, cmd in _marked("sleep 300"))


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


def _marked(needle: str):
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmd:
            found.append((int(pid), cmd))
    return found
