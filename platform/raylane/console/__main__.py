"""``python -m raylane.console``: the same as ``raylane console`` (how ``raylane up`` starts it in the background)."""
import sys

from raylane.console.server import main

sys.exit(main())
