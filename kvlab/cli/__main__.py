"""``python -m kvlab.cli``: same as the ``kvlab`` command."""

import sys

from kvlab.cli import main

sys.exit(main())
