"""What one script-mode driver knows about itself (``python -m raylane.run --team T --class C SCRIPT``): the team and
class every intercepted ``fit()`` is queued under, the control client, the job, where checkpoints and MLflow go,
and the names already given to this script's workloads.

Words
- *script mode*: the user's own script runs as the job's driver, unchanged; Raylane's hooks turn each trainer or
  tuner ``fit()`` it calls into a workload of its own.
- *base name*: ``--name``, else the trainer's ``RunConfig.name``, else the script's stem; ``next_name`` makes it
  unique among this script's workloads.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["ScriptContext"]


@dataclass
class ScriptContext:
    """The script driver's settings, shared by the trainer hook (``raylane.script.trainer``) and the tuner hook
    (``raylane.script.tuner``). ``ctl``: the control client (``raylane.launchers.driver.connect_driver``)."""

    team: str
    class_name: str
    name: Optional[str]
    script: str
    argv: List[str]
    ctl: Any
    job_id: Optional[str] = None
    storage_path: Optional[str] = None
    tracking_uri: Optional[str] = None
    poll_s: float = 2.0
    owner: Optional[str] = None  # the caller the control plane authenticated (MLflow's owner), when auth is on
    _used: Dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def next_name(self, base: str) -> str:
        """A workload name unique within this script: ``base`` the first time, then ``base-2``, ``base-3``..."""
        with self._lock:
            n = self._used.get(base, 0) + 1
            self._used[base] = n
        return base if n == 1 else f"{base}-{n}"
