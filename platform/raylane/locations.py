"""Where a driver's things are, found without importing MLflow or Ray (each costs a second or more of CPU on a small
machine, and a training driver calls these on the way to its gang's start): its working directory, kept usable
(``ensure_cwd``), and its MLflow store (``tracking_uri``). ``raylane.tracking`` re-exports both."""
from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

from raylane.errors import ValidationError

logger = logging.getLogger("raylane.tracking")

__all__ = ["DEFAULT_TRACKING_URI", "ensure_cwd", "tracking_uri"]

_ENV_URIS = ("RAYLANE_MLFLOW_URI", "MLFLOW_TRACKING_URI")  # the first one set wins
_HOME_DB = Path("~/.raylane/mlflow.db")
_SQLITE_PREFIX = "sqlite:///"

# ---------------------------------------------------------------------------------------------------------------
# Where the store is.


def _default_uri() -> str:
    return f"{_SQLITE_PREFIX}{_HOME_DB.expanduser().resolve()}"


def _env_uri() -> Optional[str]:
    return next((os.environ[name] for name in _ENV_URIS if os.environ.get(name)), None)


DEFAULT_TRACKING_URI: str = _env_uri() or _default_uri()
"""The store used when none is given: ``$RAYLANE_MLFLOW_URI``, else ``$MLFLOW_TRACKING_URI``, else the sqlite
database ``~/.raylane/mlflow.db``; read at import. ``tracking_uri()`` reads the environment again at each call."""


def tracking_uri(uri: Optional[str] = None) -> str:
    """The store to use: ``uri`` if given, else the environment (see ``DEFAULT_TRACKING_URI``), else the sqlite
    default. A bare path ending in ``.db`` becomes a sqlite URI. For sqlite the database's directory is created.

    Raises ``ValidationError`` for a ``file:`` store or a bare path that is not a database: MLflow 3 refuses both.
    """
    chosen = uri or _env_uri() or _default_uri()
    resolved = _normalise(chosen)
    db = _sqlite_path(resolved)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return resolved


def _normalise(uri: str) -> str:
    if uri.startswith("file:"):
        raise ValidationError("tracking uri", [("tracking_uri", uri, f"{_URI_ALLOWED}; MLflow 3 refuses file stores")])
    if "://" in uri or uri.startswith("databricks"):
        return uri
    path = Path(uri).expanduser()
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"{_SQLITE_PREFIX}{path.resolve()}"
    raise ValidationError("tracking uri", [("tracking_uri", uri, _URI_ALLOWED)])


_URI_ALLOWED = "a sqlite:/// URI, a path ending in .db, or an MLflow server URI such as http://host:5000"


def _sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI (``sqlite:////abs/x.db`` or ``sqlite:///relative.db``)."""
    if not uri.startswith(_SQLITE_PREFIX):
        return None
    rest = uri[len(_SQLITE_PREFIX):].split("?", 1)[0]
    if rest in ("", ":memory:"):
        return None
    return Path(rest).expanduser().resolve()


def ensure_cwd(wait_s: float = 30.0) -> str:
    """The current directory, made usable again if it was deleted under this process.

    Measured with Ray 2.60: on a cluster of several nodes on one machine (``ray.cluster_utils`` in tests, ``raylane up``
    here), all nodes share one session directory, and each node's runtime-env agent unpacks a job's ``--working-dir``
    package with ``overwrite=True`` into the same path, deleting the copy that processes already run in; a new copy
    appears there moments later. MLflow's sqlite store resolves its artifact root against the current directory, so
    the driver and rank 0 move into the new copy (or, if none appears within ``wait_s``, into the temp directory)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        pass
    path = os.environ.get("PWD") or ""
    deadline = time.monotonic() + wait_s
    while path and not os.path.isdir(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    target = path if path and os.path.isdir(path) else tempfile.gettempdir()
    logger.warning("the current directory was removed under this process; moving to %s", target)
    os.chdir(target)
    return target
