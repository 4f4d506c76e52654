"""What the command line and the web console both show a user, built from the control plane's replies: one way to
present a thing, whichever front end shows it. Pure: no Ray, no output of its own.

- ``journal_lines``: a workload's journal as ``raylane explain`` and the console's workload page show it.
- ``visible``, ``markup_safe``, ``cell``: any string a user sent (a workload id, a driver's detail, a journal note,
  an audit target), made safe to show to another user. Every text table and line the command line prints passes its
  values through one of them; the web console's ``shown`` (``console/static/app.js``) applies the same rule.

Words: *hidden character* is one that a terminal or a browser does not show as itself: C0 and C1 control characters
(ESC, which starts CSI and OSC sequences such as OSC 8 links; BEL; DEL; newline, which would forge a row), Unicode
format characters (bidi overrides and isolates, zero-width ones), line and paragraph separators, spaces other than
the plain one, and unassigned or private code points. ``str.isprintable`` is false for exactly these.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from raylane.control.journal import Kind

__all__ = ["journal_lines", "visible", "markup_safe", "cell"]


def visible(value: Any, *, newlines: bool = False) -> str:
    """``str(value)`` with each hidden character shown as its Python escape (``\\x1b``, ``\\u202e``): nothing in it
    can move the cursor, change colours, open a link, retitle the window or reorder the text around it.
    ``newlines``: keep line breaks (a multi-line error message), still escaping every other hidden character."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (newlines and c == "\n") else repr(c)[1:-1] for c in text)


def markup_safe(value: Any, *, newlines: bool = False) -> str:
    """``visible(value)`` with rich markup escaped, for a value put into a line that rich prints with markup on
    (``f"[red]error:[/red] {markup_safe(exc)}"``): ``[/x]`` or ``[link=...]`` in it is shown, never interpreted."""
    from rich.markup import escape

    return escape(visible(value, newlines=newlines))


def cell(value: Any):
    """``value`` as a rich ``Text`` (a table cell, a printed line): shown as ``visible`` makes it, never parsed for
    markup or emoji codes. None is an empty cell."""
    from rich.text import Text

    return Text("" if value is None else visible(value))


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
