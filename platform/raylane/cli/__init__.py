"""The ``raylane`` command line: one typer ``app`` whose commands are loaded when they run.

This module owns only the top-level app, ``main`` (the console script) and ``COMMANDS``, which names the module
behind each command. Each group of commands lives in its own module of this package (``raylane.cli.cluster``,
``raylane.cli.sim``, ...) with a ``register(app)`` function that adds its commands to a typer app; add yours the
same way, with one line per command in ``COMMANDS``, rather than editing another group's module. What the command
modules share (their consoles, how an error is shown, the control plane's client) is ``raylane.cli.common``; no
command module imports another's commands. Errors for users go to stderr; exit status 1 means "your input is
wrong".

A command's module is imported only when that command runs (or ``raylane --help`` lists it): ``raylane queue``
loads the cluster commands, not the simulator, the planner or the policy's models, which took a third of its time.
"""
from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Dict, Iterator, List, Mapping

import typer
from typer.core import TyperGroup

# Each command (or command group) of `raylane`, in the order `raylane --help` lists them, and the module whose
# ``register(app)`` adds it.
COMMANDS: Dict[str, str] = {
    **dict.fromkeys(("up", "down", "submit", "queue", "explain", "cancel"), "raylane.cli.cluster"),
    **dict.fromkeys(("whoami", "audit"), "raylane.cli.auth"),
    "sim": "raylane.cli.sim",
    "sim-autoscale": "raylane.cli.sim_autoscale",
    "console": "raylane.cli.console",
    "cost": "raylane.cli.cost",
    "policy": "raylane.cli.policy",
    "spec": "raylane.cli.spec",
    "token": "raylane.cli.auth",
    "node": "raylane.cli.nodes",
    "plan": "raylane.cli.plan",
}

# module -> its commands as click commands, once per process: a module registers its commands once, however many
# times the app is built (each ``CliRunner.invoke`` builds it anew).
_LOADED: Dict[str, Dict[str, object]] = {}


def _commands_of(module: str) -> Dict[str, object]:
    if module not in _LOADED:
        sub = typer.Typer()
        importlib.import_module(module).register(sub)
        commands = dict(typer.main.get_group(sub).commands)
        named = {n for n, m in COMMANDS.items() if m == module}
        if named != set(commands):  # a command left out of COMMANDS would be unreachable
            raise RuntimeError(f"raylane.cli.COMMANDS names {sorted(named)} in {module}, whose register() adds "
                               f"{sorted(commands)}")
        _LOADED[module] = commands
    return _LOADED[module]


class _Commands(Mapping):
    """``COMMANDS`` as click's group sees its commands: a command's module is imported on first access."""

    def __getitem__(self, name: str):
        return _commands_of(COMMANDS[name])[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class _LazyGroup(TyperGroup):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = _Commands()

    def list_commands(self, ctx) -> List[str]:
        return list(COMMANDS)


app = typer.Typer(
    name="raylane",
    cls=_LazyGroup,
    help="Raylane: queues, team quotas, gang admission and preemption inside one Ray cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _top() -> None:
    pass


def main() -> None:
    """The ``raylane`` console script: ``app``, and then, where the command joined a Ray cluster as a driver, an
    exit without Ray's driver teardown. Ray's exit handler sleeps 0.5 s (for log lines a CLI does not forward) and
    then disconnects the driver (0.3 to 0.4 s here), and unloading the interpreter after it took 0.2 to 0.3 s more:
    together more than most commands' own work. The raylet sees the process end either way and marks its job
    finished, and a CLI command leaves nothing of its own in the cluster (the control actor is detached; its calls'
    replies are fetched). Every other exit handler still runs (``raylane submit`` removes the folder that carried
    its credential to the job that way), and the output is flushed."""
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        sys.exit(code)
    if not isinstance(code, int):  # sys.exit's rules: None is 0; anything else is printed, and is 1
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    atexit.unregister(ray.shutdown)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`raylane queue | head`): nothing more to say there
            pass
    os._exit(code)
