"""``python -m fedlink``: the same as the ``fedlink`` command."""

import sys

from fedlink.cli import main

sys.exit(main())
