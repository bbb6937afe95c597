"""Run the CLI as `python -m xpu_series`."""

import sys

from xpu_series.cli import main

sys.exit(main())
