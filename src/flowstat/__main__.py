"""``python -m flowstat``: the flowstat command."""

import sys

from .cli import main

sys.exit(main())
