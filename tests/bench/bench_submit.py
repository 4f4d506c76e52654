"""`raylane submit` against the plain `ray job submit` line of the README, on a local cluster (`raylane up`).

Each round submits examples/specs/pretrain-team-a.yaml both ways, from the repository's folder:
- plain: ``raylane token for-job`` then ``ray job submit --no-wait --working-dir . --runtime-env-json
  {"py_modules": [TOKEN]} -- python -m raylane.run SPEC`` (the README's line, the token included);
- raylane: ``raylane submit SPEC`` (its spec checks, the user's code imported, a job token, the job; the folder
  uploaded as the job's working directory too).

`raylane submit` runs twice a round: as a user's runs (the warm checker of raylane.codecheck, which `raylane up`
started, checks the code) and with ``RAYLANE_CODECHECK_SERVER=0`` (a cold check: a fresh interpreter imports torch
and Ray Train, as on a machine where no checker is running yet). Printed per round and as medians: the command's
wall time, the time from the command's start until the workload is in the control plane's queue
(``ControlClient.find_job``), and ratios (the issue's target: at most 1.5 against ``ray job submit``). Each workload
is cancelled (its job stopped) before the next submission.

    python -m tests.bench.bench_submit [--rounds N]

The cluster runs under a temporary HOME (its token, journal and credentials), stopped and removed at the end.
Timings are printed, not asserted (CONVENTIONS: benchmarks print figures and ratios against a baseline of the same
run).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = "examples/specs/pretrain-team-a.yaml"
BIN = Path(sys.executable).parent


def _run(cmd, env, timeout=300.0) -> str:
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out.stdout


def _to_queue(ctl, job_id: str, t0: float, timeout: float = 180.0) -> tuple:
    """(seconds from ``t0`` until the job's workload is queued, its id)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rec = ctl.find_job(job_id)
        if rec is not None:
            return time.perf_counter() - t0, rec["id"]
        time.sleep(0.1)
    raise RuntimeError(f"job {job_id} queued no workload in {timeout:g}s")


def _plain(env, ctl, i: int, dashboard: str) -> tuple:
    t0 = time.perf_counter()
    token = _run([BIN / "raylane", "token", "for-job"], env).strip()
    job_id = f"bench-plain-{os.getpid()}-{i}"
    t1 = time.perf_counter()
    _run([BIN / "ray", "job", "submit", "--no-wait", "--address", dashboard, "--submission-id", job_id,
          "--working-dir", ".", "--runtime-env-json", f'{{"py_modules": ["{token}"]}}', "--",
          "python", "-m", "raylane.run", SPEC], env)
    command, bare = time.perf_counter() - t0, time.perf_counter() - t1
    queued, wid = _to_queue(ctl, job_id, t0)
    return command, queued, wid, bare


def _raylane(env, ctl) -> tuple:
    t0 = time.perf_counter()
    out = _run([BIN / "raylane", "submit", SPEC], env)
    command = time.perf_counter() - t0
    job_id = next(line.split()[2] for line in out.splitlines() if line.startswith("ray job "))
    queued, wid = _to_queue(ctl, job_id, t0)
    return command, queued, wid


def _measure(rounds: int) -> None:
    """The rounds, in a process started with the cluster's HOME (Raylane and Ray read it at import)."""
    from raylane import localcluster
    from raylane.control.client import ControlClient

    env = {**os.environ, **localcluster.client_env()}
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAYLANE_CODECHECK_SERVER", None)
    cold_env = {**env, "RAYLANE_CODECHECK_SERVER": "0"}
    localcluster.connect_driver()
    ctl = ControlClient.connect()
    rows = []
    for i in range(rounds):
        p = _plain(env, ctl, i, localcluster.dashboard())
        ctl.cancel(p[2])
        r = _raylane(env, ctl)
        ctl.cancel(r[2])
        c = _raylane(cold_env, ctl)
        ctl.cancel(c[2])
        rows.append((p, r, c))
        print(f"round {i}: plain command {p[0]:.2f} s (its `ray job submit` alone {p[3]:.2f} s), to the queue "
              f"{p[1]:.2f} s | raylane submit (warm checker) {r[0]:.2f} s, to the queue {r[1]:.2f} s | raylane "
              f"submit (cold check) {c[0]:.2f} s | raylane / `ray job submit`: warm {r[0] / p[3]:.2f}, "
              f"cold {c[0] / p[3]:.2f}", flush=True)

    def med(k: int, j: int) -> float:
        return statistics.median(x[k][j] for x in rows)

    bare = med(0, 3)
    print(f"median of {rounds}: `ray job submit` alone {bare:.2f} s; the README's plain line {med(0, 0):.2f} s, "
          f"to the queue {med(0, 1):.2f} s; raylane submit with the warm checker {med(1, 0):.2f} s, to the queue "
          f"{med(1, 1):.2f} s; with a cold check (RAYLANE_CODECHECK_SERVER=0) {med(2, 0):.2f} s. "
          f"raylane submit / `ray job submit`: warm {med(1, 0) / bare:.2f}, cold {med(2, 0) / bare:.2f} "
          f"(target: at most 1.5); / the plain line: warm {med(1, 0) / med(0, 0):.2f}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--in-home", action="store_true", help=argparse.SUPPRESS)  # the measuring child
    args = ap.parse_args(argv)
    if args.in_home:
        _measure(args.rounds)
        return
    home = tempfile.mkdtemp(prefix="raylane-bench-submit-")
    env = {k: v for k, v in os.environ.items() if k not in ("RAYLANE_TOKEN", "RAYLANE_CREDENTIALS", "RAY_AUTH_TOKEN")}
    env.update(HOME=home, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        t0 = time.perf_counter()
        _run([BIN / "raylane", "up"], env, timeout=600)
        print(f"raylane up: {time.perf_counter() - t0:.1f} s", flush=True)
        subprocess.run([sys.executable, "-m", "tests.bench.bench_submit", "--in-home", "--rounds", str(args.rounds)],
                       cwd=REPO, env=env, check=True, timeout=1800)
    finally:
        subprocess.run([BIN / "raylane", "down"], cwd=REPO, env=env, capture_output=True, timeout=300)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
