"""What the ``raylane`` commands share: their consoles, how an error reaches the user, the control plane's client.

This module owns how a command fails: ``exit_on_error`` turns what the control plane raised into a red line on
stderr and an exit status (1: the input was wrong or refused; 2: the control plane could not be reached), and
``print_error`` / ``exit_with_error`` show a ``ValidationError`` as one line per problem, ``path: got VALUE;
ALLOWED``, for the commands that read files (``raylane spec check``, ``raylane sim``). Every command module imports
this one and none imports another's command; it imports nothing heavy (``raylane --help`` and ``raylane queue``
load it), and the client only when ``connect`` is called.

Words
- *console* / *err*: stdout and stderr, each a rich ``Console`` with emoji off (a value's ``:name:`` stays text;
  values are escaped with ``raylane.render``'s ``cell`` or ``markup_safe``, these consoles' own lines use markup).
- *a flag's duration*: a positive duration (``90s``, ``1h30m``, ``2w``) in ``raylane.config.fields``' grammar.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Optional

import typer
from rich.console import Console

from raylane.errors import FatalError, RetryableError, ValidationError
from raylane.render import markup_safe, visible

__all__ = ["console", "err", "exit_on_error", "connect", "print_error", "exit_with_error", "parse_duration",
           "DURATION_FLAG_ALLOWED"]

# Resolved at print time (neither is given a file), so tests that swap sys.stdout/sys.stderr see the output.
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)
err = Console(stderr=True, emoji=False)

DURATION_FLAG_ALLOWED = "a positive duration such as 90s, 30m, 12h, 30d, 2w or 1h30m"


@contextlib.contextmanager
def exit_on_error():
    """Around a command's calls: a ``FatalError`` ends it with exit status 1, a ``RetryableError`` or a refused
    connection with 2, each as one ``error:`` line on stderr (its own line breaks kept, markup escaped)."""
    try:
        yield
    except FatalError as exc:
        err.print(f"[red]error:[/red] {markup_safe(exc, newlines=True)}", highlight=False)
        raise typer.Exit(1)
    except (RetryableError, ConnectionError) as exc:
        err.print(f"[red]error:[/red] {markup_safe(exc, newlines=True)}", highlight=False)
        raise typer.Exit(2)


def connect():
    """Connect this process to the cluster's Ray (quietly) and return the control plane's client, holding the
    caller's credential (``RAYLANE_TOKEN`` or ``~/.raylane/credentials``)."""
    from raylane import localcluster
    from raylane.control.client import ControlClient

    localcluster.connect_driver()
    return ControlClient.connect()


def print_error(exc: FatalError) -> None:
    """Show a ``ValidationError`` as one line per problem, anything else as its message; both on stderr. Values
    are shortened and control characters escaped, so a broken file cannot flood or drive the terminal."""
    plain = dict(markup=False, highlight=False, soft_wrap=True)
    if isinstance(exc, ValidationError):
        err.print(f"{_plain(exc.source)}: {len(exc.errors)} error(s)", style="bold red", **plain)
        for path, value, allowed in exc.errors:
            err.print(f"  {_plain(path)}: got {_short(visible(repr(value)))}; {_plain(allowed)}", **plain)
    else:
        err.print(_plain(str(exc), limit=4000), style="bold red", **plain)


def exit_with_error(exc: Exception) -> None:
    """``print_error(exc)``, then exit with status 1."""
    print_error(exc)
    raise typer.Exit(1)


def _plain(text: object, limit: int = 300) -> str:
    """``text`` on one line of printable characters (``raylane.render.visible``), at most ``limit`` of them."""
    return _short(visible(str(text)[:limit + 1]), limit)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text):,} characters)"


def parse_duration(text: Optional[str], field: str) -> Optional[float]:
    """A flag's duration: '90s', '30m', '12h', '30d', '2w', '1h30m' -> seconds (the grammar of
    ``raylane.config.fields``, that of specs and policies); None stays None. Anything else, or zero, ends the
    command with exit status 1 and an error naming the flag, the value and what is allowed."""
    # Imported here: ``raylane token`` and ``raylane audit`` load the config package only when a flag needs it.
    from raylane.config.fields import parse_duration as seconds_of

    if text is None:
        return None
    try:
        value = seconds_of(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        err.print(f"[red]error:[/red] {field}: got {markup_safe(repr(text))}; {DURATION_FLAG_ALLOWED}",
                  highlight=False)
        raise typer.Exit(1)
    return value
