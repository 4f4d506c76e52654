"""``python -m raylane.console``: the same as ``raylane console`` (how ``raylane up`` starts it in the background)."""
from raylane.cli_console import main

main()
