"""``python -m training.prepare INPUT ... --output FOLDER``: text or conversations -> token files (``corpus.main``)."""

import sys

from training.prepare.corpus import main

sys.exit(main())
