"""``python -m raylane.cli ARGS``: the ``raylane`` console script, where it is not installed (``python -m
raylane.cli sim TRACE ...``)."""
from raylane.cli import main

main()
