"""The scheduling core is pure: importing it pulls in no Ray (nor torch), so the simulator and these tests stay light."""
import subprocess
import sys


def test_import_raylane_scheduling_does_not_import_ray():
    code = (
        "import sys, raylane.scheduling\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch'))\n"
        "assert not bad, bad\n"
    )
    # A fresh interpreter: other test modules in this session may import Ray themselves.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
