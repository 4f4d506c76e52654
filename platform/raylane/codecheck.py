"""Checking a spec's user code in a child process, beside the caller's own start-up.

``raylane submit`` runs every check ``raylane spec check`` runs before it submits, the user's code included: the
entrypoint is imported from the working directory and the config checked against its declared schema. Importing a
training project means importing torch and Ray Train (4-7 s of CPU on a small machine), and the command then connects
to the cluster (2-3 s). ``CodeCheck`` imports the code in a child process while the parent connects, so the two
overlap; the parent submits nothing until the child has answered, and reports the code's errors first when both
failed.

Glossary
- *child*: ``python -m raylane.codecheck``; reads one line (a base64 pickle of the spec, its source name, the working
  directory and the reader's extra errors), runs ``load_spec_from_dict(..., code=True, load_code=True)`` and writes
  one line marked ``raylane-codecheck:``: ``{"ok": true}`` or ``{"error": base64 pickle of the FatalError}``. What the
  user's code prints on import goes to the child's stdout before it, and is dropped.

This module imports neither the user's code nor Ray in the parent.
"""
from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
from typing import Any, Mapping, Optional, Sequence

from raylane.errors import FatalError

__all__ = ["CodeCheck"]

_MARK = "raylane-codecheck:"
_TIMEOUT_S = 300.0  # a user module that hangs on import


class CodeCheck:
    """The code checks of ``data`` running in a child process; ``result()`` raises what they found."""

    def __init__(self, data: Mapping[str, Any], source: str, *, working_dir: str = ".",
                 extra: Optional[Sequence[Any]] = None):
        payload = base64.b64encode(pickle.dumps((dict(data), source, working_dir, list(extra or [])))).decode()
        self._proc = subprocess.Popen([sys.executable, "-m", "raylane.codecheck"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._payload = payload + "\n"

    def result(self, timeout: float = _TIMEOUT_S) -> None:
        """Wait for the child; raise the ``FatalError`` its checks raised (a ``ValidationError`` naming each field),
        or a ``FatalError`` saying why it could not check."""
        try:
            out, errtext = self._proc.communicate(self._payload, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            raise FatalError(f"checking the spec's code took over {timeout:g}s (does importing it hang?)")
        answer = next((json.loads(line[len(_MARK):]) for line in reversed(out.splitlines())
                       if line.startswith(_MARK)), None)
        if answer is None:
            raise FatalError(f"checking the spec's code failed (exit {self._proc.returncode}):\n{errtext[-3000:]}")
        if "error" in answer:
            raise pickle.loads(base64.b64decode(answer["error"]))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.communicate()


def _main() -> int:
    data, source, working_dir, extra = pickle.loads(base64.b64decode(sys.stdin.readline()))
    from raylane.config.loader import load_spec_from_dict

    try:
        load_spec_from_dict(data, source, code=True, working_dir=working_dir, load_code=True, _extra=extra)
        answer: dict = {"ok": True}
    except FatalError as exc:
        answer = {"error": base64.b64encode(pickle.dumps(exc)).decode()}
    sys.stdout.write("\n" + _MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
