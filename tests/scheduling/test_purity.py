"""The pure cores import no Ray (nor torch; the planner no OR-Tools until CP-SAT runs), so the simulator, the
planners and their tests stay light."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package,banned", [
    ("raylane.scheduling", ("ray", "torch")),
    ("raylane.planning", ("ray", "torch", "ortools")),
])
def test_importing_a_pure_core_imports_none_of_the_heavy_packages(package, banned):
    code = (
        f"import sys, {package}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {banned!r})\n"
        "assert not bad, bad\n"
    )
    # A fresh interpreter: other test modules in this session may import Ray themselves.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
