"""``python -m training.measure.gpu_report``: :func:`training.measure.gpu_report.cli.main`."""

import sys

from training.measure.gpu_report.cli import main

if __name__ == "__main__":
    sys.exit(main())
