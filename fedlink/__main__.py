"""``python -m fedlink``: the same as the ``fedlink`` command."""

import sys

from fedlink.cli import main

if __name__ == "__main__":  # not when a spawned worker process re-imports the main module
    sys.exit(main())
