"""What the command line and the web console both show a user, built from the control plane's replies: one way to
present a thing, whichever front end shows it. Pure: no Ray, no output of its own.

- ``journal_lines``: a workload's journal as ``raylane explain`` and the console's workload page show it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from raylane.control.journal import Kind

__all__ = ["journal_lines"]


def journal_lines(journal: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The journal as ``explain`` shows it: driver progress updates (shown as "now") left out, and each run of
    checkpoints folded into one line."""
    out = []
    for e in journal:
        if e["kind"] == Kind.EVENT and not e.get("note"):
            continue
        if e["kind"] == Kind.CHECKPOINTED:
            if out and out[-1]["kind"] == Kind.CHECKPOINTED:
                run = out[-1]
                run["steps"].append(e.get("step"))
            else:
                run = {**e, "steps": [e.get("step")]}
                out.append(run)
            steps = [s for s in run["steps"] if s is not None]
            span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}..{steps[-1]}" if steps else ""
            run["note"] = f"{len(run['steps'])} checkpoint(s), {span}".rstrip(", ")
            continue
        out.append(e)
    return out
