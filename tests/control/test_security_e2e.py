"""Issue 11 on a live local cluster: a table of attacks against the control plane, each refused, changing nothing
but the audit trail; malformed calls through the real actor; a driver without a credential; and an end-to-end run
whose credentials appear in no log, journal row, MLflow record or job entry."""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from raylane.control.client import State  # noqa: E402
from raylane.errors import (AuthenticationError, NotFoundError, PermissionDeniedError,  # noqa: E402
                            ValidationError)
from raylane.jobs import submit_job as submit_ray_job, with_credential  # noqa: E402
from tests.jobtest import finished, job_env, module_env, record_of_job  # noqa: E402
from tests.raytest import REPO, spec, wait_for  # noqa: E402

pytestmark = pytest.mark.ray
DIGITS = REPO / "examples" / "user-code" / "digits-cnn"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    yield from module_env(tmp_path_factory, "security")


@pytest.fixture(scope="module")
def people(env):
    """An operator, two members of team-a, a member and a team-admin of team-b; one workload per team-a member."""
    ops = env["ctl"]

    def user(name, teams, role="member", **kw):
        return ops.as_user(ops.token_create(name, teams, role, **kw)["token"])

    p = {"ops": ops, "alice": user("alice", ["team-a"]), "carol": user("carol", ["team-a"]),
         "bob": user("bob", ["team-b"]), "bea": user("bea", ["team-b"], "team-admin")}
    # Reservations only (no driver): they hold quota and leases, which the attacks must leave alone.
    p["a_job"] = p["alice"].submit(spec("alice-pretrain", "team-a", "pretrain", workers=1, gpu=1)).id
    p["b_job"] = p["bob"].submit(spec("bob-finetune", "team-b", "finetune", workers=1, gpu=1)).id
    wait_for(lambda: all(ops.status(w).state is State.ADMITTED for w in (p["a_job"], p["b_job"])),
             what="both reservations admitted")
    return p


def _snapshot(ops):
    """What an attack must not change: every workload's state, position, owner and spec; leases; tokens."""
    rows = sorted((r.id, r["state"], r.position, r.get("owner")) for r in ops.queue(True))
    info = ops.info()
    tokens = sorted((t["id"], t["status"]) for t in ops.token_list(True))
    specs = {r.id: ops.status(r.id).get("spec") for r in ops.queue(True)}
    return rows, info["leases"], info["pending"], tokens, json.dumps(specs, sort_keys=True)


def _expired(p):
    tok = p["ops"].token_create("dave", ["team-a"], ttl_s=0.5)["token"]
    time.sleep(1.0)
    return p["ops"].as_user(tok)


def _revoked(p):
    out = p["ops"].token_create("erin", ["team-a"])
    p["ops"].token_revoke(out["id"])
    return p["ops"].as_user(out["token"])


def _rotated_out(p):
    out = p["ops"].token_create("frank", ["team-a"])
    p["ops"].token_rotate(out["id"])
    return p["ops"].as_user(out["token"])


