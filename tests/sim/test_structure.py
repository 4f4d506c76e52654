"""The simulator is a second driver of the one scheduling core: it calls the core's ``cycle`` and keeps no copy of
its logic, and the core knows nothing of simulation."""
from __future__ import annotations

import ast
from pathlib import Path

import raylane.scheduling as core
import raylane.sim.engine as engine

CORE_DIR = Path(core.__file__).parent
SIM_DIR = Path(engine.__file__).parent


def test_the_engine_calls_the_cores_cycle_and_state():
    from raylane.scheduling.cycle import cycle
    from raylane.scheduling.state import ClusterState

    assert engine.cycle is cycle and engine.ClusterState is ClusterState


def test_the_core_has_no_simulation_branches():
    for path in CORE_DIR.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                assert not (mod or "").startswith("raylane.sim"), f"{path} imports {mod}"
            if isinstance(node, ast.Name) or isinstance(node, ast.Attribute) or isinstance(node, ast.arg):
                name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "arg", None)
                assert "simul" not in name.lower(), f"{path}:{node.lineno} names {name}"


def test_the_simulator_defines_no_scheduling_policy():
    """No class or function of the simulator implements an axis of the core (queue_key, place, candidates...)."""
    axis_methods = {"queue_key", "head_key", "rank", "place", "check", "reserve", "allows", "candidates"}
    for path in SIM_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                assert node.name not in axis_methods, f"{path}: defines {node.name}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register":
                raise AssertionError(f"{path}:{node.lineno} registers a policy; policies belong to the core")
