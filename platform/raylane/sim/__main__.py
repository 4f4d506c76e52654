"""``python -m raylane.sim TRACE ...``: the ``raylane sim`` command without the rest of the CLI."""
from raylane.sim.cli import app

app(prog_name="raylane sim")
