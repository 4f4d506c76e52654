"""Test-wide settings and the clean-up check.

Ray reads the settings at import, so they are set before anything imports Ray. No test sees the developer's own
Raylane credential (``RAYLANE_TOKEN`` is unset, ``RAYLANE_CREDENTIALS`` names a file of the session's own).

Every process this pytest session starts inherits ``RAYLANE_PYTEST_SESSION`` (Ray's head, raylets, dashboard and
agents, workers and job drivers included). After each test module the check below waits a little for what the
module stopped to exit, then fails the module if a process of this session is still alive, or if a module with no
``ray``-marked test left a Ray session initialized (a pure test must never start Ray). What it finds is killed, so
one module's leak does not break the next.
"""
import os
import signal
import time
import uuid

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TQDM_DISABLE", "1")
# No warm code checker outlives a test (raylane.codecheck); tests/launchers/test_codecheck.py starts its own.
os.environ.setdefault("RAYLANE_CODECHECK_SERVER", "0")
# A developer's own Raylane token never reaches a test (nor the clusters and drivers tests start): tests pass the
# tokens they mean to use. The credentials file is the session's own (``_session_credentials``).
os.environ.pop("RAYLANE_TOKEN", None)
SESSION_KEY = "RAYLANE_PYTEST_SESSION"
os.environ[SESSION_KEY] = uuid.uuid4().hex

import pytest

LEFTOVER_GRACE_S = 20.0


# The Ray modules that take longest, longest first (seconds each, alone on a 2-core machine, when last measured:
# 275, 196, 161, 156, 153, 136, 134, 121, 104, ~100, 94, 88, 68, 47, 46, 38, 36): each test target starts them first, so
# that the pure modules fill the gaps at the end. A module not named here comes after them, by ``_module_weight``.
LONGEST_FIRST = ("test_train_e2e", "test_readme_e2e", "test_frameworks_e2e", "test_ray_examples_e2e", "test_sweeps",
                 "test_user_loop_e2e", "test_elastic_e2e", "test_nodes_e2e", "test_oneshot", "test_fake_autoscaler",
                 "test_serving", "test_pipeline_e2e", "test_datasets_e2e", "test_sim_fidelity", "test_security_e2e",
                 "test_console_browser", "test_control")


def _module_weight(item) -> tuple:
    module = getattr(item, "module", None)
    name = module.__name__.rpartition(".")[2] if module is not None else ""
    if name in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(name))
    return (1 if item.get_closest_marker("slow") else 2 if item.get_closest_marker("ray") else 3, 0)


def pytest_configure(config):
    # pytest-xdist (3.x) hands out ``--dist loadfile`` modules by their number of tests, most first, unless told to
    # keep the collection's order: the pure modules of hundreds of tests would go first and the few-test Ray modules
    # that take minutes would start last.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    """The longest Ray modules first (``LONGEST_FIRST``), then the other modules that start Ray Train gangs, then
    the other Ray modules, then the pure ones (each module's tests in their own order): `make test` hands whole
    modules to its workers (pytest-xdist, ``--dist loadfile``) in this order, so the longest run while the short
    ones fill the gaps, and no long module starts last. A module goes where its heaviest test puts it, whole: one
    split in two would start its shared Ray session twice."""
    weight = {}
    for item in items:
        key = getattr(item, "module", None) or item.nodeid
        weight[key] = min(weight.get(key, (9, 0)), _module_weight(item))
    # stable: modules and tests keep their order within a weight
    items.sort(key=lambda item: weight[getattr(item, "module", None) or item.nodeid])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Lets fixtures see whether the test failed (item.rep_call), to print diagnostics such as Ray job logs.
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def session_processes() -> list:
    """(pid, command line) of every live process, other than this one, started with this session's marker."""
    from raylane.localcluster import marked_processes

    return marked_processes(SESSION_KEY, os.environ[SESSION_KEY])


def _ray_initialized() -> bool:
    import sys

    if "ray" not in sys.modules:
        return False
    import ray
    from ray.experimental import internal_kv

    return ray.is_initialized() or internal_kv._internal_kv_initialized()


def _reset_ray() -> None:
    import ray
    from ray.experimental import internal_kv

    ray.shutdown()
    internal_kv._internal_kv_reset()


@pytest.fixture(scope="module", autouse=True)
def leaves_nothing_behind(request):
    yield
    problems = []
    uses_ray = any(item.get_closest_marker("ray") for item in request.session.items
                   if item.module is request.module)
    if _ray_initialized():
        if not uses_ray:
            problems.append("a module with no `ray`-marked test initialized Ray (pure tests must not start it)")
        else:
            problems.append("Ray is still initialized after the module's fixtures were torn down")
        _reset_ray()
    deadline = time.time() + LEFTOVER_GRACE_S
    left = session_processes()
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = session_processes()
    if left:
        problems.append(f"{len(left)} process(es) it started are still alive {LEFTOVER_GRACE_S:g}s after its "
                        "teardown:\n" + "\n".join(f"  {pid}: {cmd[:200]}" for pid, cmd in left))
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if problems:
        pytest.fail(f"{request.module.__name__} left things behind: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _session_credentials(tmp_path_factory):
    """``~/.raylane/credentials`` is the developer's: the session (and every process it starts) uses a file of its
    own instead, empty until a test writes it."""
    before = os.environ.get("RAYLANE_CREDENTIALS")
    os.environ["RAYLANE_CREDENTIALS"] = str(tmp_path_factory.mktemp("raylane-home") / "credentials")
    yield
    if before is None:
        os.environ.pop("RAYLANE_CREDENTIALS", None)
    else:
        os.environ["RAYLANE_CREDENTIALS"] = before


@pytest.fixture
def uri(tmp_path) -> str:
    """A fresh MLflow sqlite store for one test (``tests.raytest.empty_store``)."""
    from tests.raytest import empty_store

    return empty_store(tmp_path / "store" / "mlflow.db")


@pytest.fixture(autouse=True)
def _job_logs_on_failure(request):
    """After a failed test of an e2e module whose ``env`` is a jobs environment (tests/jobtest.py), print the tail of
    each Ray job's logs it submitted."""
    yield
    if "env" not in request.fixturenames:
        return
    env = request.getfixturevalue("env")
    if isinstance(env, dict) and "jobs" in env and "client" in env:
        from tests.jobtest import print_job_logs_on_failure

        print_job_logs_on_failure(request, env)
