"""``python -m training.plan RUN.json [--json]``: the plan of one execution input (``report.main``)."""

import sys

from training.plan.report import main

sys.exit(main())