def _forged(p):
    real = p["alice"].credential.token
    return p["ops"].as_user(real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB"))


# name, who (a key of `people` or a function making a client), what it tries, the error, words in the error.
ATTACKS = [
    ("claim another team", "bob", lambda c, p: c.submit(spec("jump", "team-a", "finetune", gpu=1)),
     PermissionDeniedError, "spec's team 'team-a' is not one of the caller's teams"),
    ("cancel another team's workload", "bob", lambda c, p: c.cancel(p["a_job"]),
     PermissionDeniedError, "not one of the caller's teams"),
    ("cancel a teammate's workload as a member", "carol", lambda c, p: c.cancel(p["a_job"]),
     PermissionDeniedError, "only its owner, a team-admin of team-a"),
    ("team-admin of another team cancels", "bea", lambda c, p: c.cancel(p["a_job"]),
     PermissionDeniedError, "not one of the caller's teams"),
    ("release another's workload", "bob", lambda c, p: c.release(p["a_job"], "finished"),
     PermissionDeniedError, "release: refused for bob"),
    ("report for another's workload", "carol", lambda c, p: c.running(p["a_job"], job_id="forged-job"),
     PermissionDeniedError, "report: refused for carol"),
    ("register workers of another's workload", "bob", lambda c, p: c.register_workers(p["a_job"], []),
     PermissionDeniedError, "report: refused for bob"),
    ("forged token", _forged, lambda c, p: c.cancel(p["a_job"]),
     AuthenticationError, "not valid (unknown or forged)"),
    ("expired token", _expired, lambda c, p: c.submit(spec("late", "team-a", "finetune", gpu=1)),
     AuthenticationError, "is expired"),
    ("revoked token", _revoked, lambda c, p: c.queue(), AuthenticationError, "is revoked"),
    ("rotated-out token", _rotated_out, lambda c, p: c.queue(), AuthenticationError, "is revoked"),
    ("missing token", lambda p: p["ops"].as_user(None), lambda c, p: c.cancel(p["a_job"]),
     AuthenticationError, "no credential"),
    ("malformed token", lambda p: p["ops"].as_user("hunter2"), lambda c, p: c.queue(),
     AuthenticationError, "malformed token"),
    ("member creates a token", "alice", lambda c, p: c.token_create("mallory", ["team-a"], "operator"),
     PermissionDeniedError, "only operators may"),
    ("member revokes a token", "bob", lambda c, p: c.token_revoke(p["alice"].credential.token_id),
     PermissionDeniedError, "only operators may"),
    ("team-admin lists tokens", "bea", lambda c, p: c.token_list(), PermissionDeniedError, "only operators may"),
    ("member reads the audit trail", "alice", lambda c, p: c.audit(), PermissionDeniedError, "only operators may"),
    ("member reloads the policy", "alice", lambda c, p: c.reload_policy({"classes": {}, "teams": {}}),
     PermissionDeniedError, "only operators may"),
    ("job token makes tokens", lambda p: p["ops"].as_user(p["alice"].job_token()), lambda c, p: c.job_token(),
     PermissionDeniedError, "a job token cannot create tokens"),
]


@pytest.mark.parametrize("name,who,attack,error,words", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_refused_changes_nothing_and_is_audited(env, people, name, who, attack, error, words):
    client = people[who] if isinstance(who, str) else who(people)
    ops = people["ops"]
    before = _snapshot(ops)
    t0 = time.time()
    with pytest.raises(error) as caught:
        attack(client, people)
    assert words in str(caught.value)
    assert client.credential is None or client.credential.token not in str(caught.value)
    after = _snapshot(ops)
    assert after == before
    audit = [r for r in ops.audit(since=t0) if r["outcome"] == "refused"]
    assert audit, f"no refusal audited for {name}"
    row = audit[-1]
    assert words[:20] in row["reason"]
    assert row["ts"] >= t0 and row["action"]
    if client.credential is not None and who not in ("missing token",):
        assert row["token_id"] in (client.credential.token_id, "malformed")


def test_other_teams_see_positions_and_reasons_only(env, people):
    bob, alice, a_job = people["bob"], people["alice"], people["a_job"]
    seen = bob.explain(a_job)
    assert seen["redacted"] and seen["state"] and "position" in seen and "reason" in seen
    for hidden in ("spec", "journal", "owner", "job_id", "pin", "checkpoints"):
        assert hidden not in seen, hidden
    row = next(r for r in bob.queue() if r.id == a_job)
    assert "owner" not in row and row["resources"]
    own = alice.explain(a_job)
    assert own["owner"] == "alice" and own["spec"]["run"]["owner"] == "alice" and own["journal"]
    # A team-admin of team-a sees its team's work in full; the spec's claimed owner was replaced.
    assert people["ops"].status(a_job)["owner"] == "alice"


def test_owner_and_team_admin_may_act(env, people):
    ops = people["ops"]
    team_admin = ops.as_user(ops.token_create("tara", ["team-a"], "team-admin")["token"])
    w = people["carol"].submit(spec("carol-small", "team-a", "finetune", gpu=1, cpu=0.1)).id
    assert team_admin.cancel(w).state is State.CANCELLED
    rows = [r for r in ops.audit(user="tara") if r["action"] == "cancel"]
    assert rows and rows[-1]["outcome"] == "ok" and rows[-1]["target"] == w


def test_malformed_calls_through_the_live_actor(env, people):
    """Bad calls straight at the actor's entry point: each refused with the field named; the actor lives on."""
    handle, token = people["ops"].handle, people["ops"].credential.token
    cases = [
        ("cancel", {"workload_id": 12}, "workload_id"), ("cancel", {}, "workload_id"),
        ("cancel", {"workload_id": "x" * 10_000}, "workload_id"), ("cancel", {"workload_id": "../etc"}, "workload_id"),
        ("release", {"workload_id": "a", "outcome": "won"}, "outcome"),
        ("release", {"workload_id": "a", "outcome": "finished", "step": 10 ** 30}, "step"),
        ("release", {"workload_id": "a", "outcome": "finished", "detail": "d" * 100_000}, "detail"),
        ("report", {"workload_id": "a", "kind": "running", "evil": 1}, "evil"),
        ("report", {"workload_id": "a", "kind": "exploded"}, "kind"),
        ("wait_admission", {"workload_id": "a", "timeout_s": 1e9}, "timeout_s"),
        ("wait_admission", {"workload_id": "a", "timeout_s": float("nan")}, "timeout_s"),
        ("submit", {"spec": "not a mapping"}, "spec"), ("submit", {"spec": {}, "job_id": ["x"]}, "job_id"),
        ("submit", {"spec": {"name": "x" * (2 << 20)}}, "spec"),
        ("queue", {"include_done": "yes"}, "include_done"), ("token_create", {"user": 5}, "user"),
        ("token_revoke", {"token_id": "not-an-id"}, "token_id"), ("audit", {"limit": -1}, "limit"),
        ("drop_tables", {}, "call"), (None, {}, "call"), ("cancel", ["a"], "args"), ("cancel", "a", "args"),
    ]
    for call, args, field in cases:
        with pytest.raises(ray.exceptions.RayTaskError) as caught:
            ray.get(handle.request.remote(token, call, args), timeout=30)
        cause = caught.value.cause
        assert isinstance(cause, ValidationError), (call, args, cause)
        assert field in str(cause), (call, field, str(cause))
    assert ray.get(handle.ping.remote(), timeout=10)
    with pytest.raises(NotFoundError):
        people["ops"].cancel("no-such-workload")


def _submit(env, client, *, token, name, steps=20):
    """digits-cnn from its project folder as a plain Ray job, with ``token`` (if any) sent as raylane submit does."""
    s = {**json.loads(json.dumps(spec_of_digits())), "name": name}
    s["config"].update(max_steps=steps, checkpoint_every=10, log_every=5)
    s["gang"] = {"workers": 1, "resources": {"gpu": 1, "cpu": 1}}
    path = env["tmp"] / f"{name}.json"
    path.write_text(json.dumps(s))
    runtime_env = with_credential({"env_vars": job_env(env), "working_dir": str(DIGITS)}, token)
    # A spec file, as tests/jobtest.py submits them (JSON is YAML): never the spec on the command line.
    job = submit_ray_job(env["client"], entrypoint=f"{sys.executable} -m raylane.run {shlex.quote(str(path))} "
                                                   f"--storage-path {env['storage']} --tracking-uri {env['uri']}",
                         runtime_env=runtime_env)
    env["jobs"].append(job)
    return job


def spec_of_digits():
    import yaml

    return yaml.safe_load((DIGITS / "spec.yaml").read_text())


def test_driver_without_credential_exits_at_once(env, people):
    from ray.job_submission import JobStatus

    t0 = time.time()
    job = _submit(env, people["ops"], token=None, name="no-credential")
    assert finished(env, job, timeout=120) == JobStatus.FAILED
    logs = env["client"].get_job_logs(job)
    assert "no credential" in logs
    assert not any(r.get("job_id") == job for r in people["ops"].queue(True))
    print(f"driver without a credential failed {time.time() - t0:.1f}s after submission")


@pytest.mark.e2e
def test_credentials_appear_nowhere_after_an_end_to_end_run(env, people):
    """alice submits digits-cnn the way `raylane submit` does (a job token in a py_modules package); then every
    log, journal row, MLflow record and job entry is searched for her token and the job token."""
    from ray.job_submission import JobStatus

    from raylane.auth import parse_token

    alice = people["alice"]
    job_token = alice.job_token(note="e2e secrecy")
    job = _submit(env, alice, token=job_token, name="secret-digits")
    assert finished(env, job, timeout=300) == JobStatus.SUCCEEDED, env["client"].get_job_logs(job)[-3000:]
    rec = record_of_job(env, job)
    assert rec.get("owner") == "alice"
    secrets_ = {"alice's token": alice.credential.token, "job token": job_token}
    # The secret is the token's third part (raylane.auth.parse_token): URL-safe base64 may itself hold "_", so
    # splitting at the last "_" would search for a tail of a few characters, found anywhere by chance.
    secrets_.update({f"{k} (secret part)": parse_token(v)[1] for k, v in list(secrets_.items())})
    assert all(len(s) == 43 for k, s in secrets_.items() if "secret part" in k)

    places = {"job logs": env["client"].get_job_logs(job),
              "job info": json.dumps(env["client"].get_job_info(job).__dict__, default=str),
              "job list": json.dumps([j.__dict__ for j in env["client"].list_jobs()], default=str)}
    roots = [Path(env["tmp"]), Path(env["cluster"].raylane_temp_dir)]
    files = 0
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for n in names:
                p = Path(dirpath) / n
                if ("raylane_job_credential" in str(p) or "py_modules_files" in str(p) or p.is_symlink()
                        or not p.is_file()):
                    continue  # the package that carries the job token to its driver, and only that
                try:
                    places[str(p)] = p.read_bytes().decode("utf-8", "replace")
                    files += 1
                except OSError:
                    continue
    assert files > 20, f"searched only {files} files"
    journal = Path(env["tmp"]) / "journal.db"
    assert str(journal) in places and oct(journal.stat().st_mode & 0o777) == "0o600"
    leaks = [(what, where) for where, text in places.items() for what, s in secrets_.items() if s in text]
    assert not leaks, leaks
    # The driver acted as alice, with the job token, and the run's MLflow record names her.
    from tests.jobtest import mlflow_run

    run = mlflow_run(env, rec.id)
    assert run.data.tags.get("raylane.owner") == "alice"
    submits = [r for r in people["ops"].audit(user="alice") if r["action"] == "submit" and r["target"] == rec.id]
    assert submits and submits[-1]["token_id"] == job_token.split("_")[1]


def test_token_commands_whoami_and_audit_from_the_cli(env, people, monkeypatch):
    """The operator's and a user's view through `raylane token ...`, `whoami` and `audit`."""
    from typer.testing import CliRunner

    from raylane.cli import app

    monkeypatch.setenv("RAY_ADDRESS", env["cluster"].address)  # this test cluster, not a `raylane up` one
    ops_tok = people["ops"].credential.token

    def raylane(args, token):
        return CliRunner().invoke(app, args, env={"RAYLANE_TOKEN": token})

    r = raylane(["token", "create", "--user", "gina", "--team", "team-b", "--role", "team-admin", "--ttl", "1d"],
                ops_tok)
    assert r.exit_code == 0, r.output
    tok = r.output.strip().splitlines()[-1]
    tid = tok.split("_")[1]
    assert tok.startswith("rlt_") and f"token {tid} for gina" in " ".join(r.output.split())
    r = raylane(["whoami"], tok)
    assert r.exit_code == 0 and "gina (team-admin; teams team-b" in r.output, r.output
    r = raylane(["token", "list"], tok)
    assert r.exit_code == 1 and "only operators may" in r.output, r.output
    r = raylane(["token", "list", "--json"], ops_tok)
    listed = {t["id"]: t for t in json.loads(r.output)}
    assert listed[tid]["user"] == "gina" and tok not in r.output and tok.split("_", 2)[2] not in r.output
    r = raylane(["audit", "--json", "--user", "gina"], ops_tok)
    rows = json.loads(r.output)
    assert [x["outcome"] for x in rows if x["action"] == "token_list"] == ["refused"]
    r = raylane(["token", "for-job", "--ttl", "1h"], tok)
    assert r.exit_code == 0, r.output
    folder = Path(r.output.strip().splitlines()[-1])
    assert folder.name == "raylane_job_credential" and oct((folder / "token").stat().st_mode & 0o777) == "0o600"
    job_client = people["ops"].as_user((folder / "token").read_text())
    assert job_client.whoami()["job"] and job_client.whoami()["user"] == "gina"
    r = raylane(["token", "revoke", tid], ops_tok)
    assert r.exit_code == 0 and "revoked" in r.output, r.output
    r = raylane(["whoami"], tok)
    assert r.exit_code == 1 and f"token {tid} of gina is revoked" in r.output, r.output
    with pytest.raises(AuthenticationError, match="parent token"):
        job_client.whoami()  # revoked with its parent
    r = raylane(["token", "create", "--user", "x", "--ttl", "soon"], ops_tok)
    assert r.exit_code == 1 and "--ttl: got 'soon'" in r.output, r.output
