"""``python -m training.evaluate``: the evaluation job (see ``training.evaluate.run``)."""

import sys

from training.evaluate.run import main

if __name__ == "__main__":
    sys.exit(main())
