"""The ``raylane`` command line loads a command's module only when that command runs (``raylane.cli.COMMANDS``), so
``raylane queue`` does not import the simulator, the planner, the policy's models or the state machine (issue 27,
item 6: `raylane queue` under 2 s). No Ray: ``main``'s exit after a Ray driver is tested in
tests/control/test_control.py."""
from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from raylane import cli


def test_help_lists_every_command_in_order_and_each_loads_from_its_module():
    got = CliRunner().invoke(cli.app, ["--help"])
    assert got.exit_code == 0, got.output
    # A row of the commands panel starts with its name; a description's next line starts with spaces.
    listed = [line.split()[1] for line in got.stdout.splitlines()
              if line.startswith("│ ") and line[2] != " " and line.split()[1] in cli.COMMANDS]
    assert listed == list(cli.COMMANDS)
    for name in cli.COMMANDS:
        out = CliRunner().invoke(cli.app, [name, "--help"])
        assert out.exit_code == 0, (name, out.output)
    policy = CliRunner().invoke(cli.app, ["policy", "--help"]).stdout
    assert "check" in policy and "reload" in policy


def test_an_unknown_command_is_refused_with_a_suggestion():
    got = CliRunner().invoke(cli.app, ["queu"])
    assert got.exit_code == 2
    assert "No such command 'queu'" in got.output and "Did you mean 'queue'?" in got.output


def test_the_queue_command_imports_neither_the_simulator_nor_the_policy_models_nor_the_state_machine():
    # What `raylane queue` imports before its first call: the app, its command (raylane.cli.cluster) and what the
    # commands share (raylane.cli.common), the client and the module that joins the cluster, and the actor's module
    # (Ray imports it to read the class behind the handle).
    code = ("import sys\n"
            "from typer.testing import CliRunner\n"
            "from raylane import cli\n"
            "assert CliRunner().invoke(cli.app, ['queue', '--help']).exit_code == 0\n"
            "import raylane.control.client, raylane.localcluster, raylane.control.actor\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('raylane'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert {"raylane.cli.cluster", "raylane.cli.common", "raylane.control.client"} <= loaded
    heavy = ("raylane.sim", "raylane.planning", "raylane.config.models", "raylane.control.state",
             "raylane.scheduling", "raylane.forecast", "raylane.cli.spec", "raylane.cli.policy", "raylane.cli.plan",
             "raylane.cli.sim", "raylane.cli.sim_runs", "raylane.cli.auth")
    assert not loaded & set(heavy), sorted(loaded & set(heavy))


def test_main_passes_the_exit_status_on_when_no_ray_driver_was_joined(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["raylane", "spec", "check", str(tmp_path / "missing.yaml")])
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 1
    assert "missing.yaml" in capsys.readouterr().err


def test_a_command_left_out_of_commands_or_named_in_the_wrong_module_is_an_error(monkeypatch):
    monkeypatch.setattr(cli, "_LOADED", {})
    monkeypatch.setitem(cli.COMMANDS, "quee", "raylane.cli.cluster")
    with pytest.raises(RuntimeError, match=r"raylane.cli.cluster, whose register\(\) adds"):
        cli._commands_of("raylane.cli.cluster")
    monkeypatch.delitem(cli.COMMANDS, "quee")
    monkeypatch.delitem(cli.COMMANDS, "cancel")
    with pytest.raises(RuntimeError, match="'cancel'"):
        cli._commands_of("raylane.cli.cluster")
