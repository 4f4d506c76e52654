"""Where a caller's credential comes from, and how one reaches a job's driver. No Ray.

A CLI user keeps a token in ``~/.raylane/credentials`` (mode 0600; ``raylane token use TOKEN`` writes it; the path
can be moved with ``RAYLANE_CREDENTIALS``) or in ``RAYLANE_TOKEN``. A job's driver (``python -m raylane.run``,
started by ``raylane submit`` or by plain ``ray job submit``) finds its credential, in this order:

1. ``RAYLANE_TOKEN`` in its environment (handy on a laptop; on a shared cluster do not pass it through
   ``--runtime-env-json``: the job's runtime env is shown to everyone in the dashboard's job list);
2. a module ``raylane_job_credential`` on its Python path, the way ``raylane submit`` sends one: a folder holding
   the file ``token``, uploaded with the job as a ``py_modules`` entry (``job_credential_dir``), which the dashboard
   lists only as a package URI. For plain ``ray job submit``, ``raylane token for-job`` makes one (a job token) and
   prints its path for ``--runtime-env-json '{"py_modules": [PATH]}'``;
3. ``.raylane/credentials`` in the job's working directory (only if it is uploaded: Ray leaves out what the
   folder's ``.gitignore`` names).

Inside a Ray job the driver never reads ``~/.raylane/credentials``: that is the home of the cluster's OS user, and
its token (often an operator's) is not the submitter's.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Optional

ENV_TOKEN = "RAYLANE_TOKEN"
ENV_FILE = "RAYLANE_CREDENTIALS"
JOB_MODULE = "raylane_job_credential"
WORKDIR_FILE = os.path.join(".raylane", "credentials")


class Credential:
    """A token that never shows itself: its repr and str name only the token id."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token.strip()

    @property
    def token_id(self) -> str:
        parts = self.token.split("_")
        return parts[1] if len(parts) >= 3 else "malformed"

    def __repr__(self) -> str:
        return f"Credential(token {self.token_id})"

    __str__ = __repr__

    def __reduce__(self):
        return (Credential, (self.token,))


def default_file() -> Path:
    return Path(os.environ.get(ENV_FILE) or Path.home() / ".raylane" / "credentials").expanduser()


def in_ray_job() -> bool:
    """Inside the cluster: a job's driver, or any Ray worker process (actors, Train workers, tasks). There the
    home folder is the cluster's OS user's, whose credentials file is not the caller's."""
    if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        return True
    import sys

    worker = getattr(getattr(sys.modules.get("ray._private.worker"), "global_worker", None), "mode", None)
    return worker is not None and worker == getattr(sys.modules.get("ray"), "WORKER_MODE", object())


def _read(path: Path) -> Optional[str]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def find() -> Optional[Credential]:
    """The caller's credential, or None (see the module docstring for the order)."""
    tok = os.environ.get(ENV_TOKEN, "").strip()
    if tok:
        return Credential(tok)
    if in_ray_job():
        spec = importlib.util.find_spec(JOB_MODULE)
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                tok = _read(Path(loc) / "token")
                if tok:
                    return Credential(tok)
        tok = _read(Path.cwd() / WORKDIR_FILE)
        return Credential(tok) if tok else None
    tok = _read(default_file())
    return Credential(tok) if tok else None


def save(token: str, path: Optional[Path] = None) -> Path:
    """Write ``token`` to the credentials file, readable by its owner only."""
    path = Path(path) if path else default_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token.strip() + "\n")
    os.chmod(path, 0o600)
    return path


def job_spec() -> Optional[dict]:
    """The spec ``raylane submit`` sent in the job's package (``spec.json`` beside the token), or None."""
    import json

    spec = importlib.util.find_spec(JOB_MODULE)
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        text = _read(Path(loc) / "spec.json")
        if text:
            return json.loads(text)
    return None


def job_credential_dir(token: Optional[str], root: Optional[Path] = None, spec: Optional[dict] = None) -> str:
    """A folder ``ROOT/raylane_job_credential`` holding ``token`` (0600) and ``spec`` (``spec.json``, if given),
    for a job's ``py_modules``; ``root`` defaults to a new temp folder, which the caller removes once the job is
    submitted (Ray has uploaded it)."""
    root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="raylane-cred-"))
    root.mkdir(parents=True, mode=0o700, exist_ok=True)
    mod = root / JOB_MODULE
    mod.mkdir(mode=0o700)
    (mod / "__init__.py").write_text('"""A Raylane job credential (raylane.credentials); read by the driver."""\n')
    files = {"token": token} if token else {}
    if spec is not None:
        import json

        files["spec.json"] = json.dumps(spec)
    for name, text in files.items():
        fd = os.open(mod / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return str(mod)
