#!/usr/bin/env python3
"""specab driver: `python driver.py --matrix steps=1,2,3` runs the full experiment.

Thin entry point; the logic lives in specab/ (see `python driver.py --help`).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from specab.driver.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
