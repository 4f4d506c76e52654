#!/usr/bin/env python
"""Start Raylane's control actor on a running Ray cluster: the one step every deployment runs after Ray is up.

The cluster launcher's head commands, the KubeRay head's postStart hook and `raylane up` all come down to this:
connect to Ray, then ``raylane.control.client.start_control(policy, journal)``. The script checks the policy file
first (every error at once, before touching the cluster), waits for Ray to accept a connection (so it may run right
after ``ray start --head``, while the head is still coming up), and is idempotent: when a control actor is already
running it is left as it is (with its own policy and journal) and the script says so.

The journal is a sqlite file that the control actor opens on the node it runs on. Put it on a disk that outlives
the actor's process (the head node's disk, a persistent volume): the actor replays it after every restart.
``start_control`` pins the actor to the head node; the script reports the node the actor runs on and warns when it
is not this one, whose disk the journal path was meant for (docs/deploy.md, "Known limitations").

Authentication is on unless --no-auth is given (docs/security.md). When this script creates the control actor, the
actor registers a fresh operator token (only its salted digest reaches the actor and its journal) and the script
writes the token, and nothing else, to --credentials (mode 0600; by default ``operator-credentials`` beside the
journal): the operator runs commands with ``RAYLANE_CREDENTIALS`` naming that file (or copies the token out once
and passes it to ``raylane token use``), then creates the users' tokens with ``raylane token create``. The token is
never printed. When the actor was already running, it keeps the operator token it was started with and nothing is
written.

Exit status: 0 the control actor runs; 1 the policy file is invalid or missing; 2 Ray or the actor could not be
reached before --timeout.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="start_control.py",
        description="Start (or find) Raylane's control actor on a running Ray cluster.",
        epilog="Example: python deploy/start_control.py --policy policies/default.yaml "
               "--journal /raylane-state/journal.db --address auto",
    )
    p.add_argument("--policy", default=None,
                   help="policy file (default: policies/default.yaml of this checkout, else the packaged copy)")
    p.add_argument("--journal", default=None,
                   help="sqlite journal path on the node the actor runs on (default: $RAYLANE_JOURNAL, "
                        "else ~/.raylane/journal.db)")
    p.add_argument("--address", default=None,
                   help="Ray address: 'auto' (the cluster of this node), host:port, or ray://host:10001 "
                        "(default: $RAY_ADDRESS, else 'auto')")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to keep trying to reach Ray and the actor (default: 120)")
    p.add_argument("--credentials", default=None,
                   help="where the operator token is written (mode 0600) when this script creates the control actor "
                        "(default: operator-credentials beside the journal)")
    p.add_argument("--operator", default="operator",
                   help="user name of that operator token (default: operator)")
    p.add_argument("--cluster", default=None,
                   help="cluster file whose growable node groups (min/max, node_type) Ray's autoscaler may grow: "
                        "the control plane then asks it for nodes for gangs that wait for capacity and accepts "
                        "gangs only such nodes can hold (default: none; nothing is asked, a gang no node of the "
                        "cluster can hold is refused)")
    p.add_argument("--no-auth", action="store_true",
                   help="run the control plane without authentication: every caller acts as an operator (a "
                        "single-user test cluster only)")
    return p


def _say(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} start_control: {msg}", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    # Imported after argument parsing so that --help answers without loading Ray.
    from raylane.config.loader import default_policy_path, load_policy
    from raylane.errors import FatalError

    policy = args.policy or str(default_policy_path())
    try:
        pol = load_policy(policy)
        if args.cluster:
            from raylane.config.cluster import load_cluster

            load_cluster(args.cluster)  # refuse a bad cluster file before starting anything
    except FatalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    deadline = time.monotonic() + args.timeout
    try:
        _connect(address, deadline)
        return _start(policy, args.journal, pol, deadline, auth_enabled=not args.no_auth, operator=args.operator,
                      credentials_path=args.credentials, cluster=args.cluster)
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _connect(address: str, deadline: float) -> None:
    import ray

    attempt, last = 0, None
    while True:
        attempt += 1
        try:
            ray.init(address=address, namespace="raylane", logging_level="ERROR", log_to_driver=False)
            _say(f"connected to Ray at {address}")
            return
        except (ConnectionError, RuntimeError) as exc:  # no cluster yet, or its GCS is still starting
            last = exc
            ray.shutdown()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no Ray cluster at {address!r} after {attempt} attempts: {last}")
        time.sleep(min(5.0, 0.5 * attempt))


def _start(policy: str, journal: Optional[str], pol, deadline: float, *, auth_enabled: bool, operator: str,
           credentials_path: Optional[str], cluster: Optional[str] = None) -> int:
    import ray

    from raylane.control.actor import CONTROL_NAME, NAMESPACE
    from raylane.control.client import journal_path, start_control
    from raylane.errors import RetryableError

    try:
        ray.get_actor(CONTROL_NAME, namespace=NAMESPACE)
        running = True
    except ValueError:
        running = False
    jpath = journal_path(journal)
    while True:
        try:
            client = start_control(policy, jpath, auth_enabled=auth_enabled, operator=operator, cluster=cluster)
            break
        except (RetryableError, ray.exceptions.RayError) as exc:  # the actor is (re)starting; it replays its journal
            if time.monotonic() >= deadline:
                raise TimeoutError(f"control actor {CONTROL_NAME!r} did not answer: {exc}") from exc
            time.sleep(2.0)
    if running:
        _say(f"control actor {CONTROL_NAME!r} (namespace {NAMESPACE!r}) was already running; "
             f"it keeps its own policy, journal and operator token")
    else:
        _say(f"control actor {CONTROL_NAME!r} (namespace {NAMESPACE!r}) started: policy {policy} "
             f"({len(pol.teams)} teams, {len(pol.classes)} classes), journal {jpath}")
        _write_operator_token(client, credentials_path or os.path.join(os.path.dirname(jpath),
                                                                       "operator-credentials"))
    _report_node(CONTROL_NAME, NAMESPACE, jpath)
    return 0


def _write_operator_token(client, path: str) -> None:
    """Write the operator token of a control plane this script started to ``path`` (0600), once the control plane
    has accepted it; say where, never what."""
    from raylane import credentials
    from raylane.errors import AuthenticationError

    try:
        who = client.whoami()
    except AuthenticationError as exc:
        print(f"warning: the control plane refused its own operator token ({exc}); none written", file=sys.stderr,
              flush=True)
        return
    if not who.get("auth"):
        _say("authentication is off (--no-auth): every caller acts as an operator")
        return
    written = credentials.save(client.credential.token, Path(path))
    _say(f"operator token {who['token_id']} of {who['user']} written to {written} (mode 0600): run operator "
         f"commands with RAYLANE_CREDENTIALS={written}, or copy it out once and `raylane token use` it")


def _report_node(name: str, namespace: str, jpath: str) -> None:
    """Say which node the actor runs on; warn when it is not this one, whose disk the journal path was meant for."""
    import ray

    try:
        from ray.util.state import list_actors

        alive = [a for a in list_actors(address=ray.get_runtime_context().gcs_address,
                                        filters=[("name", "=", name), ("state", "=", "ALIVE")], detail=True,
                                        timeout=10)
                 if getattr(a, "ray_namespace", namespace) == namespace]
    except Exception as exc:  # noqa: BLE001 - the state API needs the dashboard; the actor runs without it
        _say(f"could not tell which node the control actor runs on ({type(exc).__name__}: {exc})")
        return
    if not alive:
        return
    here = ray.get_runtime_context().get_node_id()
    node = alive[0].node_id
    if node == here:
        _say(f"control actor runs on this node ({here[:12]}); journal {jpath} is on its disk")
    else:
        print(f"warning: the control actor runs on node {node}, not on this node ({here}): its journal {jpath} "
              f"is on that node's disk, which may not outlive it", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
