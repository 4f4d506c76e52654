"""Issue 44's red-team findings, replayed on a live cluster (one shared by the module): each attack is refused and
leaves an audit row. From a Ray driver holding the control actor's handle: Ray's ``__ray_call__`` minting an operator
token, ``__ray_terminate__`` stopping the control plane, ``ray.kill`` stopping it for good; and a job token read from
wherever Ray keeps it, used to cancel its user's other workload and to submit again; a call whose pickled
arguments would run code in the control actor as Ray unpickles them. The gate's scope rules are
tested without Ray in tests/control/test_gate.py ("job scopes")."""
from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")

from raylane.control.api import CONTROL_NAME, NAMESPACE  # noqa: E402
from raylane.control.client import start_control, stop_control  # noqa: E402
from raylane.errors import PermissionDeniedError  # noqa: E402
from tests.raytest import local_policy, spec, start_cluster, stop_cluster, wait_for  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ops(tmp_path_factory):
    cluster = start_cluster(gpu_nodes=(("gpu-a", ["gpu-sim"]),), gpus=4, cpus=2)
    try:
        ray.init(address=cluster.address, namespace="raylane", log_to_driver=False)
        client = start_control(local_policy(), str(tmp_path_factory.mktemp("redteam") / "journal.db"), tick_s=0.2)
        yield client
    finally:
        stop_control()
        stop_cluster(cluster)


@pytest.fixture(scope="module")
def bob(ops):
    return ops.as_user(ops.token_create("bob", ["team-b"], "member")["token"])


def audit_of(ops, action):
    return [r for r in ops.audit() if r["action"] == action]


def test_ray_call_cannot_mint_an_operator_token(ops):
    handle = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)

    def mint(self):
        return self.shell.cs.gate.add_token(user="mallory", teams=[], role="operator", created_by="mallory")

    # A function defined by the caller is pickled by value: the guard refuses it before __ray_call__ is reached.
    with pytest.raises(Exception) as err:
        ray.get(handle.__ray_call__.remote(mint), timeout=60)
    assert "refused to unpickle ray.cloudpickle.cloudpickle._make_function" in str(err.value)
    assert not [t for t in ops.token_list(True) if t["user"] == "mallory"]
    row = wait_for(lambda: [r for r in audit_of(ops, "unpickle") if "_make_function" in r["reason"]],
                   what="the guard's audit row")[-1]
    assert (row["outcome"], row["target"], row["user"]) == ("refused", "@control", None)
    # A callable the guard lets through (a plain type, pickled by name) meets __ray_call__'s own refusal.
    with pytest.raises(Exception) as err:
        ray.get(handle.__ray_call__.remote(set), timeout=60)
    assert "__ray_call__: refused" in str(err.value)
    row = audit_of(ops, "__ray_call__")[-1]
    assert (row["outcome"], row["target"], row["user"]) == ("refused", "@control", None)
    assert "set" in row["reason"]


def test_ray_terminate_does_not_stop_the_control_plane(ops):
    handle = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    with pytest.raises(Exception) as err:
        ray.get(handle.__ray_terminate__.remote(), timeout=60)
    assert "__ray_terminate__: refused" in str(err.value)
    time.sleep(1.0)
    assert ops.info()["auth"] is True  # still answering, the same process
    assert audit_of(ops, "__ray_terminate__")[-1]["outcome"] == "refused"


class _Mint:
    """An argument whose unpickling would mint an operator token inside whatever process unpickles it."""

    def __reduce__(self):
        code = ("import gc; from raylane.control.gate import Gate; "
                "[g.add_token(user='mallory-pickle', teams=[], role='operator', created_by='mallory') "
                "for g in gc.get_objects() if isinstance(g, Gate)]")
        return (exec, (code,))


def test_crafted_pickled_arguments_run_nothing_in_the_control_plane(ops, bob):
    handle = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    for call in (lambda: handle.request.remote(_Mint(), "whoami", {}),          # as the credential
                 lambda: handle.request.remote(None, "status", {"x": _Mint()})):  # inside the arguments
        with pytest.raises(Exception) as err:
            ray.get(call(), timeout=60)
        assert "refused to unpickle builtins.exec" in str(err.value)
    assert not [t for t in ops.token_list(True) if t["user"] == "mallory-pickle"]
    rows = wait_for(lambda: [r for r in audit_of(ops, "unpickle") if "builtins.exec" in r["reason"]],
                    what="the refusal's audit row")
    assert all((r["outcome"], r["target"], r["user"]) == ("refused", "@control", None) for r in rows)
    assert bob.whoami()["user"] == "bob"  # plain calls still come through


def test_a_stolen_job_token_acts_on_its_own_workload_only_and_dies_with_it(ops, bob):
    job_token = bob.job_token(note="red team")
    job = ops.as_user(job_token)
    mine = job.submit(spec("bob-job", "team-b", "finetune", gpu=1)).id  # what `raylane submit` queues with it
    other = bob.submit(spec("bob-other", "team-b", "finetune", gpu=1)).id
    tid = job_token.split("_")[1]
    with pytest.raises(PermissionDeniedError, match="acts only on the workload it submitted"):
        job.cancel(other)
    with pytest.raises(PermissionDeniedError, match="submits once"):
        job.submit(spec("bob-more", "team-b", "finetune", gpu=1))
    refused = [r for r in ops.audit(user="bob") if r["token_id"] == tid and r["outcome"] == "refused"]
    assert [(r["action"], r["target"]) for r in refused][-2:] == [("cancel", other), ("submit", None)]
    assert ops.status(other).state.value in ("PENDING", "ADMITTED")
    # Its own workload ends: the token is retired (it expires a minute later), and submits nothing more meanwhile.
    job.cancel(mine)
    t = wait_for(lambda: next((x for x in ops.token_list(True) if x["id"] == tid and x["expires"]
                               and x["expires"] < time.time() + 120), None), what="job token retired")
    assert t["expires"] < time.time() + 61
    with pytest.raises(PermissionDeniedError, match="its workloads have ended"):
        job.submit(spec("bob-after", "team-b", "finetune", gpu=1))
    bob.cancel(other)


def test_a_killed_control_plane_comes_back_with_its_tokens(ops, bob):
    handle = ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
    ray.kill(handle, no_restart=True)  # what max_restarts does not cover

    def back():
        try:
            return ops.reconnect().info()
        except Exception:  # noqa: BLE001 - gone, or still starting
            return None

    wait_for(back, timeout=90, every=1.0, what="the control plane started again by its watcher")
    assert bob.reconnect().whoami()["user"] == "bob"  # the token store came back from the journal
    row = wait_for(lambda: audit_of(ops.reconnect(), "control-restart"), what="the restart's audit row")[-1]
    assert row["outcome"] == "recovered" and "watcher" in row["reason"]
