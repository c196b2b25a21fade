#!/usr/bin/env python3
"""The thesis's tables beside flowstat's campaigns (docs/thesis-comparison-tables.md and its plots):
`make generate` writes them; this is kept for `make bench`, which runs it after the campaigns.

Usage: benchmarks/thesis_comparison.py
"""

import sys
from pathlib import Path

from flowstat.generate import write

if __name__ == "__main__":
    sys.exit(write(Path(__file__).resolve().parents[1], only="thesis comparison"))
